"""Lanes produced by worker processes, with bounded prefetch.

Each worker process rebuilds the spec, owns every N-th lane of the rank, and
produces R rows per lane per step, each row with the lane state right after it,
into its own pipe, at most `prefetch_factor` steps ahead (a semaphore of credits). A thread
of the consumer (StepCollector) takes the lanes in canonical order, one step ahead of the
trainer, so rows never depend on the number of workers or the prefetch depth; the state the
group reports is that of the rows it handed out, never the prefetcher's. Workers are started
with `spawn` (safe beside CUDA and threads) and `close()` (also run at garbage collection and
interpreter exit) stops and joins them.

Failures are bounded in time and said in one line:
- a worker that dies, even halfway through writing a message of any size, is a DataError
  within about a second (engine/channel.py reads without ever blocking on a dead writer);
- a worker's ZephonError arrives as its own one-line message and class, with the lane named;
  anything else (a bug) keeps its traceback;
- workers exit when their parent dies, however it dies (SIGKILL from the OOM killer
  included): a parent-death signal where Linux has one, and a watcher of the parent pid.

Lean workers: a spawned child normally re-imports the parent's main module; under the trainer
that is torch and torchtitan (~500 MB per worker) for nothing. The main module is hidden
while the workers start, so they import the engine only (numpy, pyarrow, tokenizers).
Each worker sizes its tokenizer thread pool so that workers x threads fits the cores
(tokenizer_backends.default_threads).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from zephon_titan import errors
from zephon_titan.engine import channel
from zephon_titan.engine.packing import Row
from zephon_titan.engine.spec import EngineSpec, PortableSpec, portable, spec_from_portable
from zephon_titan.engine.state import LaneState
from zephon_titan.engine.tokenizer_backends import default_threads, limit_threads
from zephon_titan.errors import DataError, LaneExhausted, ZephonError

if TYPE_CHECKING:
    from multiprocessing import synchronize
    from multiprocessing.process import BaseProcess

_POLL_SECONDS = 1.0
_COLLECT_POLL_SECONDS = 0.05  # how soon the receiving thread notices a close (it must stop before the pipes close)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start spawned children without re-importing the parent's __main__ (see the module docstring).

    multiprocessing records the main module to re-import when the child is started; an empty
    stand-in has neither a name nor a file to record. The workers' code is in this package."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _worker_main(
    lanes: list[int],
    start: Connection[Any, Any],
    rows_per_step: int,
    writer: Connection[Any, Any],
    credits: synchronize.Semaphore,
    stop: StopFlag,
    parent_pid: int,
    arm_pdeathsig: bool,
    threads: int,
) -> None:
    _exit_with_parent(parent_pid, arm_pdeathsig)
    limit_threads(threads)
    fd, lane = writer.fileno(), None
    try:
        from zephon_titan.engine.encode_calls import EncodeBatcher
        from zephon_titan.engine.stream import LaneStream, lane_clock

        try:
            spec_data: PortableSpec = pickle.loads(start.recv_bytes())  # sent once every worker has started
        except EOFError:  # the group was closed before we were needed
            return
        spec = spec_from_portable(spec_data)
        # Load and check the backend before producing (while the states come, under the trainer). Not in
        # the background as in process: with cores shared by the workers, producing with the reference
        # until it is ready measured slower, both to the first batch and over the first steps.
        name = spec.tokenizer.select_backend(announce=False)
        channel.send(fd, ("backend", None, (name, spec.tokenizer.backend_reason)))  # the consumer says it, once
        while not start.poll(_POLL_SECONDS):  # the lane states: sent by start(), once the consumer knows them
            if stop.is_set():
                return
        states: dict[int, LaneState]
        states, first_step = start.recv()
        batcher = EncodeBatcher()  # the group's readers encode in shared calls
        streams = [
            LaneStream(spec, lane, states.get(lane), lane_clock(rows_per_step, states.get(lane), first_step), batcher)
            for lane in lanes
        ]
        while not stop.is_set():
            for stream in streams:
                lane = stream.lane_id
                message: tuple[str, int, list[tuple[Row, LaneState]] | None]
                try:
                    message = ("rows", lane, stream.take_with_states(rows_per_step))
                except LaneExhausted:
                    message = ("exhausted", lane, None)
                while not credits.acquire(timeout=_POLL_SECONDS):  # prefetch_factor steps ahead at most
                    if stop.is_set():
                        return
                channel.send(fd, message)
                if message[0] == "exhausted":
                    return
    except BrokenPipeError:  # the consumer closed its end: it is shutting down
        return
    except ZephonError as e:  # a bad file or setting: its one line is the whole story
        _report(fd, ("error", lane, (type(e).__name__, str(e))))
    except BaseException:  # a bug (or an error while building the spec): keep the traceback
        _report(fd, ("bug", lane, traceback.format_exc()))


def _send_all(conns: list[Connection[Any, Any]], payload: bytes) -> None:
    """Send `payload` to each connection, through a duplicate of its handle: close() may close the
    connection meanwhile, and this thread must never write to a handle number reused since."""
    for conn in conns:
        try:
            with Connection(os.dup(conn.fileno()), readable=False) as own:
                own.send_bytes(payload)
        except OSError:  # that worker is gone (its pipe says why at the first receive) or the group closed
            pass


def _report(fd: int, message: object) -> None:
    try:
        channel.send(fd, message)
    except OSError:  # the consumer is gone: nobody to tell
        pass


def _exit_with_parent(parent_pid: int, arm_pdeathsig: bool) -> None:
    """Make this worker exit when the process that started it dies, however it dies."""
    if arm_pdeathsig and sys.platform.startswith("linux"):
        try:  # the kernel kills us the moment the parent dies, even if we are stuck in C code
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    # Everywhere (and when the signal is not armed): notice the re-parenting within a poll.
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="zephon-parent-watch", daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_POLL_SECONDS / 2)
    os._exit(1)


class StopFlag:
    """A stop flag shared by the consumer and its workers, without a lock.

    A multiprocessing Event is a lock and a condition: a worker killed (SIGKILL, the OOM killer) while
    it checks the event leaves the lock held, and every other worker then blocks forever in
    `is_set()`. One shared byte, read and written without a lock, cannot be left held."""

    def __init__(self, ctx: Any):
        self._value = ctx.RawValue(ctypes.c_bool, False)

    def set(self) -> None:
        self._value.value = True

    def is_set(self) -> bool:
        return bool(self._value.value)


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
        except _Closing:
            pass
        except BaseException as e:  # every failure is the consumer's to raise, in order
            if open_():
                self._put(("error", e))

    def _put(self, item: tuple[str, Any]) -> None:
        while not self._closing.is_set():
            try:
                self._steps.put(item, timeout=_COLLECT_POLL_SECONDS)
                return
            except queue.Full:
                continue

    def next_step(self) -> list[list[tuple[Row, LaneState]]]:
        while self._failure is None:
            try:
                kind, value = self._steps.get(timeout=_POLL_SECONDS)
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
        self._starts: list[Connection[Any, Any]] = []
        workers = min(num_workers, len(self.lane_ids))
        self._worker_of = {lane: i % workers for i, lane in enumerate(self.lane_ids)}
        ctx = mp.get_context("spawn")
        self._stop = StopFlag(ctx)
        self._readers, self._inboxes, self._credits, self._procs = [], [], [], []
        # PR_SET_PDEATHSIG fires when the *thread* that started the child exits, so it is armed only
        # for groups started on the main thread; elsewhere the worker's parent-pid watcher does it.
        arm_pdeathsig = threading.current_thread() is threading.main_thread()
        # The spec (tokenizer.json included, megabytes) goes through the start pipe once every process is
        # started: as a Process argument, each start would wait until that child had imported its modules
        # and read it, and the workers would start one after another.
        spec_bytes = pickle.dumps(portable(spec), protocol=pickle.HIGHEST_PROTOCOL)
        threads = default_threads(workers)
        for w in range(workers):
            mine = self._lanes_of(w)
            reader, writer = ctx.Pipe(duplex=False)
            channel.widen(reader.fileno(), step_bytes(spec.seq_len, len(mine) * rows_per_step))
            start_reader, start_writer = ctx.Pipe(duplex=False)
            credits = ctx.Semaphore(prefetch_factor * len(mine))
            proc = ctx.Process(
                target=_worker_main,
                args=(
                    mine,
                    start_reader,
                    rows_per_step,
                    writer,
                    credits,
                    self._stop,
                    os.getpid(),
                    arm_pdeathsig,
                    threads,
                ),
                name=f"zephon-lanes-{w}",
                daemon=True,
            )
            with _main_module_hidden():
                proc.start()
            writer.close()  # the worker holds the only write end: its death is end of file here
            start_reader.close()
            self._starts.append(start_writer)
            self._readers.append(reader)
            self._inboxes.append(channel.Inbox(reader.fileno()))
            self._credits.append(credits)
            self._procs.append(proc)
        lanes_of = {w: self._lanes_of(w) for w in range(workers)}
        self._backends: dict[int, tuple[str, str]] = {}  # worker -> (backend, why), from its first message
        receive = _receiver(self._worker_of, self._inboxes, self._credits, self._procs, lanes_of, self._backends)
        self._collector = StepCollector(self.lane_ids, receive)
        self._finalizer = weakref.finalize(
            self, _shutdown, self._collector, self._stop, self._readers + self._starts, self._procs
        )
        # Sent from a thread: a child reads it only once its interpreter is up (~0.3 s), and the
        # constructor returns at once (the trainer builds its model meanwhile). start() sends after it.
        self._spec_sent = threading.Thread(
            target=_send_all, args=(self._starts, spec_bytes), name="zephon-spec-send", daemon=True
        )
        self._spec_sent.start()
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
        self._spec_sent.join()
        for w, conn in enumerate(self._starts):
            try:
                conn.send(({lane: states[lane] for lane in self._lanes_of(w) if lane in states}, first_step))
            except OSError:  # the worker is gone: its pipe says why at the first receive
                pass
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


class _Closing(Exception):
    """The group is closing: the receiving thread stops without a word."""


def _receiver(
    worker_of: dict[int, int],
    inboxes: list[channel.Inbox],
    credits: list[synchronize.Semaphore],
    procs: Sequence[BaseProcess],
    lanes_of: dict[int, list[int]],
    backends: dict[int, tuple[str, str]],
) -> Callable[[int, Callable[[], bool]], list[tuple[Row, LaneState]]]:
    """`receive(lane, open_)`: the lane's next rows from its worker's pipe (for StepCollector; it holds
    these parts, never the group). A worker's first message, its tokenizer backend, goes to `backends`."""

    def receive(lane: int, open_: Callable[[], bool]) -> list[tuple[Row, LaneState]]:
        w = worker_of[lane]
        proc = procs[w]

        def alive() -> bool:
            return open_() and proc.is_alive()

        try:
            kind, got_lane, payload = inboxes[w].receive(alive, _COLLECT_POLL_SECONDS)
            if kind == "backend":  # sent once, before any rows (and outside the credits)
                backends[w] = payload
                kind, got_lane, payload = inboxes[w].receive(alive, _COLLECT_POLL_SECONDS)
        except EOFError:
            if not open_():
                raise _Closing from None
            proc.join(timeout=5)  # it closed its pipe by exiting: collect the exit code
            raise DataError(
                f"loader worker {w} (lanes {lanes_of[w]}) died with exit code {proc.exitcode} "
                "(killed? out of memory?); restart from the last checkpoint, or set [dataloader] num_workers = 0 to debug"
            ) from None
        credits[w].release()
        if kind == "error":
            name, text = payload
            cls = getattr(errors, name, None)
            cls = cls if isinstance(cls, type) and issubclass(cls, ZephonError) else DataError
            where = f"lane {got_lane}" if got_lane is not None else f"lanes {lanes_of[w]}"
            raise cls(f"{text} (in loader worker {w}, {where})") from None
        if kind == "bug":
            raise RuntimeError(f"loader worker {w} (lanes {lanes_of[w]}) failed:\n{payload}")
        if got_lane != lane:
            raise RuntimeError(f"loader worker {w} sent lane {got_lane}, expected lane {lane}")
        if kind == "exhausted":
            raise LaneExhausted
        rows: list[tuple[Row, LaneState]] = payload  # a "rows" message (unpickled: not checked)
        return rows

    return receive


def _shutdown(
    collector: StepCollector, stop: StopFlag, readers: Iterable[Connection[Any, Any]], procs: Iterable[BaseProcess]
) -> None:
    stop.set()
    collector.stop()  # before the pipes it reads are closed
    for reader in readers:  # a worker blocked writing to a full pipe gets BrokenPipeError and exits
        reader.close()
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
