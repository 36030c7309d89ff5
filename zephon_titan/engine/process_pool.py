"""The engine's child processes: started lean, gone with their parent, heard through pipes that cannot hang.

One pool for every use of processes: the loader's lane workers (workers.py) and `plan --procs N`
(lane_digests.py). A pool starts one child per entry of `args`, each running `target(child, job, *args)`:
`job` is what `send_jobs` sends it once every child has started (a spec carries a tokenizer, megabytes: as
a Process argument, each start would wait until that child had imported its modules and read it, and the
children would start one after another); `child` is its side of the pool (messages to the parent, further
messages from it, the stop flag, where it is working).

- Lean: children are started with `spawn` (safe beside CUDA and threads). A spawned child normally
  re-imports the parent's main module; under the trainer that is torch and torchtitan (~500 MB per child)
  for nothing. The main module is hidden while the children start, so they import the engine only (numpy,
  pyarrow, tokenizers). Each sizes its tokenizer thread pool so that children x threads fits the cores
  (tokenizer_backends.default_threads).
- Gone with their parent, however it dies (SIGKILL from the OOM killer included): a parent-death signal
  where Linux has one, and a watcher of the parent pid.
- One pipe protocol, that cannot hang: each child writes messages to its own one-way pipe
  (engine/channel.py), and the parent reads without ever blocking on a dead writer, asking between waits
  whether the child is alive and whether it is still listening; a child that dies, even halfway through
  writing a message of any size, is a one-line DataError naming it within about a second. A child waits
  for its parent's messages polling the stop flag, and exits at a closed pipe.
- Errors by class: a child's ZephonError (ConfigError, DataError, ResumeError...) is re-raised in the
  parent as the same class with its one line (the parent may say where); anything else (a bug) keeps its
  traceback.
- `close()` (also run at garbage collection and interpreter exit) sets the stop flag, closes the pipes (a
  child blocked writing gets BrokenPipeError and exits) and joins the children, killing those that linger.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import pickle
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
from zephon_titan.engine.tokenizer_backends import default_threads, limit_threads
from zephon_titan.errors import DataError, ZephonError

if TYPE_CHECKING:
    from multiprocessing.context import SpawnContext
    from multiprocessing.process import BaseProcess

POLL_SECONDS = 1.0  # how soon a child notices a stop, or its parent's death
RECEIVE_POLL_SECONDS = 0.05  # how soon the parent notices a dead child, or that it stopped listening
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

Message = tuple[str, Any, Any]
"""What a child sends: (kind, where, payload). The kinds "error" and "bug" are the pool's: `receive` raises them."""


def context() -> SpawnContext:
    """The context of the pool's children: make what they share (a Semaphore in `args`) with it."""
    return mp.get_context("spawn")


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start spawned children without re-importing the parent's __main__ (see the module docstring).

    multiprocessing records the main module to re-import when the child is started; an empty
    stand-in has neither a name nor a file to record. The children's code is in this package."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _exit_with_parent(parent_pid: int, arm_pdeathsig: bool) -> None:
    """Make this child exit when the process that started it dies, however it dies."""
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
        time.sleep(POLL_SECONDS / 2)
    os._exit(1)


class StopFlag:
    """A stop flag shared by the parent and its children, without a lock.

    A multiprocessing Event is a lock and a condition: a child killed (SIGKILL, the OOM killer) while
    it checks the event leaves the lock held, and every other child then blocks forever in
    `is_set()`. One shared byte, read and written without a lock, cannot be left held."""

    def __init__(self, ctx: Any):
        self._value = ctx.RawValue(ctypes.c_bool, False)

    def set(self) -> None:
        self._value.value = True

    def is_set(self) -> bool:
        return bool(self._value.value)


class Child:
    """A child's side of the pool, given to its target."""

    def __init__(self, inbox: Connection[Any, Any], fd: int, stop: StopFlag):
        self.where: Any = None  # what it is working on (a lane): sent with its error
        self._inbox, self._fd, self._stop = inbox, fd, stop

    def send(self, message: Message) -> None:
        """To the parent (blocks while the pipe is full: that is the backpressure; BrokenPipeError once the
        parent stopped listening, which ends the child quietly)."""
        channel.send(self._fd, message)

    def wait(self) -> Any:
        """The parent's next message (after the job); None once the pool stops or closes."""
        while not self._inbox.poll(POLL_SECONDS):
            if self._stop.is_set():
                return None
        try:
            return self._inbox.recv()
        except EOFError:  # the pool closed
            return None

    def stopped(self) -> bool:
        return self._stop.is_set()


def _child_main(
    target: Callable[..., None],
    inbox: Connection[Any, Any],
    writer: Connection[Any, Any],
    stop: StopFlag,
    parent_pid: int,
    arm_pdeathsig: bool,
    threads: int,
    args: tuple[Any, ...],
) -> None:
    _exit_with_parent(parent_pid, arm_pdeathsig)
    limit_threads(threads)
    child = Child(inbox, writer.fileno(), stop)
    failure: Message
    try:
        try:
            job = pickle.loads(inbox.recv_bytes())  # sent once every child has started
        except EOFError:  # the pool was closed before we were needed
            return
        target(child, job, *args)
        return
    except (BrokenPipeError, KeyboardInterrupt):  # the parent stopped listening, or Ctrl-C: it says why
        return
    except ZephonError as e:  # a bad file or setting: its one line is the whole story
        failure = ("error", child.where, (type(e).__name__, str(e)))
    except BaseException:  # a bug: keep the traceback
        failure = ("bug", child.where, traceback.format_exc())
    with contextlib.suppress(OSError):  # the parent is gone: nobody to tell
        child.send(failure)


class Closing(Exception):
    """`receive` found the pipe closed while its caller had stopped listening: end without a word."""


def _listening() -> bool:
    return True


class ProcessPool:
    """One child per entry of `args`, running `target(child, job, *args[i])`; see the module docstring.

    `names[i]` says child i in the parent's errors ("loader worker 1 (lanes [1, 3])"), `remedy` what to do
    when one dies; `locate(i, where)`, if given, is added to a child's error (where it was working);
    `pipe_bytes[i]` is how much child i's pipe should hold (channel.widen); at close, a child gets
    `grace_seconds` to exit before it is terminated."""

    def __init__(
        self,
        target: Callable[..., None],
        args: Sequence[tuple[Any, ...]],
        *,
        process_name: str,
        names: Sequence[str],
        remedy: str,
        locate: Callable[[int, Any], str] | None = None,
        pipe_bytes: Sequence[int] = (),
        grace_seconds: float = 5.0,
    ):
        ctx = context()
        self.names, self._remedy, self._locate = list(names), remedy, locate
        self.stop_flag = StopFlag(ctx)
        self.procs: list[BaseProcess] = []
        self.readers: list[Connection[Any, Any]] = []
        self._inboxes: list[channel.Inbox] = []
        self._starts: list[Connection[Any, Any]] = []
        self._sending: threading.Thread | None = None
        self._finalizer = weakref.finalize(
            self, _close, self.stop_flag, self.readers, self._starts, self.procs, grace_seconds
        )
        # PR_SET_PDEATHSIG fires when the *thread* that started the child exits, so it is armed only
        # for pools started on the main thread; elsewhere the child's parent-pid watcher does it.
        arm_pdeathsig = threading.current_thread() is threading.main_thread()
        threads = default_threads(len(args))
        for i, extra in enumerate(args):
            reader, writer = ctx.Pipe(duplex=False)
            if i < len(pipe_bytes):
                channel.widen(reader.fileno(), pipe_bytes[i])
            start_reader, start_writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_child_main,
                args=(target, start_reader, writer, self.stop_flag, os.getpid(), arm_pdeathsig, threads, extra),
                name=f"{process_name}-{i}",
                daemon=True,
            )
            with _main_module_hidden():
                proc.start()
            writer.close()  # the child holds the only write end: its death is end of file here
            start_reader.close()
            self._starts.append(start_writer)
            self.readers.append(reader)
            self._inboxes.append(channel.Inbox(reader.fileno()))
            self.procs.append(proc)

    def send_jobs(self, jobs: Sequence[bytes]) -> None:
        """Send each child its job (pickled), from a thread: a child reads it only once its interpreter is up
        (~0.3 s), and the caller goes on meanwhile."""
        self._sending = threading.Thread(
            target=_send_all, args=(self._starts, jobs), name="zephon-job-send", daemon=True
        )
        self._sending.start()

    def send(self, i: int, message: object) -> None:
        """A further message to child i (after its job), for `Child.wait`."""
        if self._sending is not None:
            self._sending.join()
        try:
            self._starts[i].send(message)
        except OSError:  # the child is gone: its pipe says why at the first receive
            pass

    def receive(self, i: int, listening: Callable[[], bool] = _listening) -> Message:
        """Child i's next message. Its error is raised as its class, with its line; its bug as a RuntimeError
        with its traceback; its death as a DataError; a closed pipe while not `listening()` as Closing."""
        proc = self.procs[i]

        def alive() -> bool:
            return listening() and proc.is_alive()

        try:
            kind, where, payload = self._inboxes[i].receive(alive, RECEIVE_POLL_SECONDS)
        except EOFError:
            if not listening():
                raise Closing from None
            proc.join(timeout=5)  # it closed its pipe by exiting: collect the exit code
            raise DataError(
                f"{self.names[i]} died with exit code {proc.exitcode} (killed? out of memory?); {self._remedy}"
            ) from None
        if kind == "error":
            name, text = payload
            cls = getattr(errors, name, None)
            cls = cls if isinstance(cls, type) and issubclass(cls, ZephonError) else DataError
            raise cls(text + (self._locate(i, where) if self._locate else "")) from None
        if kind == "bug":
            raise RuntimeError(f"{self.names[i]} failed:\n{payload}")
        return kind, where, payload

    def stop(self) -> None:
        """Tell the children to stop (close() does too)."""
        self.stop_flag.set()

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _send_all(conns: list[Connection[Any, Any]], payloads: Sequence[bytes]) -> None:
    """Send each payload to its connection, through a duplicate of its handle: close() may close the
    connection meanwhile, and this thread must never write to a handle number reused since."""
    for conn, payload in zip(conns, payloads):
        try:
            with Connection(os.dup(conn.fileno()), readable=False) as own:
                own.send_bytes(payload)
        except OSError:  # that child is gone (its pipe says why at the first receive) or the pool closed
            pass


def _close(
    stop: StopFlag,
    readers: Iterable[Connection[Any, Any]],
    starts: Iterable[Connection[Any, Any]],
    procs: Iterable[BaseProcess],
    grace_seconds: float,
) -> None:
    stop.set()
    for conn in [*readers, *starts]:  # a child blocked writing to a full pipe gets BrokenPipeError and exits
        conn.close()
    for proc in procs:
        proc.join(timeout=grace_seconds)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
