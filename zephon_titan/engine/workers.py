"""Lanes produced by worker processes, with bounded prefetch.

Each worker process rebuilds the spec, owns every N-th lane of the rank, and
produces R rows per lane per step, each row with the lane state right after it,
into its own bounded queue (`prefetch_steps` steps ahead). The consumer takes the
lanes in canonical order, so rows never depend on the number of workers or the
prefetch depth, and the state it reports is that of the rows it handed out, never
the prefetcher's. Workers are started with `spawn` (safe beside CUDA and threads),
a dead worker or an error in one is raised in the consumer, and `close()` (also
run at garbage collection and interpreter exit) stops and joins them.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
import weakref

from zephon_titan.engine.packing import Row
from zephon_titan.engine.spec import EngineSpec, portable, spec_from_portable
from zephon_titan.engine.state import LaneState
from zephon_titan.errors import DataError, LaneExhausted

_POLL_SECONDS = 1.0


def _worker_main(spec_data: dict, lanes: list[int], states: dict, rows_per_step: int, out, stop) -> None:
    try:
        from zephon_titan.engine.stream import LaneStream

        spec = spec_from_portable(spec_data)
        streams = [LaneStream(spec, lane, states.get(lane)) for lane in lanes]
        while not stop.is_set():
            for stream in streams:
                try:
                    message = ("rows", stream.lane_id, stream.take_with_states(rows_per_step))
                except LaneExhausted:
                    message = ("exhausted", stream.lane_id, None)
                while not stop.is_set():
                    try:
                        out.put(message, timeout=_POLL_SECONDS)
                        break
                    except queue.Full:
                        continue
                if message[0] == "exhausted":
                    return
    except BaseException:  # report everything, including errors while building the spec
        out.put(("error", None, traceback.format_exc()))


class ProcessLaneGroup:
    """The same interface as LaneGroup, with lanes produced by `workers` processes."""

    def __init__(
        self,
        spec: EngineSpec,
        lane_ids: list[int],
        rows_per_step: int,
        workers: int,
        prefetch_steps: int = 2,
        states: dict[int, LaneState] | None = None,
    ):
        states = dict(states or {})
        self.lane_ids = list(lane_ids)
        self.rows_per_step = rows_per_step
        self._consumed = {lane: states.get(lane) or _initial_state(spec, lane) for lane in self.lane_ids}
        workers = min(workers, len(self.lane_ids))
        self._worker_of = {lane: i % workers for i, lane in enumerate(self.lane_ids)}
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._queues = []
        self._procs = []
        data = portable(spec)
        for w in range(workers):
            mine = [lane for lane in self.lane_ids if self._worker_of[lane] == w]
            q = ctx.Queue(maxsize=prefetch_steps * len(mine))
            proc = ctx.Process(
                target=_worker_main,
                args=(data, mine, {lane: states[lane] for lane in mine if lane in states}, rows_per_step, q,
                      self._stop),
                name=f"zephon-lanes-{w}",
                daemon=True,
            )
            proc.start()
            self._queues.append(q)
            self._procs.append(proc)
        self._finalizer = weakref.finalize(self, _shutdown, self._stop, self._queues, self._procs)

    def _receive(self, lane: int):
        w = self._worker_of[lane]
        while True:
            try:
                kind, got_lane, payload = self._queues[w].get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                if not self._procs[w].is_alive():
                    raise DataError(
                        f"loader worker {w} (lanes {[x for x in self.lane_ids if self._worker_of[x] == w]}) died "
                        f"with exit code {self._procs[w].exitcode} (killed? out of memory?); "
                        "restart from the last checkpoint, or set [dataloader] workers = 1 to debug"
                    ) from None
        if kind == "error":
            raise DataError(f"loader worker {w} failed:\n{payload}")
        if got_lane != lane:
            raise RuntimeError(f"loader worker {w} sent lane {got_lane}, expected lane {lane}")
        if kind == "exhausted":
            raise LaneExhausted
        return payload

    def next_step_with_states(self) -> list[list[tuple[Row, LaneState]]]:
        step = [self._receive(lane) for lane in self.lane_ids]
        for lane, rows in zip(self.lane_ids, step):
            self._consumed[lane] = rows[-1][1]
        return step

    def next_step(self) -> list[list[Row]]:
        return [[row for row, _ in rows] for rows in self.next_step_with_states()]

    def state(self) -> dict[int, LaneState]:
        return dict(self._consumed)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> "ProcessLaneGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _initial_state(spec: EngineSpec, lane: int) -> LaneState:
    from zephon_titan.engine.stream import LaneStream

    return LaneStream(spec, lane).state()


def _shutdown(stop, queues, procs) -> None:
    stop.set()
    for q in queues:  # unblock workers waiting on a full queue
        try:
            while True:
                q.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
    for q in queues:
        q.cancel_join_thread()
        q.close()
