"""engine/channel.py: messages arrive whole and in order, however the pipe cuts them, and a writer that
dies halfway through a message is end of file, never a hang."""

from __future__ import annotations

import os
import pickle
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.engine import channel


def _pipe(needed: int = 1 << 20) -> tuple[int, int]:
    reader, writer = os.pipe()
    channel.widen(reader, needed)
    return reader, writer


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 300_000), min_size=1, max_size=12), seed=st.integers(0, 2**32 - 1))
def test_messages_arrive_whole_and_in_order(sizes, seed):
    rng = np.random.default_rng(seed)
    messages = [("rows", i, rng.integers(0, 2**31, size // 4, dtype=np.int32)) for i, size in enumerate(sizes)]
    reader, writer = _pipe()
    sender = threading.Thread(target=lambda: [channel.send(writer, m) for m in messages])
    sender.start()
    try:
        inbox = channel.Inbox(reader)
        # All received first: a message must not share memory with the buffer that later reads reuse.
        received = [inbox.receive(lambda: True, 0.05) for _ in messages]
        for (kind, i, array), (got_kind, got_i, got_array) in zip(messages, received):
            assert (got_kind, got_i) == (kind, i)
            np.testing.assert_array_equal(got_array, array)
    finally:
        sender.join()
        os.close(reader)
        os.close(writer)


def test_a_message_cut_short_is_end_of_file():
    reader, writer = _pipe()
    whole = pickle.dumps(("rows", 0, b"x" * 1000))
    channel.send(writer, ("rows", 1, b"first"))
    os.write(writer, channel._HEADER.pack(len(whole)) + whole[:500])  # the writer dies here
    os.close(writer)
    inbox = channel.Inbox(reader)
    assert inbox.receive(lambda: True, 0.05) == ("rows", 1, b"first")  # what arrived whole still comes
    with pytest.raises(EOFError):
        inbox.receive(lambda: True, 0.05)
    os.close(reader)


def test_a_dead_writer_is_noticed_while_the_pipe_stays_open():
    reader, writer = _pipe()  # the write end stays open (another process could hold it): only the check tells
    with pytest.raises(EOFError):
        channel.Inbox(reader).receive(lambda: False, 0.01)
    os.close(reader)
    os.close(writer)


def _pipe_size(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, getattr(fcntl, "F_GETPIPE_SZ", 1032))


@pytest.mark.parametrize("lanes", [1, 2, 8, 32, 64])
def test_a_pipe_holds_a_step_of_rows_and_no_more_than_it_needs(lanes):
    """Sized to a worker's step at seq_len 2048 (pipe sizes are powers of two pages), within the
    system's maximum; pipe buffers count against a per-user limit, so a small step keeps the default."""
    from zephon_titan.engine.workers import step_bytes

    needed = step_bytes(2048, lanes)
    reader, writer = _pipe(needed)
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            limit = min(int(f.read()), 1 << 20)
        size = _pipe_size(reader)
        assert size >= min(needed, limit) and size <= max(2 * needed, 1 << 16)
    finally:
        os.close(reader)
        os.close(writer)
