"""The step's ledger entry, assembled across DP ranks from 32-byte lane digests (never tokens): each rank
gives the digests and tokens of the lanes it owns, so every lane counts once for any layout."""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from zephon_titan.engine import batch_digest
from zephon_titan.engine.jsonl_log import read_entries
from zephon_titan.engine.ledger import LEDGER, LedgerEntry, LedgerWriter, step_entry
from zephon_titan.loader.rank_lanes import digest_table, lane_table
from zephon_titan.loader.rank_steps import RankSteps

logger = logging.getLogger()  # TorchTitan's logger is the root logger: the same lines under any adapter


def gather_ledger_entry(
    loader: RankSteps, step: int, group: dist.ProcessGroup | None, device: torch.device | str = "cpu"
) -> LedgerEntry | None:
    """Collective over the DP `group` (None: a single rank). Returns the entry on global rank 0, else None."""
    record = loader.last_step
    if record is None:
        raise RuntimeError("gather_ledger_entry() runs after a step, once its last microbatch was consumed")
    digests = lane_table(loader.lanes.owned, digest_table(record.lane_digests).to(device), loader.num_lanes, group)
    tokens = torch.tensor(record.tokens, dtype=torch.int64, device=device)
    if group is not None:
        dist.all_reduce(tokens, group=group)
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    lane_bytes = digests.cpu().numpy().tobytes()
    sha256 = batch_digest(lane_bytes[i : i + 32] for i in range(0, len(lane_bytes), 32))
    return step_entry(loader.spec, step, sha256, loader.global_batch_size, tokens.tolist())


def open_ledger(path: str, resume_step: int) -> LedgerWriter:
    """The run's ledger (rank 0). A run that resumes after step s keeps the file's steps up to s and writes
    the later ones again: if the file has later steps (the run went on past that checkpoint, or
    `--checkpoint.load_step` rolls back), one line says which steps are cut."""
    later: list[int] = []
    if resume_step > 0 and os.path.exists(path):
        entries, _ = read_entries(path, LEDGER, drop_torn_tail=True)  # a torn last line: LedgerWriter says it
        later = [e.step for e in entries if e.step > resume_step]
    writer = LedgerWriter(path, resume_step)
    if later:
        cut = f"step {later[0]}" if len(later) == 1 else f"steps {later[0]}-{later[-1]}"
        logger.info(
            f"zephon_titan: {path}: {cut} cut from the ledger (this run resumes after step {resume_step}); "
            "they are written again as this run makes them"
        )
    return writer
