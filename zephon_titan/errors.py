"""Errors for humans: each says what is wrong, where, and how to fix it."""


class ZephonError(Exception):
    """Base class of every error zephon_titan raises on purpose."""


class ConfigError(ZephonError):
    """The configuration is invalid (unknown key, bad value, missing file)."""


class DataError(ZephonError):
    """A data file cannot be read as configured (names the file and row)."""


class ResumeError(ZephonError):
    """A checkpoint cannot be restored into this run (names what changed)."""


class LaneExhausted(Exception):
    """A lane has no more rows: every source is used up under a non-repeating policy.

    Not a ZephonError: it is the normal end of a finite stream, like StopIteration
    (which cannot be raised through generators, PEP 479).
    """
