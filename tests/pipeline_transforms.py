"""Transforms for the tests of `transform` (tests/unit/test_transforms.py): importable by name from every process
of a test (tests/ is on the path of the test process, its workers and the fresh process that checks them)."""

from __future__ import annotations

import itertools

_calls = itertools.count()


def drop_short(record: dict) -> str | None:
    """Drop documents under 300 characters; the rest stripped of surrounding whitespace."""
    text = record["text"]
    return None if len(text) < 300 else text.strip()


def tag_language(record: dict) -> dict:
    """A new record: the text with its language in front (from another column)."""
    return {**record, "text": f"[{record.get('lang') or 'xx'}] {record['text']}"}


def versioned(record: dict) -> str:
    return record["text"].lower()


versioned.version = "3"  # type: ignore[attr-defined]


def numbered(record: dict) -> str:
    """Not a function of its record: a counter across calls."""
    return f"{next(_calls)} {record['text']}"


def by_hash(record: dict) -> str | None:
    """Not a function of its record across processes: the string hash depends on PYTHONHASHSEED."""
    return record["text"] if hash(record["text"]) % 2 else None


def fails_on_long(record: dict) -> str:
    if len(record["text"]) > 3000:
        raise ValueError(f"too long: {len(record['text'])} characters")
    return record["text"]


def returns_a_number(record: dict) -> int:
    return len(record["text"])


def never_returns(record: dict) -> str:
    while True:
        pass


def exits(record: dict) -> str:
    raise SystemExit(3)


def short_words(record: dict) -> str | None:
    """Per record: drop documents of fewer than 40 words; the others with their word count in front."""
    words = record["text"].split()
    return None if len(words) < 40 else f"[{len(words)} words] {record['text']}"


def short_words_batched(records: list[dict]) -> list[str | None]:
    """short_words over a list of records (what a classifier called once per block would do)."""
    return [short_words(r) for r in records]


short_words_batched.batched = True  # type: ignore[attr-defined]


def batch_sized(records: list[dict]) -> list[str]:
    """Not a function of each record: the size of its call in every text."""
    return [f"{len(records)} {r['text']}" for r in records]


batch_sized.batched = True  # type: ignore[attr-defined]


def one_result(records: list[dict]) -> list[str]:
    """Returns one result for however many records."""
    return [records[0]["text"]]


one_result.batched = True  # type: ignore[attr-defined]


def drop_german(record: dict) -> str | None:
    """Drop documents in German; the others upper-cased."""
    return None if record.get("lang") == "de" else record["text"].upper()
