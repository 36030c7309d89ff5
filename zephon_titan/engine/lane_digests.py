"""The digests of a plan's lanes, step by step: in one process, or the lanes split over processes.

`zephon-titan plan` (plan.py) hashes each lane's rows of a step and tallies their tokens; the batch digest is
the lanes' digests in lane order. Lane streams are independent, so `PlanProcesses` gives each of `procs`
spawned processes a contiguous range of lanes; each sends, per step, only its lanes' 32-byte digests and
their tally (never rows), in chunks, and the parent merges them in lane order, one chunk per process at a
time (memory bounded whatever the number of steps). The processes import this engine only (never torch or
TorchTitan: this module is what they unpickle, and the parent's __main__ is hidden while they start), exit
when their parent dies, and a failure arrives at its step, in lane order, as the same one-line error one
process raises (a process killed outright: a DataError naming its lanes).
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
import weakref
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from zephon_titan import errors
from zephon_titan.engine.digest import lane_digest
from zephon_titan.engine.lanes import group_steps
from zephon_titan.engine.packing import step_tally
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import LaneState
from zephon_titan.errors import DataError, ZephonError

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

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


def _plan_process(
    lanes: list[int], conn: Connection[Any, Any], parent_pid: int, arm_pdeathsig: bool, threads: int
) -> None:
    """A planning process: its lanes' digests and tallies, step by step, in chunks through `conn`; then
    ("end", None) (its steps are done, or a lane ran out), ("error", (class, message)) or ("bug", traceback)."""
    from zephon_titan.engine.tokenizer_backends import limit_threads
    from zephon_titan.engine.workers import _exit_with_parent

    _exit_with_parent(parent_pid, arm_pdeathsig)
    limit_threads(threads)
    chunk: list[StepDigests] = []
    try:
        try:
            from zephon_titan.engine.lanes import LaneGroup
            from zephon_titan.engine.spec import spec_from_portable

            spec_data, rows_per_lane, states, start, steps = pickle.loads(conn.recv_bytes())
            spec = spec_from_portable(spec_data)
            spec.tokenizer.start_backend()
            group = LaneGroup(spec, lanes, rows_per_lane, states, start)
            sent = time.monotonic()
            for item in step_digests(group, len(spec.sources), start, steps):
                chunk.append(item)
                if len(chunk) >= _CHUNK_STEPS or time.monotonic() - sent >= _CHUNK_SECONDS:
                    conn.send(("steps", chunk))
                    chunk, sent = [], time.monotonic()
            end: tuple[str, Any] = ("end", None)
        except ZephonError as e:  # a bad file or setting: its one line is the whole story
            end = ("error", (type(e).__name__, str(e)))
        except Exception:  # a bug: keep the traceback
            end = ("bug", traceback.format_exc())
        conn.send(("steps", chunk))  # the steps before the end come first: the parent takes them in step order
        conn.send(end)
    except (OSError, EOFError, KeyboardInterrupt):  # the parent stopped listening, or Ctrl-C: it says why
        return


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
        import multiprocessing as mp
        import threading

        from zephon_titan.engine.spec import portable
        from zephon_titan.engine.tokenizer_backends import default_threads
        from zephon_titan.engine.workers import _main_module_hidden

        ctx = mp.get_context("spawn")  # safe beside threads (and CUDA, under a trainer)
        procs = min(procs, spec.num_lanes)
        n = spec.num_lanes
        self.lanes = [list(range(w * n // procs, (w + 1) * n // procs)) for w in range(procs)]
        self.start, self.last = start, steps
        self._conns: list[Connection[Any, Any]] = []
        self._procs: list[BaseProcess] = []
        self._finalizer = weakref.finalize(self, _stop, self._conns, self._procs)
        arm_pdeathsig = threading.current_thread() is threading.main_thread()
        for w, lanes in enumerate(self.lanes):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_plan_process,
                args=(lanes, theirs, os.getpid(), arm_pdeathsig, default_threads(procs)),
                name=f"zephon-plan-{w}",
                daemon=True,
            )
            with _main_module_hidden():  # the children import the engine only (not the CLI's __main__)
                proc.start()
            theirs.close()  # the child holds the only other end: its death is end of file here
            self._conns.append(mine)
            self._procs.append(proc)
        # Sent once every process is started (they start in parallel): the spec carries the tokenizer (megabytes).
        spec_data = portable(spec)
        for conn, lanes in zip(self._conns, self.lanes):
            mine_states = {lane: states[lane] for lane in lanes if lane in states}
            try:
                conn.send_bytes(pickle.dumps((spec_data, rows_per_lane, mine_states, start, steps)))
            except OSError:  # that process is gone: its pipe says why at the first receive
                pass

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
        conn, proc = self._conns[w], self._procs[w]
        while True:
            try:
                kind, payload = conn.recv()
            except (EOFError, ConnectionResetError):  # it exited (its socket is reset if we had not read all)
                proc.join(timeout=5)  # collect the exit code
                lanes = self.lanes[w]
                raise DataError(
                    f"plan process {w} (lanes {lanes[0]}-{lanes[-1]}) died with exit code {proc.exitcode} "
                    "(killed? out of memory?); plan with fewer --procs, or --procs 1"
                ) from None
            if kind == "steps":
                yield from payload
            elif kind == "end":
                return
            elif kind == "error":
                name, text = payload
                cls = getattr(errors, name, None)
                raise (cls if isinstance(cls, type) and issubclass(cls, ZephonError) else DataError)(text)
            else:
                raise RuntimeError(f"plan process {w} failed:\n{payload}")

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> PlanProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(conns: list[Connection[Any, Any]], procs: list[BaseProcess]) -> None:
    for conn in conns:  # a process blocked sending gets BrokenPipeError and exits
        conn.close()
    for proc in procs:  # one still computing (the plan stopped early) sends within _CHUNK_SECONDS, or is killed
        proc.join(timeout=2 * _CHUNK_SECONDS)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
