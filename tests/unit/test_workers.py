"""Worker processes: a pure performance knob, consumer-side state, clean shutdown, clear failures."""

import gc
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import data_table, make_spec, rows_digest

from zephon_titan.engine import DataError, LaneStream, open_lane_group


def test_state_is_the_consumers_not_the_prefetchers(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir)
    with open_lane_group(spec, range(8), 2, num_workers=2, prefetch_factor=3) as group:
        group.next_step()
        time.sleep(1.0)  # let the workers run ahead
        states = group.state()
        assert {s.rows for s in states.values()} == {2}
        expected = {lane: LaneStream(spec, lane) for lane in range(8)}
        for lane, stream in expected.items():
            stream.take(2)
            assert states[lane] == stream.state()


def test_restart_from_consumed_state_continues_exactly(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir)
    with open_lane_group(spec, range(8), 2, num_workers=0) as reference:
        steps = [reference.next_step() for _ in range(4)]
    with open_lane_group(spec, range(8), 2, num_workers=2, prefetch_factor=2) as first:
        first.next_step(), first.next_step()
        saved = first.state()
    with open_lane_group(spec, range(8), 2, num_workers=3, states=saved) as second:
        resumed = [second.next_step() for _ in range(2)]
    for got, want in zip(resumed, steps[2:]):
        assert [rows_digest(r) for r in got] == [rows_digest(r) for r in want]


def _receiving_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "zephon-receive"]


def test_close_leaves_no_process(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir)
    group = open_lane_group(spec, range(8), 2, num_workers=2, prefetch_factor=1)
    group.next_step()  # workers now block on their full queues, the receiving thread on its full one
    group.close()
    assert not mp.active_children()
    assert not _receiving_threads()


def test_the_next_step_is_received_while_the_consumer_computes(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir)
    with open_lane_group(spec, range(8), 2, num_workers=2) as group:
        group.next_step()
        deadline = time.time() + 60
        while group._collector._steps.qsize() == 0 and time.time() < deadline:
            time.sleep(0.01)  # the trainer's step
        assert group._collector._steps.qsize() == 1  # taken from the pipes already, ready when asked for
        assert {s.rows for s in group.state().values()} == {2}  # and not counted as consumed


def test_a_group_nobody_closes_is_collected_with_its_workers(corpus_dir, tokenizer_dir):
    # The receiving thread must not keep its group alive: a trainer that drops its loader still stops them.
    spec = make_spec(corpus_dir, tokenizer_dir)
    group = open_lane_group(spec, range(8), 2, num_workers=2, prefetch_factor=1)
    procs = list(group._procs)
    group.next_step()
    del group
    gc.collect()
    for proc in procs:
        proc.join(timeout=30)
    assert all(p.exitcode is not None for p in procs)
    assert not _receiving_threads()


def test_a_group_closed_before_its_workers_have_started_leaves_no_process(corpus_dir, tokenizer_dir):
    # The spec is still being sent to the booting workers when the group closes (a trainer that
    # fails while building its model): they exit, nothing hangs, nothing is left.
    spec = make_spec(corpus_dir, tokenizer_dir)
    group = open_lane_group(spec, range(8), 2, num_workers=3, deferred=True)
    procs = list(group._procs)
    group.close()
    assert not mp.active_children()
    assert all(p.exitcode is not None for p in procs)


def test_a_killed_worker_is_a_clear_error_not_a_hang(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir)
    with open_lane_group(spec, range(8), 2, num_workers=2, prefetch_factor=1) as group:
        group.next_step()
        victim = group._procs[1]
        os.kill(victim.pid, signal.SIGKILL)  # not joined here: the group's receiving thread reaps it
        with pytest.raises(DataError, match=r"loader worker 1 \(lanes \[1, 3, 5, 7\]\) died with exit code -9"):
            for _ in range(5):  # steps already queued drain first
                group.next_step()


def test_an_error_inside_a_worker_reaches_the_consumer(tmp_path, corpus_dir, tokenizer_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken}\n')
    sources = {"bad": {"paths": [str(bad)]}}
    spec = make_spec(corpus_dir, tokenizer_dir, sources=sources, num_lanes=2)
    with open_lane_group(spec, range(2), 2, num_workers=2) as group:
        with pytest.raises(DataError, match=r"bad.jsonl line 2 \(at byte 17\): line is not valid JSON"):
            group.next_step()
        with pytest.raises(DataError, match=r"bad.jsonl line 2"):  # the same error again, never a hang
            group.next_step()


_ABANDON = """
import json, sys
sys.path.insert(0, {tests!r})
from zephon_titan.config import config_from_dict
from zephon_titan.engine import open_lane_group
from helpers import spec_of
spec = spec_of(config_from_dict(json.loads({table!r})), 64)
group = open_lane_group(spec, range(8), 2, num_workers=2, prefetch_factor=1)
group.next_step()
print("stopping early without close()", flush=True)
"""


def test_stopping_early_does_not_hang(corpus_dir, tokenizer_dir):
    import json

    code = _ABANDON.format(
        tests=os.path.dirname(os.path.dirname(__file__)), table=json.dumps(data_table(corpus_dir, tokenizer_dir))
    )
    started = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "stopping early" in out.stdout and time.time() - started < 30


def _spin(flag):
    while not flag.is_set():
        pass


def _read_and_set(flag):
    flag.is_set()
    flag.set()


def test_a_worker_killed_while_reading_the_stop_flag_blocks_no_one():
    # A multiprocessing.Event is a lock: a worker SIGKILLed inside is_set() left it held, and the other
    # workers then hung in is_set() (seen once in CI). The stop flag is one lock-free shared byte.
    import threading

    from zephon_titan.engine.process_pool import StopFlag

    ctx = mp.get_context("spawn")
    for _ in range(3):
        flag = StopFlag(ctx)
        spinner = ctx.Process(target=_spin, args=(flag,), daemon=True)
        spinner.start()
        time.sleep(0.2)  # it is reading the flag in a tight loop
        os.kill(spinner.pid, signal.SIGKILL)
        spinner.join(timeout=10)
        checker = threading.Thread(target=_read_and_set, args=(flag,), daemon=True)
        checker.start()
        checker.join(timeout=5)
        assert not checker.is_alive(), "the stop flag blocked after a reader was killed"
        assert flag.is_set()
