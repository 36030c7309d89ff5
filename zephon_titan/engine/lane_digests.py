"""The digests of a plan's lanes, step by step: in one process, or the lanes split over processes.

`zephon-titan plan` (plan.py) hashes each lane's rows of a step and tallies their tokens; the batch digest is
the lanes' digests in lane order. Lane streams are independent, so `PlanProcesses` gives each of `procs`
processes (a pool of process_pool.py) a contiguous range of lanes; each sends, per step, only its lanes'
32-byte digests and their tally (never rows), in chunks, and the parent merges them in lane order, one chunk
per process at a time (memory bounded whatever the number of steps). The processes import this engine only
(never torch or TorchTitan: this module is what they unpickle, and the parent's __main__ is hidden while they
start), exit when their parent dies, and a failure arrives at its step, in lane order, as the same one-line
error one process raises (a process killed outright: a DataError naming its lanes).
"""

from __future__ import annotations

import contextlib
import pickle
import time
from collections.abc import Iterator
from typing import Any

from zephon_titan.engine.digest import lane_digest
from zephon_titan.engine.lanes import LaneGroup, group_steps
from zephon_titan.engine.portable_spec import portable, spec_from_portable
from zephon_titan.engine.process_pool import Child, ProcessPool
from zephon_titan.engine.rows import step_tally
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import LaneState

StepDigests = tuple[int, list[bytes], list[int]]
"""One step of some lanes: (step, each lane's digest in lane order, their step_tally: tokens per source, padding, the documents' counts)."""


def step_digests(group: Any, num_sources: int, start: int, steps: int) -> Iterator[StepDigests]:
    """Steps start + 1 .. `steps` of a lane group's lanes; a finite run stops before the first step any of
    them cannot fill."""
    for step, lanes in group_steps(group, start, steps):
        counts = step_tally((row for rows in lanes for row in rows), num_sources)
        yield step, [lane_digest(rows) for rows in lanes], counts


# A planning process sends its steps in chunks of at most this many steps, or what it has after this many
# seconds (progress keeps moving when steps are slow). The parent holds one chunk per process and each
# process at most one more: memory stays bounded whatever --steps.
_CHUNK_STEPS = 256
_CHUNK_SECONDS = 0.5


def _plan_lanes(child: Child, job: tuple[Any, ...], lanes: list[int]) -> None:
    """A planning process (a child of process_pool.py): its lanes' digests and tallies, step by step, in chunks;
    then ("end", None, None): its steps are done, or a lane ran out."""
    spec_data, rows_per_lane, states, start, steps = job
    spec = spec_from_portable(spec_data)
    spec.tokenizer.start_backend()
    chunk: list[StepDigests] = []
    try:
        group = LaneGroup(spec, lanes, rows_per_lane, states, start)
        sent = time.monotonic()
        for item in step_digests(group, len(spec.sources), start, steps):
            if child.stopped():  # the parent closed: it reads no more
                return
            chunk.append(item)
            if len(chunk) >= _CHUNK_STEPS or time.monotonic() - sent >= _CHUNK_SECONDS:
                child.send(("steps", None, chunk))
                chunk, sent = [], time.monotonic()
    except BaseException:  # the steps before the failure come first: the parent takes them in step order
        with contextlib.suppress(OSError):
            child.send(("steps", None, chunk))
        raise
    child.send(("steps", None, chunk))
    child.send(("end", None, None))


class PlanProcesses:
    """`procs` spawned processes, each simulating a contiguous range of lanes; `steps()` merges their
    per-step digests in lane order. Closing (also at garbage collection) stops and joins them."""

    def __init__(
        self,
        spec: EngineSpec,
        rows_per_lane: int,
        states: dict[int, LaneState],
        start: int,
        steps: int,
        procs: int,
    ):
        procs = min(procs, spec.num_lanes)
        n = spec.num_lanes
        self.lanes = [list(range(w * n // procs, (w + 1) * n // procs)) for w in range(procs)]
        self.start, self.last = start, steps
        self._pool = ProcessPool(
            _plan_lanes,
            [(lanes,) for lanes in self.lanes],
            process_name="zephon-plan",
            names=[f"plan process {w} (lanes {lanes[0]}-{lanes[-1]})" for w, lanes in enumerate(self.lanes)],
            remedy="plan with fewer --procs, or --procs 1",
            grace_seconds=2 * _CHUNK_SECONDS,  # one still computing (the plan stopped early) stops within a step
        )
        self._procs = self._pool.procs
        # Sent once every process is started (they start in parallel): the spec carries the tokenizer (megabytes).
        spec_data = portable(spec)
        self._pool.send_jobs(
            [
                pickle.dumps(
                    (spec_data, rows_per_lane, {lane: states[lane] for lane in lanes if lane in states}, start, steps)
                )
                for lanes in self.lanes
            ]
        )

    def steps(self) -> Iterator[StepDigests]:
        """Every step of all lanes, in step order, until `steps` or the first step any lane cannot fill; a
        process's error is raised at its step, in lane order: what one process planning every lane raises."""
        received = [self._received(w) for w in range(len(self.lanes))]
        for step in range(self.start + 1, self.last + 1):
            digests: list[bytes] = []
            counts: list[int] = []
            for part in received:
                got = next(part, None)
                if got is None:  # a lane of this range ran out (or its process failed: raised by next())
                    return
                assert got[0] == step, (got[0], step)
                digests += got[1]
                counts = [a + b for a, b in zip(counts, got[2])] if counts else got[2]
            yield step, digests, counts

    def _received(self, w: int) -> Iterator[StepDigests]:
        """Process w's steps; its error, bug or death raised where it comes (ProcessPool.receive)."""
        while True:
            kind, _, payload = self._pool.receive(w)
            if kind == "steps":
                yield from payload
            else:  # "end"
                return

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> PlanProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
