"""Progress bars only where someone watches them: tqdm draws a bar when its output (standard error unless
`file=` says otherwise) is a terminal, and nothing when it goes to a log file or a pipe, where redrawn bars
are only noise.

    from zephon_titan.progress import tqdm   # instead of `from tqdm import tqdm`; the same arguments
"""

from __future__ import annotations

import sys
from typing import Any


def on_terminal(stream: Any) -> bool:
    """Whether `stream` (None: standard error, tqdm's default) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def tqdm(*args: Any, disable: bool = False, **kwargs: Any) -> Any:
    """tqdm.tqdm, disabled unless its output is a terminal (and when `disable` is true)."""
    from tqdm import tqdm as bar

    return bar(*args, disable=disable or not on_terminal(kwargs.get("file")), **kwargs)
