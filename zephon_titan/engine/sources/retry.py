"""Transient faults of object storage, retried: a block read that fails with what the provider defines as
retryable (S3's 503 SlowDown and 500 InternalError, GCS's and Azure's 429/5xx and ServerBusy, a connection reset,
a timeout, a body cut short, which a Parquet reader meets as a row group it cannot read) is read again after a bounded exponential backoff with jitter, each attempt logged.
A retried read is the same bytes: after it succeeds, the object's size and last-modified time must still be
the ones listed, else one line says it was replaced. Anything else (a missing key, a refused credential, a
changed file) is raised at once, and a transient fault that outlasts the attempts ends in one line.

The client libraries retry too (pyarrow's S3 client up to 3 attempts by default); these attempts come on top,
at the block, so a burst of throttling or a reset that outlasts the client's own retries costs seconds, not the
run. Which bytes a block holds never depends on how many attempts it took."""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from typing import TypeVar

from zephon_titan.engine.sources.clouds import one_line
from zephon_titan.errors import DataError

log = logging.getLogger("zephon_titan")
T = TypeVar("T")

ATTEMPTS = 6
FIRST_DELAY_S = 0.25
MAX_DELAY_S = 4.0
# What providers define as retryable, as pyarrow's clients word it (AWS SDK error names and HTTP statuses,
# curl's errors, Azure's ServerBusy, Google's UNAVAILABLE and DEADLINE_EXCEEDED: its client's own retries ran out of
# time, as they do on a loaded machine), and a body shorter than the range asked for.
_TRANSIENT = re.compile(
    r"SLOW_?DOWN|SERVICE_UNAVAILABLE|Service ?Unavailable|INTERNAL_FAILURE|InternalError|THROTTL|TooManyRequests"
    r"|REQUEST_TIMEOUT|RequestTimeout|NETWORK_CONNECTION|CURLE? ?(?:code|error)|\bUNAVAILABLE:|\bDEADLINE_EXCEEDED:|Connection reset|reset by peer|Broken pipe"
    r"|ServerBusy|timed out|HTTP (?:response )?(?:code|status)[: ]+(?:408|429|5\d\d)|\b(?:429|500|502|503|504)\b"
    r"|is cut short|returned [\d,]+ bytes|cannot read row group",
    re.IGNORECASE,
)


def transient(error: BaseException) -> bool:
    """Whether a read error is one a provider defines as retryable (the same request may succeed)."""
    return isinstance(error, (OSError, DataError)) and bool(_TRANSIENT.search(str(error)))


def backoff(attempt: int, rng: random.Random) -> float:
    """Seconds before attempt `attempt + 1`: exponential, capped, with half of it random (equal jitter), so that
    ranks throttled together do not come back together."""
    ceiling = min(MAX_DELAY_S, FIRST_DELAY_S * 2.0 ** (attempt - 1))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def read_with_retries(read: Callable[[], T], where: str, same_object: Callable[[], None]) -> T:
    """`read()`, attempted up to ATTEMPTS times while it fails transiently; `same_object()` (raising DataError)
    checks, after a read that needed more than one attempt, that the object is still the one listed."""
    rng = random.Random()
    waited = 0.0
    for attempt in range(1, ATTEMPTS + 1):
        try:
            result = read()
        except (OSError, DataError) as e:
            if not transient(e):
                raise
            if attempt == ATTEMPTS:
                raise DataError(
                    f"{one_line(e)} (gave up after {ATTEMPTS} attempts over {waited:.1f} s: the storage keeps "
                    "failing, or the object is damaged; check the storage's status and the object, or lower the "
                    "request rate: fewer ranks or lanes reading at once)"
                ) from None
            wait = backoff(attempt, rng)
            log.warning(
                f"zephon_titan: {where}: {one_line(e)}; attempt {attempt} of {ATTEMPTS} failed, retrying in {wait:.2f} s"
            )
            time.sleep(wait)
            waited += wait
            continue
        if attempt > 1:
            same_object()
        return result
    raise AssertionError("unreachable")
