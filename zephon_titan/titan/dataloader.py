"""ZephonDataLoader: TorchTitan's BaseDataLoader over the lane engine.

Each DP rank owns the contiguous lanes [r L/W, (r+1) L/W) and yields, per optimizer
step, R = G/L rows of each of its lanes in lane order, cut into microbatches of
local_batch_size rows. Its checkpoint state is one entry per lane plus a header
replicated on every rank, so a rank that owns other lanes after a resize loads
exactly those entries from TorchTitan's DCP checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
import torch
import torch.distributed as dist
import tyro
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.tools.logging import logger

from zephon_titan.config import DataConfig, config_from_dict, short_repr
from zephon_titan.engine import (
    LaneState,
    Row,
    build_engine,
    check_fingerprint,
    check_mixture,
    fingerprint,
    lane_digest,
    lanes_of_rank,
    open_lane_group,
    tally,
    validate_batch_layout,
)
from zephon_titan.engine.workers import ProcessLaneGroup
from zephon_titan.errors import ConfigError, LaneExhausted, ResumeError, ZephonError
from zephon_titan.titan.prefetch import PrefetchedSteps, StepSource
from zephon_titan.titan.state_codec import (
    HEADER_CAPACITY,
    HEADER_KEY,
    HEADER_VERSION,
    encode_entry,
    lane_capacity,
    lane_key,
    read_header,
    read_lane,
    saved_sources,
    seal,
    stored_lane_capacity,
)
from zephon_titan.titan.tokenizer import loader_tokenizer


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What this rank's lanes contributed to one step, for the batch ledger."""

    lane_digests: list[bytes]
    tokens: list[int]
    """Per source, then padding (last)."""

    @classmethod
    def of(cls, step: list[list[tuple[Row, LaneState]]], num_sources: int) -> StepRecord:
        totals = tally((row for rows in step for row, _ in rows), num_sources)
        return cls([lane_digest(row for row, _ in rows) for rows in step], totals)


def _long_tensor(rows: list[np.ndarray]) -> torch.Tensor:
    """int64 [len(rows), seq_len], stacked and widened in one copy; the tensor shares its memory."""
    return torch.from_numpy(np.stack(rows, dtype=np.int64))


class ZephonDataLoader(BaseDataLoader):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        # Flat on the command line (--dataloader.seed) and in the TOML [dataloader] table, as before.
        data: Annotated[DataConfig, tyro.conf.arg(name="")] = field(default_factory=DataConfig)
        """What the rows depend on: sources, lanes, seed, packing, ... (the [dataloader] table)."""

        # Not a user setting: ZephonTrainer copies training.global_batch_size here (one truth).
        global_batch_size: Annotated[int, tyro.conf.Suppress] = -1
        """Rows per optimizer step, copied from training.global_batch_size."""

        ledger: bool = True
        """Write each step's global-batch SHA-256 to ledger.jsonl beside the checkpoints."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any,
        seq_len: int,
        local_batch_size: int,
        **_unused: Any,  # snapshot_every_n_steps: state is always exact, no snapshots needed
    ):
        self.config = config
        data = config.data
        self.rows_per_lane = validate_batch_layout(data.num_lanes, config.global_batch_size, dp_world_size,
                                                   local_batch_size)  # fmt: skip
        self.local_batch_size = local_batch_size
        self.spec = build_engine(data, seq_len, loader_tokenizer(data, lambda: tokenizer))
        # In process: loaded while the trainer builds its model; chosen (and said, once per rank) at the first
        # batch. Worker processes load, check and report their own: this process then never tokenizes.
        if not data.num_workers:
            self.spec.tokenizer.start_backend()
        self.fingerprint = fingerprint(self.spec)
        self._steps_done = 0  # whole steps consumed (a row's step matters under a mixture schedule)
        self.restored_step: int | None = None  # the step of the state the last load_state_dict restored
        self._load_capacity: int | None = None  # set by sized_for() during one DCP load
        try:
            encode_entry(self._header(), HEADER_CAPACITY)  # fails here, at startup, never at the first save
        except ResumeError:
            phases, sources = len(data.phases), len(data.sources)
            raise ConfigError(
                f"[[dataloader.phases]]: the schedule ({phases} phases x {sources} sources) does not fit the "
                f"checkpoint header's {HEADER_CAPACITY} bytes; use fewer phases (ramp_steps draws a ramp in one)"
            ) from None
        self.lane_ids = list(lanes_of_rank(data.num_lanes, dp_world_size, dp_rank))
        num_sources = len(self.spec.sources)
        self._group: StepSource | None = None
        # Worker processes start now (imports, tokenizer backend) while the trainer builds the model
        # and loads a checkpoint; their lanes start at the first batch, from the consumed state.
        self._warm: Any = None
        if data.num_workers:
            self._warm = open_lane_group(
                self.spec, self.lane_ids, self.rows_per_lane, data.num_workers, data.prefetch_factor, deferred=True
            )
        # What the trainer has consumed, per lane: engine state and tokens per source.
        # Known without reading data: building the loader costs no request to the sources.
        self._consumed: dict[int, LaneState] = {lane: LaneState.initial(lane, num_sources) for lane in self.lane_ids}
        self._tokens: dict[int, list[int]] = {lane: [0] * num_sources for lane in self.lane_ids}
        self._padding: dict[int, int] = {lane: 0 for lane in self.lane_ids}
        self.last_step: StepRecord | None = None

    # ---- iteration -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        num_sources = len(self.spec.sources)
        announce_workers = False
        if self._group is None:
            data = self.config.data
            if self._warm is not None:
                group, self._warm = self._warm, None
                group.start(self._consumed, self._steps_done)
            else:
                group = open_lane_group(
                    self.spec,
                    self.lane_ids,
                    self.rows_per_lane,
                    data.num_workers,
                    data.prefetch_factor,
                    self._consumed,
                    first_step=self._steps_done,
                )
            # In process, a thread produces the next steps while the trainer computes (titan/prefetch.py).
            if data.num_workers:
                self._group = group
                announce_workers = True  # with the first step: the workers report their backend before any rows
            else:
                self._announce_backend()  # before the prefetch thread encodes: one thread uses the tokenizer
                self._group = PrefetchedSteps(group, data.prefetch_factor)
        while True:
            step = self._next_step_everywhere()
            if step is None:
                logger.warning(
                    f'zephon_titan: a lane ran out of data under exhaustion = "{self.config.data.exhaustion}" after '
                    f"{self._consumed[self.lane_ids[0]].rows} rows per lane; every rank stops here"
                )
                return
            if announce_workers:
                self._announce_workers_backend()
                announce_workers = False
            record = StepRecord.of(step, num_sources) if self.config.ledger else None
            flat = [(lane, row, state) for lane, rows in zip(self.lane_ids, step) for row, state in rows]
            for start in range(0, len(flat), self.local_batch_size):
                chunk = flat[start : start + self.local_batch_size]
                batch = (
                    {
                        "input": _long_tensor([row.inputs for _, row, _ in chunk]),
                        "positions": _long_tensor([row.positions for _, row, _ in chunk]),
                    },
                    _long_tensor([row.labels for _, row, _ in chunk]),
                )
                # Handing the microbatch over is consumption: record it before yielding.
                for lane, row, state in chunk:
                    self._consumed[lane] = state
                    counts = tally([row], num_sources)
                    self._tokens[lane] = [a + b for a, b in zip(self._tokens[lane], counts)]
                    self._padding[lane] += counts[-1]
                if start + self.local_batch_size >= len(flat):
                    self.last_step = record  # the step's last microbatch is consumed with this one
                    self._steps_done += 1
                yield batch

    def _announce_backend(self) -> None:
        """Choose the backend (loaded in the background since __init__, while the model was built) and
        say which, once per rank: a fallback, or tokenizer_backend = fastokens refused, before step 1."""
        self.spec.tokenizer.select_backend()
        logger.info(f"zephon_titan: tokenizer backend {self.spec.tokenizer.backend_reason}")

    def _announce_workers_backend(self) -> None:
        """Say which backend the loader workers chose, once per rank, before step 1: each worker loads and
        checks its own (a refused tokenizer_backend = fastokens is its error, raised with the first step)."""
        assert isinstance(self._group, ProcessLaneGroup)
        chosen: dict[str, list[int]] = {}
        for worker, (_, why) in sorted(self._group.backends().items()):
            chosen.setdefault(why, []).append(worker)
        for why, workers in chosen.items():
            logger.info(f"zephon_titan: tokenizer backend {why} (loader workers {', '.join(map(str, workers))})")

    def _next_step_everywhere(self):
        """The next step's rows, or None on every rank once any lane of the run is exhausted.

        Lanes only run out under a non-repeating policy, and they run out at different steps;
        a rank that stopped alone would leave the others waiting in a collective. So finite runs
        agree on every step with one tiny all-reduce (MIN of "I have a full step").
        """
        assert self._group is not None, "__iter__ opens the lane group first"
        try:
            step = self._group.next_step_with_states()
        except LaneExhausted:
            step = None
        if self.spec.repeat or not dist.is_initialized():
            return step
        have = torch.tensor([0 if step is None else 1], dtype=torch.int32, device=collective_device())
        dist.all_reduce(have, op=dist.ReduceOp.MIN)
        return step if int(have.item()) == 1 else None

    # ---- token accounting ------------------------------------------------------------------

    def consumed_tokens(self) -> list[int]:
        """Tokens per source (plus padding, last) in this rank's lanes, as consumed by the trainer."""
        totals = [sum(self._tokens[lane][s] for lane in self.lane_ids) for s in range(len(self.spec.sources))]
        return totals + [sum(self._padding.values())]

    # ---- checkpoint state ------------------------------------------------------------------

    def _header(self) -> dict:
        # num_lanes and seq_len are fingerprint components; G is checked on its own (load_state_dict).
        return {
            "version": HEADER_VERSION,
            "global_batch_size": self.config.global_batch_size,
            "step": self._steps_done,
            "fingerprint": self.fingerprint,
        }

    @contextlib.contextmanager
    def sized_for(self, checkpoint_id: str, metadata: Any = None) -> Iterator[None]:
        """Around a DCP load of `checkpoint_id`: state_dict() gives templates of the size the checkpoint
        stored its lane entries with (a resume may add sources, whose entries are bigger). Reads its
        `.metadata` without running it (or takes `metadata`, the index read so before)."""
        self._load_capacity = stored_lane_capacity(checkpoint_id, metadata)
        try:
            yield
        finally:
            self._load_capacity = None  # saves size their entries for this run's sources

    def state_dict(self) -> dict[str, Any]:
        num_sources = len(self.spec.sources)
        header = seal(self._header(), HEADER_KEY)
        state = {HEADER_KEY: encode_entry(header, HEADER_CAPACITY)}
        if self._load_capacity is not None:  # a template for sized_for's DCP load: only the size counts
            state.update(
                {lane_key(lane): torch.zeros(self._load_capacity, dtype=torch.uint8) for lane in self.lane_ids}
            )
            return state
        for lane in self.lane_ids:
            entry = {
                "state": self._consumed[lane].to_dict(),
                "tokens": self._tokens[lane],
                "padding": self._padding[lane],
            }
            state[lane_key(lane)] = encode_entry(
                seal(entry, lane_key(lane), header["seal"]), lane_capacity(num_sources)
            )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        header = read_header(state_dict)
        check_header(header, self.fingerprint, self.config.data.resume_allow)
        entries = read_lane_states(state_dict, self.lane_ids, header, self.spec.source_names)
        step = saved_step(header, next(iter(entries.values()))[0].rows)
        change = check_mixture(header["fingerprint"], self.fingerprint, step)
        added = [name for name in self.spec.source_names if name not in saved_sources(header)]
        if dp_rank_zero():
            if added:
                logger.info(f"zephon_titan: sources added at this resume: {', '.join(added)} (each from its start)")
            if change:
                logger.info(f"zephon_titan: {change}")
        saved_batch = header.get("global_batch_size")
        if saved_batch != self.config.global_batch_size and dp_rank_zero():
            logger.info(
                f"zephon_titan: global batch size {saved_batch} -> {self.config.global_batch_size} rows from the next "
                "step on; every lane continues where it stopped (lane streams do not depend on it)"
            )
        self._close_started()  # a group started before the load would continue from the old position
        self._consumed = {lane: entry[0] for lane, entry in entries.items()}
        self._tokens = {lane: entry[1] for lane, entry in entries.items()}
        self._padding = {lane: entry[2] for lane, entry in entries.items()}
        self._steps_done = step
        self.restored_step = step

    def check_step(self, trainer_step: int, checkpoint: str = "the checkpoint") -> None:
        """After a load: the loader state restored must be of the trainer's restored step. A whole loader
        state of another step of the same run passes every other check, and every later batch differs."""
        if self.restored_step is not None and self.restored_step != trainer_step:
            raise ResumeError(
                f"{checkpoint}: its dataloader state is of step {self.restored_step}, its train_state of step "
                f"{trainer_step}; the loader entries were copied from another checkpoint: restore the "
                "checkpoint from a good copy or resume from another step"
            )

    def close(self) -> None:
        self._close_started()
        if self._warm is not None:
            self._warm.close()
            self._warm = None

    def _close_started(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None


def loader_config(table: Any) -> ZephonDataLoader.Config:
    """The [dataloader] table: the data settings (config.py) plus the TorchTitan loader's own (`ledger`).
    Here, not in job.py, so that it is usable where TorchTitan's trainer cannot import (scripts/gpu_check.py)."""
    if not isinstance(table, dict):
        raise ConfigError(f"[dataloader] must be a table, got {short_repr(table)}")
    table = dict(table)
    ledger = table.pop("ledger", True)
    if not isinstance(ledger, bool):
        raise ConfigError(f"[dataloader] ledger must be true or false, got {short_repr(ledger)}")
    return ZephonDataLoader.Config(data=config_from_dict(table), ledger=ledger)


def read_lane_states(
    state: dict[str, Any], lane_ids, header: dict, source_names: list[str]
) -> dict[int, tuple[LaneState, list[int], int]]:
    """The checked entries of `lane_ids`; every lane must stand at the same row (the end of one step).

    Not a multiple of this run's rows per lane: the global batch size may have changed at a resume."""
    entries = {lane: read_lane(state, lane, header, source_names) for lane in lane_ids}
    rows = {entry[0].rows for entry in entries.values()}
    if len(rows) != 1:
        raise ResumeError(
            f"the checkpoint's lanes stand at rows {sorted(rows)}, not at the end of one step (every lane gives "
            "the same number of rows per step); the checkpoint is damaged"
        )
    return entries


def saved_step(header: dict, rows: int) -> int:
    """Steps consumed when the checkpoint was saved. Headers written before the global batch size could
    change have no `step`: then every step had the header's rows per lane."""
    if "step" in header:
        return int(header["step"])
    per_step = header["global_batch_size"] // int(header["fingerprint"]["num_lanes"])  # >= 1: read_header
    if rows % per_step:
        raise ResumeError(
            f"the checkpoint's lanes stand at row {rows}, not at the end of a step of {per_step} rows per lane "
            "(its header has no step); the checkpoint is damaged"
        )
    return rows // per_step


def check_header(header: dict, current_fingerprint: dict, allow) -> None:
    """Refuse a checkpoint whose data stream differs from this run's, naming what changed.

    The global batch size may change at a resume: lane streams do not depend on it, so every lane
    continues where it stopped and the new size applies from the next step. The mixture is checked
    apart (check_mixture), once the checkpoint's step is known: only its future may change."""
    if header.get("version") != HEADER_VERSION:
        raise ResumeError(
            f"the checkpoint's dataloader state has format version {header.get('version')!r}, this zephon_titan "
            f"reads version {HEADER_VERSION}; resume with the zephon_titan that wrote it, or start the data stream "
            "over (--checkpoint.exclude_from_loading dataloader)"
        )
    check_fingerprint(header["fingerprint"], current_fingerprint, allow, mixture_checked_apart=True)


def with_lane_check(load: Callable, num_lanes: int) -> Callable:
    """Wrap a DCP load so that a checkpoint lacking some of this run's lanes says why.

    With more lanes than the checkpoint, DCP fails before the loader sees its header
    (the new lane keys are missing), so the fingerprint check cannot name the change.
    """

    def load_with_lane_check(*args, **kwargs):
        try:
            return load(*args, **kwargs)
        except ZephonError:
            raise  # already says what is wrong (and may name dataloader entries)
        except BaseException as e:  # DCP wraps failures in CheckpointException, a BaseException
            if "dataloader." in str(e) and "Size mismatch" in str(e):
                raise ResumeError(
                    f"the checkpoint's dataloader entries have other sizes than this run's ({_first_line(e)}): it was "
                    "saved with another number of [dataloader] sources, by another zephon_titan version, or it is "
                    "damaged. `zephon-titan plan JOB --from-checkpoint DIR --steps 0` names what changed; restore the "
                    "old sources, or start the data stream over (--checkpoint.exclude_from_loading dataloader)"
                ) from None
            if "dataloader.header" in str(e):
                raise ResumeError(
                    "the checkpoint holds no dataloader state (it was saved model-only: TorchTitan's "
                    "last_save_model_only = true, the default, writes the final checkpoint without it). Resume from an "
                    "earlier step-N checkpoint, or load the model only and start the data stream over with "
                    "--checkpoint.exclude_from_loading dataloader; set [checkpoint] last_save_model_only = false "
                    "to keep the loader state in future final checkpoints"
                ) from None
            if "dataloader.lane_" not in str(e):
                raise
            raise ResumeError(
                f"the checkpoint has no dataloader state for some of this run's {num_lanes} lanes ({e}); it was "
                "saved with fewer [dataloader] num_lanes. Lanes are fixed for a run: set num_lanes back to the "
                "checkpoint's value, or exclude the dataloader from loading "
                "(--checkpoint.exclude_from_loading dataloader) to start the data stream over"
            ) from None

    return load_with_lane_check


def collective_device() -> torch.device | str:
    """Where a tensor for a collective over the default group must live (NCCL: this rank's GPU)."""
    return torch.device("cuda", torch.cuda.current_device()) if "nccl" in str(dist.get_backend()) else "cpu"


def dp_rank_zero() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if "dataloader." in line]
    return (lines[0] if lines else str(e).splitlines()[0] if str(e) else type(e).__name__)[:300]
