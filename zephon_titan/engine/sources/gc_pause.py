"""The garbage collector paused while a source's records are made in bulk (an index's 100,000 files).

Every 700 new containers (lists, tuples, FileBlocks) start a collection, and the older generations' collections
scan the whole heap: in a trainer's process (torch's modules, hundreds of thousands of objects) that was half the
CPU of a startup from an index, for objects that are all kept and never cyclic garbage. A pause changes no
result, only when the collector runs: it resumes at the end of the outermost pause, and only if it ran before
(a trainer that manages the collector itself, as TorchTitan can, keeps it off).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()
_paused = [0, False]  # [pauses open now (threads may nest them), whether the collector ran before the first]


@contextmanager
def gc_paused() -> Iterator[None]:
    with _LOCK:
        if _paused[0] == 0:
            _paused[1] = gc.isenabled()
            gc.disable()
        _paused[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _paused[0] -= 1
            if _paused[0] == 0 and _paused[1]:
                gc.enable()
