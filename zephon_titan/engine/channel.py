"""Length-prefixed messages over a one-way pipe, read so that a dead writer can never hang the reader.

multiprocessing's Queue and Connection.recv block until a whole message has arrived. A
worker killed halfway through writing a message larger than the pipe buffer (64 KiB on
Linux) leaves half a message in the pipe, and the reader then waits forever for the rest.
Here the reader only calls read() when select() says bytes are there (so read never
blocks), keeps partial messages in its own buffer, and between waits asks the caller
whether the writer is still alive. End of file or a dead writer before a whole message is
EOFError, at any message size.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import select
import struct
from collections.abc import Callable
from typing import Any

_HEADER = struct.Struct("!Q")  # payload length
_READ_BYTES = 1 << 20


_PIPE_MAX_BYTES = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size
_PIPE_DEFAULT_BYTES = 1 << 16


def widen(fd: int, needed: int) -> None:
    """Let the pipe hold `needed` bytes (at most 1 MiB; 64 KiB by default), so that a worker writes a
    whole step of rows ahead while the trainer computes and the consumer reads it at the step boundary
    in one go, instead of waiting while it trickles through 64 KiB at a time. Sized to the need, not to
    the maximum: pipe buffers count against a per-user limit (pipe-user-pages-soft, 64 MiB by default),
    past which the user's new pipes get one page. Best effort: where the system refuses, the pipe stays
    as it is, which is only slower."""
    if needed <= _PIPE_DEFAULT_BYTES:
        return
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), min(needed, _PIPE_MAX_BYTES))
    except OSError:
        pass


def send(fd: int, message: object) -> None:
    """Write one message (blocks while the pipe is full: that is the backpressure)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    for part in (_HEADER.pack(len(data)), data):
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view) :]


class Inbox:
    """The reading end of a pipe written with `send`."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = bytearray()
        self._start = 0  # where the next message begins in _buffer (consumed bytes are dropped per read)

    def receive(self, writer_alive: Callable[[], bool], poll_seconds: float) -> Any:
        """The next message (unpickled: whatever the writer sent). Messages already in the pipe are
        delivered even if the writer has died since; EOFError once it is gone (exited, killed, or
        closed its end) with no whole message left."""
        while True:
            if len(self._buffer) - self._start >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._buffer, self._start)
                begin, end = self._start + _HEADER.size, self._start + _HEADER.size + size
                if len(self._buffer) >= end:
                    with memoryview(self._buffer) as view:  # no copy of the message, no shifting of the rest
                        message = pickle.loads(view[begin:end])
                    self._start = end
                    return message
            del self._buffer[: self._start]  # once per read, not once per message
            self._start = 0
            ready, _, _ = select.select([self.fd], [], [], poll_seconds)
            if ready:
                chunk = os.read(self.fd, _READ_BYTES)
                if not chunk:
                    raise EOFError("the writer closed the pipe")
                self._buffer += chunk
            elif not writer_alive():  # someone else may hold the write end open: do not wait for EOF
                raise EOFError("the writer died")
