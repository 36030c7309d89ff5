"""Lanes produced by worker processes, with bounded prefetch.

Each worker process (a child of engine/process_pool.py) rebuilds the spec, owns every N-th lane of the rank,
and produces R rows per lane per step, each row with the lane state right after it, into its own pipe, at
most `prefetch_factor` steps ahead (a semaphore of credits). A thread of the consumer (StepCollector) takes
the lanes in canonical order, one step ahead of the trainer, so rows never depend on the number of workers
or the prefetch depth; the state the group reports is that of the rows it handed out, never the
prefetcher's. `close()` (also run at garbage collection and interpreter exit) stops the thread, then the
workers.

What the pool guarantees holds here (process_pool.py): lean workers (the trainer's __main__ hidden: they
import the engine only), workers that exit when their parent dies, and failures bounded in time and said in
one line:
- a worker that dies, even halfway through writing a message of any size, is a DataError within about a
  second;
- a worker's ZephonError arrives as its own one-line message and class, with the lane named;
  anything else (a bug) keeps its traceback.
"""

from __future__ import annotations

import pickle
import queue
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zephon_titan.engine.portable_spec import PortableSpec, portable, spec_from_portable
from zephon_titan.engine.process_pool import POLL_SECONDS, RECEIVE_POLL_SECONDS, Child, Closing, ProcessPool, context
from zephon_titan.engine.rows import Row
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import LaneState
from zephon_titan.errors import LaneExhausted

if TYPE_CHECKING:
    from multiprocessing import synchronize


def _produce(
    child: Child, spec_data: PortableSpec, lanes: list[int], rows_per_step: int, credits: synchronize.Semaphore
) -> None:
    """A worker: its lanes' rows, with their states, step after step, into its pipe (see the module docstring)."""
    from zephon_titan.engine.encode_calls import EncodeBatcher
    from zephon_titan.engine.stream import LaneStream, lane_clock

    spec = spec_from_portable(spec_data)
    # Load and check the backend before producing (while the states come, under the trainer). Not in
    # the background as in process: with cores shared by the workers, producing with the reference
    # until it is ready measured slower, both to the first batch and over the first steps.
    name = spec.tokenizer.select_backend(announce=False)
    child.send(("backend", None, (name, spec.tokenizer.backend_reason)))  # the consumer says it, once
    got = child.wait()  # the lane states: sent by start(), once the consumer knows them
    if got is None:
        return
    states: dict[int, LaneState]
    states, first_step = got
    batcher = EncodeBatcher()  # the group's readers encode in shared calls
    streams = [
        LaneStream(spec, lane, states.get(lane), lane_clock(rows_per_step, states.get(lane), first_step), batcher)
        for lane in lanes
    ]
    while not child.stopped():
        for stream in streams:
            lane = child.where = stream.lane_id
            message: tuple[str, int, list[tuple[Row, LaneState]] | None]
            try:
                message = ("rows", lane, stream.take_with_states(rows_per_step))
            except LaneExhausted:
                message = ("exhausted", lane, None)
            while not credits.acquire(timeout=POLL_SECONDS):  # prefetch_factor steps ahead at most
                if child.stopped():
                    return
            child.send(message)
            if message[0] == "exhausted":
                return


def step_bytes(seq_len: int, rows: int) -> int:
    """About what one step of `rows` rows weighs in a worker's pipe: three int32 arrays per row (inputs,
    labels, positions) and ~1 KB of pieces and lane state."""
    return rows * (3 * 4 * seq_len + 1024)


class StepCollector:
    """Receives whole steps from the workers' pipes in a thread, one step ahead of the consumer.

    Taking a step from the pipes costs the trainer process ~5 ms (64 lanes of 2048-token rows: reading
    and unpickling); done here while the trainer computes, the step is ready when asked for. Measured
    with benchmarks/handoff.py. A failure (a worker's error, a dead worker, an exhausted lane) is handed
    over in order and raised by `next_step`, then again at every later call. The collector holds no
    reference to its group, so a group nobody closed is still collected (and its workers stopped)."""

    def __init__(self, lane_ids: list[int], receive: Callable[[int, Callable[[], bool]], Any]):
        self._lane_ids = lane_ids
        self._receive = receive
        self._steps: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
        self._closing = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="zephon-receive", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        def open_() -> bool:
            return not self._closing.is_set()

        try:
            while open_():
                self._put(("step", [self._receive(lane, open_) for lane in self._lane_ids]))
        except Closing:
            pass
        except BaseException as e:  # every failure is the consumer's to raise, in order
            if open_():
                self._put(("error", e))

    def _put(self, item: tuple[str, Any]) -> None:
        while not self._closing.is_set():
            try:
                self._steps.put(item, timeout=RECEIVE_POLL_SECONDS)
                return
            except queue.Full:
                continue

    def next_step(self) -> list[list[tuple[Row, LaneState]]]:
        while self._failure is None:
            try:
                kind, value = self._steps.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if not self._thread.is_alive():  # cannot happen while open: _run hands over its failure
                    raise RuntimeError("the loader's receiving thread stopped") from None
                continue
            if kind == "step":
                step: list[list[tuple[Row, LaneState]]] = value
                return step
            self._failure = value
        raise self._failure

    def stop(self) -> None:
        """Stop the thread and wait for it, before the pipes it reads are closed (a closed descriptor's
        number can be reused at once by another open: a thread still reading it would read someone else's)."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join()


class ProcessLaneGroup:
    """The same interface as LaneGroup, with lanes produced by `num_workers` processes."""

    def __init__(
        self,
        spec: EngineSpec,
        lane_ids: list[int],
        rows_per_step: int,
        num_workers: int,
        prefetch_factor: int = 2,
        states: dict[int, LaneState] | None = None,
        deferred: bool = False,
        first_step: int = 0,
    ):
        """`deferred`: start the processes now (imports, tokenizer) and the lanes at `start(states, first_step)`."""
        self.lane_ids = list(lane_ids)
        self.rows_per_step = rows_per_step
        self._num_sources = len(spec.sources)
        self._consumed: dict[int, LaneState] = {}
        workers = min(num_workers, len(self.lane_ids))
        self._worker_of = {lane: i % workers for i, lane in enumerate(self.lane_ids)}
        lanes_of = {w: self._lanes_of(w) for w in range(workers)}
        ctx = context()
        credits = [ctx.Semaphore(prefetch_factor * len(lanes_of[w])) for w in range(workers)]

        def locate(w: int, lane: int | None) -> str:
            return f" (in loader worker {w}, {f'lane {lane}' if lane is not None else f'lanes {lanes_of[w]}'})"

        spec_bytes = pickle.dumps(portable(spec), protocol=pickle.HIGHEST_PROTOCOL)
        self._pool = ProcessPool(
            _produce,
            [(lanes_of[w], rows_per_step, credits[w]) for w in range(workers)],
            process_name="zephon-lanes",
            names=[f"loader worker {w} (lanes {lanes_of[w]})" for w in range(workers)],
            remedy="restart from the last checkpoint, or set [dataloader] num_workers = 0 to debug",
            locate=locate,
            pipe_bytes=[step_bytes(spec.seq_len, len(lanes_of[w]) * rows_per_step) for w in range(workers)],
        )
        self._procs, self._readers = self._pool.procs, self._pool.readers
        self._backends: dict[int, tuple[str, str]] = {}  # worker -> (backend, why), from its first message
        self._collector = StepCollector(self.lane_ids, _receiver(self._pool, self._worker_of, credits, self._backends))
        self._finalizer = weakref.finalize(self, _shutdown, self._collector, self._pool)
        # The constructor returns at once (the trainer builds its model meanwhile); start() sends after it.
        self._pool.send_jobs([spec_bytes] * workers)
        if not deferred:
            self.start(states or {}, first_step)

    def start(self, states: dict[int, LaneState], first_step: int = 0) -> None:
        """Let the workers produce, each lane from its state in `states` (its first row if absent),
        `first_step` steps into the run."""
        if self._consumed:
            raise RuntimeError("ProcessLaneGroup.start() runs once")
        self._consumed = {
            lane: states.get(lane) or LaneState.initial(lane, self._num_sources) for lane in self.lane_ids
        }
        for w in range(len(self._procs)):
            self._pool.send(w, ({lane: states[lane] for lane in self._lanes_of(w) if lane in states}, first_step))
        self._collector.start()

    def _lanes_of(self, w: int) -> list[int]:
        return [lane for lane in self.lane_ids if self._worker_of[lane] == w]

    def next_step_with_states(self) -> list[list[tuple[Row, LaneState]]]:
        if not self._consumed:
            raise RuntimeError("ProcessLaneGroup.start() first: the workers have no lane states yet")
        step = self._collector.next_step()
        for lane, rows in zip(self.lane_ids, step):
            self._consumed[lane] = rows[-1][1]
        return step

    def next_step(self) -> list[list[Row]]:
        return [[row for row, _ in rows] for rows in self.next_step_with_states()]

    def state(self) -> dict[int, LaneState]:
        return dict(self._consumed)

    def backends(self) -> dict[int, tuple[str, str]]:
        """Per worker, the tokenizer backend it chose and why; complete once a step has been received."""
        return dict(self._backends)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> ProcessLaneGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _receiver(
    pool: ProcessPool,
    worker_of: dict[int, int],
    credits: list[synchronize.Semaphore],
    backends: dict[int, tuple[str, str]],
) -> Callable[[int, Callable[[], bool]], list[tuple[Row, LaneState]]]:
    """`receive(lane, open_)`: the lane's next rows from its worker's pipe (for StepCollector; it holds
    these parts, never the group). A worker's first message, its tokenizer backend, goes to `backends`."""

    def receive(lane: int, open_: Callable[[], bool]) -> list[tuple[Row, LaneState]]:
        w = worker_of[lane]
        kind, got_lane, payload = pool.receive(w, open_)
        if kind == "backend":  # sent once, before any rows (and outside the credits)
            backends[w] = payload
            kind, got_lane, payload = pool.receive(w, open_)
        credits[w].release()
        if got_lane != lane:
            raise RuntimeError(f"loader worker {w} sent lane {got_lane}, expected lane {lane}")
        if kind == "exhausted":
            raise LaneExhausted
        rows: list[tuple[Row, LaneState]] = payload  # a "rows" message (unpickled: not checked)
        return rows

    return receive


def _shutdown(collector: StepCollector, pool: ProcessPool) -> None:
    pool.stop()
    collector.stop()  # before the pipes it reads are closed
    pool.close()
