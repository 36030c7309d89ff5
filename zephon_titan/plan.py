"""Predict a job's batch ledger offline: every lane simulated in one process, no GPU, no torchrun.

Reads the job TOML's `[training]` (seq_len, global_batch_size), `hf_assets_path`
(the trainer's tokenizer, unless `[dataloader] tokenizer_path` is set) and
`[dataloader]`. Lane streams do not depend on the number of ranks, so one
process computes exactly what a run on any number of GPUs will log.
"""

from __future__ import annotations

from collections.abc import Iterator

from zephon_titan.config import config_from_dict, load_toml
from zephon_titan.engine import LaneGroup, batch_digest, build_engine, lane_digest, load_tokenizer, rows_per_lane
from zephon_titan.engine.ledger import LedgerEntry
from zephon_titan.errors import ConfigError


def plan_ledger(job_path: str, steps: int) -> Iterator[LedgerEntry]:
    job = load_toml(job_path)
    training = job.get("training", {})
    for key in ("seq_len", "global_batch_size"):
        if key not in training:
            raise ConfigError(f"{job_path}: [training] {key} is needed to plan the ledger")
    config = config_from_dict(job.get("dataloader", {}))
    tokenizer_path = config.tokenizer_path or job.get("hf_assets_path")
    if not tokenizer_path:
        raise ConfigError(f"{job_path}: set hf_assets_path or [dataloader] tokenizer_path")
    spec = build_engine(config, training["seq_len"],
                        load_tokenizer(tokenizer_path, add_bos=config.add_bos, add_eos=config.add_eos))
    global_batch = training["global_batch_size"]
    names = spec.source_names
    with LaneGroup(spec, range(spec.num_lanes), rows_per_lane(global_batch, spec.num_lanes), config.workers) as group:
        for step in range(1, steps + 1):
            lanes = group.next_step()
            tokens = [0] * len(names)
            padding = 0
            for rows in lanes:
                for row in rows:
                    tokens = [a + b for a, b in zip(tokens, row.tokens_by_source(len(names)))]
                    padding += row.padding
            yield LedgerEntry(step=step, sha256=batch_digest(lane_digest(rows) for rows in lanes), rows=global_batch,
                              tokens=dict(zip(names, tokens)), padding=padding)
