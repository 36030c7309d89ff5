"""Loader workers that die, fail or are orphaned: never a hang, never a stray process, one-line errors.

Real worker processes, killed with SIGKILL. Every wait is bounded (a thread joined with a
timeout, a subprocess with a timeout), and every process a test starts is killed at its end.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import termios
import time

import pytest
from bounded import run_bounded
from helpers import make_spec, rows_digest

from zephon_titan.engine import DataError, LaneStream, open_lane_group

F_GETPIPE_SZ = 1032  # linux/fcntl.h


def _pending(fd: int) -> int:
    """Bytes written to a pipe and not read yet."""
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)


def _settle(fd: int, seconds: float = 0.5, limit: float = 30) -> int:
    """Wait until the writer stops writing (blocked on a full pipe, or out of prefetch credit)."""
    last, since, deadline = -1, time.time(), time.time() + limit
    while time.time() < deadline:
        now = _pending(fd)
        if now != last:
            last, since = now, time.time()
        elif now and time.time() - since > seconds:
            return now
        time.sleep(0.05)
    raise AssertionError("the worker never wrote anything")


# (seq_len, rows per step): a message is about 12 * seq_len * rows bytes. Pipes are sized to a
# worker's step, at most 1 MiB (channel.widen): the first three fit; the last (1.5 MiB) cannot, so the
# kill lands halfway through writing it.
SIZES = [(64, 2), (4096, 4), (16384, 4), (32768, 4)]


@pytest.mark.parametrize("seq_len,rows", SIZES, ids=["1KiB", "192KiB", "768KiB", "1.5MiB"])
def test_a_worker_killed_while_writing_is_an_error_not_a_hang(corpus_dir, tokenizer_dir, seq_len, rows):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=seq_len)
    group = open_lane_group(spec, range(4), rows, num_workers=2, prefetch_factor=1)
    try:
        group.next_step()
        fd, victim = group._readers[1].fileno(), group._procs[1]
        pending = _settle(fd)
        if 12 * seq_len * rows > fcntl.fcntl(fd, F_GETPIPE_SZ):
            # Proof that the kill lands halfway through a message: the worker stopped writing with
            # less than one message in the pipe, so it is blocked on a full pipe mid-message.
            assert 0 < pending < 12 * seq_len * rows, pending
        os.kill(victim.pid, signal.SIGKILL)
        started = time.time()
        _, error = run_bounded(lambda: [group.next_step() for _ in range(5)], timeout=30)
        assert isinstance(error, DataError), error
        assert str(error).startswith("loader worker 1 (lanes [1, 3]) died with exit code -9")
        assert time.time() - started < 10
    finally:
        run_bounded(group.close, timeout=30)
    assert not victim.is_alive() and not group._procs[0].is_alive()


def test_large_messages_arrive_whole_and_in_order(corpus_dir, tokenizer_dir):
    """The negative control: the same sizes with no kill give the rows of the in-process stream."""
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=4096)
    with open_lane_group(spec, range(4), 4, num_workers=2, prefetch_factor=1) as group:
        got = [group.next_step() for _ in range(3)]
    streams = [LaneStream(spec, lane) for lane in range(4)]
    expected = [[s.take(4) for s in streams] for _ in range(3)]
    assert [[rows_digest(r) for r in step] for step in got] == [[rows_digest(r) for r in step] for step in expected]


def test_a_workers_error_arrives_as_its_one_line_with_the_lane(tmp_path, corpus_dir, tokenizer_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken}\n')
    spec = make_spec(corpus_dir, tokenizer_dir, sources={"bad": {"paths": [str(bad)]}}, num_lanes=2)
    with open_lane_group(spec, range(2), 2, num_workers=2) as group:
        with pytest.raises(DataError) as caught:
            group.next_step()
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    assert re.fullmatch(
        r"\S*bad\.jsonl line 2 \(at byte 17\): line is not valid JSON \(.*\); fix or remove it "
        r"\(in loader worker 0, lane 0\)",
        message,
    ), message


def test_a_bug_inside_a_worker_keeps_its_traceback(corpus_dir, tokenizer_dir):
    """Not a ZephonError (here: a state that is no LaneState): the worker's traceback is the useful part."""
    spec = make_spec(corpus_dir, tokenizer_dir)
    with open_lane_group(spec, range(2), 2, num_workers=2, states={0: "not a state", 1: "not a state"}) as group:
        with pytest.raises(RuntimeError, match=r"(?s)loader worker 0 \(lanes \[0\]\) failed:\nTraceback"):
            group.next_step()


_ORPHAN = """
import json, sys, threading, time
sys.path.insert(0, {tests!r})
from zephon_titan.engine import open_lane_group
from helpers import make_spec
spec = make_spec({corpus!r}, {tokenizer!r})
groups = []
def start():
    groups.append(open_lane_group(spec, range(8), 2, num_workers=2, prefetch_factor=1))
    groups[0].next_step()
if {in_thread!r}:
    thread = threading.Thread(target=start)  # a thread that exits once the group is started
    thread.start()
    thread.join()
else:
    start()
print(json.dumps([p.pid for p in groups[0]._procs]), flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """Exited (or a zombie waiting for a reaper: it runs no more code)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "other-thread"])
def test_workers_exit_when_their_parent_is_killed(corpus_dir, tokenizer_dir, in_thread):
    """main-thread: the parent-death signal; other-thread: the signal cannot be armed (it would fire when
    that thread exits), so the parent-pid watcher alone must do it."""
    code = _ORPHAN.format(
        tests=os.path.dirname(os.path.dirname(__file__)),
        in_thread=in_thread,
        corpus=corpus_dir,
        tokenizer=tokenizer_dir,
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = []
    try:
        line = run_bounded(parent.stdout.readline, timeout=60)[0]
        pids = json.loads(line)
        time.sleep(1.5)  # negative control: a live parent keeps its workers (also after its thread exited)
        assert not any(_gone(pid) for pid in pids)
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.time() + 10
        while not all(_gone(pid) for pid in pids) and time.time() < deadline:
            time.sleep(0.1)
        assert all(_gone(pid) for pid in pids), "workers outlived their parent"
    finally:
        parent.kill()
        parent.wait(timeout=10)
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
