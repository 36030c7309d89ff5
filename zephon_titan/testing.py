"""Checks for authors of formats, packers and transforms (no torch): a new component keeps the loader's promises.

- `assert_restores_exactly`: a lane restored from its JSON state continues with exactly the rows of the
  uninterrupted lane, at every cut point given (the model: Grain's `assert_equal_output_after_checkpoint`,
  torchdata's `run_test_save_load_state`).
- `assert_same_rows_for_any_layout`: the global batch of each step is the same bytes whatever number of ranks W
  (dividing the lanes) produce it, each stepping its own lanes.
- `assert_each_document_once`: over one epoch (`exhaustion = "redistribute"`), the rows of all lanes hold every
  document of every source exactly once: each document, by its (file, row) identity, is tiled by its pieces with
  no gap, overlap or repeat.

Both take an `EngineSpec` (`spec_from_table`, or `zephon_titan.engine.build_engine`) over a small corpus in the
component's format or with its `packing`; a format author::

    from zephon_titan.testing import assert_each_document_once, assert_restores_exactly, spec_from_table

    register_format(MY_FORMAT)
    table = {"num_lanes": 4, "seed": 1, "tokenizer_path": "tok/", "sources": {"mine": {"paths": ["data/*.txt"]}}}
    assert_restores_exactly(spec_from_table(table), lane=0, cut_points=[0, 1, 5, 17])
    assert_each_document_once(spec_from_table({**table, "exhaustion": "redistribute"}))

Each failure is an AssertionError that names the lane and cut point, or the document (source, file, row).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from zephon_titan.config import DataConfig, config_from_dict
from zephon_titan.engine.feed import Document
from zephon_titan.engine.lanes import LaneGroup, lanes_of_rank, valid_world_sizes
from zephon_titan.engine.rows import Row, RowShape
from zephon_titan.engine.spec import EngineSpec, build_engine
from zephon_titan.engine.state import LaneState
from zephon_titan.engine.stream import LaneStream, StepClock
from zephon_titan.errors import LaneExhausted
from zephon_titan.titan.tokenizer import load_tokenizer

__all__ = [
    "assert_each_document_once",
    "assert_restores_exactly",
    "assert_same_rows_for_any_layout",
    "drain",
    "epoch_rows",
    "global_batches",
    "spec_from_table",
]

SpecOrFactory = EngineSpec | Callable[[], EngineSpec]


def spec_from_table(table: dict[str, object] | DataConfig, seq_len: int = 64) -> EngineSpec:
    """The engine spec of a `[dataloader]` table (a dict as in a job file, or a DataConfig) whose `tokenizer_path` is
    set: the tokenizer loaded as every entry point loads it."""
    config = table if isinstance(table, DataConfig) else config_from_dict(table)
    if not config.tokenizer_path:
        raise ValueError("set tokenizer_path in the table: a spec needs a tokenizer")
    tokenizer = load_tokenizer(config.tokenizer_path, config.add_bos, config.add_eos, backend=config.tokenizer_backend)
    return build_engine(config, seq_len, tokenizer)


def drain(stream: LaneStream) -> list[Row]:
    """Every row left in a finite lane stream (`exhaustion = "redistribute"`), up to its LaneExhausted."""
    rows = []
    try:
        while True:
            rows.append(stream.next_row())
    except LaneExhausted:
        return rows


def epoch_rows(spec: EngineSpec) -> list[Row]:
    """Every row of every lane of a finite spec (one epoch), lane by lane to exhaustion."""
    if spec.repeat:
        raise ValueError('an epoch needs a finite spec: set [dataloader] exhaustion = "redistribute"')
    return [row for lane in range(spec.num_lanes) for row in drain(LaneStream(spec, lane))]


def _take(stream: LaneStream, n: int) -> list[Row]:
    """Up to n rows (fewer at the end of a finite lane)."""
    rows = []
    try:
        for _ in range(n):
            rows.append(stream.next_row())
    except LaneExhausted:
        pass
    return rows


def assert_restores_exactly(
    spec: SpecOrFactory, lane: int, cut_points: Iterable[int], rows: int = 4, rows_per_step: int | None = None
) -> None:
    """For each cut point k: the lane's state after k rows, through `json.dumps`/`json.loads`, restores a fresh
    LaneStream whose next `rows` rows (and state after them) equal those of the uninterrupted lane.

    `spec`: an EngineSpec, or a function returning a new one per call (each restore then builds its own engine:
    fresh sources and tokenizer objects). `rows_per_step`: the rows of the lane per step, needed (and only used)
    under a mixture schedule or an exclusion, whose rows depend on their step.
    """
    factory = spec if callable(spec) else (lambda: spec)
    cuts = sorted(set(cut_points))
    if not cuts or cuts[0] < 0:
        raise ValueError(f"cut_points must be rows >= 0, got {cuts}")

    def stream(state: LaneState | None) -> LaneStream:
        s = factory()
        stepped = s.schedule.scheduled or s.exclusion is not None
        clock = StepClock(rows_per_step or 1) if stepped or rows_per_step else None
        return LaneStream(s, lane, state, clock)

    reference = stream(None)
    states, expected = [reference.state()], []  # states[k]: the state after k rows
    for _ in range(cuts[-1] + rows):
        try:
            expected.append(reference.next_row())
        except LaneExhausted:
            break
        states.append(reference.state())
    for cut in cuts:
        if cut >= len(states):
            raise AssertionError(f"lane {lane}: cut {cut} is past the lane's end ({len(expected)} rows)")
        where = f"lane {lane}, cut point {cut}"
        saved = json.loads(json.dumps(states[cut].to_dict()))
        try:
            restored = stream(LaneState.from_dict(saved))
            got = _take(restored, rows)
        except Exception as e:
            raise AssertionError(f"{where}: the saved state does not restore: {type(e).__name__}: {e}") from e
        want = expected[cut : cut + rows]
        for i, (a, b) in enumerate(zip(got, want)):
            if a.to_bytes() != b.to_bytes():
                raise AssertionError(
                    f"{where}: the first differing row is row {cut + i} ({i} after the cut): restored, the lane gives "
                    "another row than uninterrupted"
                )
            if a.documents != b.documents:  # what the feed did with documents, counted per row (document_counts.py)
                raise AssertionError(
                    f"{where}: row {cut + i} ({i} after the cut) counts its documents {a.documents} restored, "
                    f"{b.documents} uninterrupted"
                )
        if len(got) != len(want):
            raise AssertionError(f"{where}: {len(got)} rows follow, the uninterrupted lane has {len(want)}")
        after = states[cut + len(want)]
        if restored.state() != after:
            raise AssertionError(
                f"{where}: the state after {len(want)} more rows differs: {restored.state()} != {after}"
            )


def _listed(items: Sequence[object], most: int = 6) -> str:
    return ", ".join(map(str, items[:most])) + (f" and {len(items) - most} more" if len(items) > most else "")


def assert_each_document_once(spec: EngineSpec, rows: Iterable[Row] | None = None) -> int:
    """The pieces of `rows` (default: `epoch_rows(spec)`, every lane to its end) hold every document of every source
    of `spec` exactly once: its tokens, or its (input, label) pairs under labels = "document", each in one row.
    Documents are told apart by (file, row) as the source reads them. Returns the number of documents."""
    if rows is None:
        rows = epoch_rows(spec)
    shape = RowShape.of(spec)
    spans: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        for piece in row.pieces:
            spans[(piece.file, piece.row)].append((piece.doc_offset, piece.length))
    expected: dict[tuple[str, int], tuple[str, int]] = {}  # (file, row) -> (source name, slots)
    for source in spec.sources:
        for b in range(source.num_blocks):
            block = source.read_block(b)
            for row_id, tokens in zip(block.rows, spec.tokenizer.encode(block.texts)):
                slots = shape.piece_slots(Document(0, tokens, block.file, row_id, 0, len(tokens)))
                if slots:  # a document with no (input, label) pair is in no row
                    expected[(block.file, row_id)] = (source.name, slots)

    def named(keys: Sequence[tuple[str, int]]) -> str:
        def one(key: tuple[str, int]) -> str:
            return f"{key[0]} row {key[1]}" + (f" (source {expected[key][0]!r})" if key in expected else "")

        return _listed([one(key) for key in keys[:3]] + [""] * len(keys[3:]), most=3)

    missing = sorted(set(expected) - set(spans))
    if missing:
        raise AssertionError(f"{len(missing)} document(s) in no row: {named(missing)}")
    unknown = sorted(set(spans) - set(expected))
    if unknown:
        raise AssertionError(f"{len(unknown)} document(s) in the rows that no source reads: {named(unknown)}")
    for key, pieces in sorted(spans.items()):
        at = 0
        for offset, length in sorted(pieces):
            if offset < at:
                raise AssertionError(
                    f"document {named([key])}: tokens {offset}-{min(at, offset + length)} are repeated (pieces at (offset, length): "
                    f"{_listed(sorted(pieces))})"
                )
            if offset > at:
                raise AssertionError(
                    f"document {named([key])}: tokens {at}-{offset} are in no row (pieces at (offset, length): {_listed(sorted(pieces))})"
                )
            at += length
        slots = expected[key][1]
        if at != slots:
            what = f"its tokens {at}-{slots} are in no row" if at < slots else f"its pieces run to {at}, past its end"
            raise AssertionError(f"document {named([key])} of {slots} tokens: {what}")
    return len(expected)


def global_batches(spec: EngineSpec, world_size: int, rows_per_lane: int = 2, steps: int = 4) -> list[list[bytes]]:
    """Per step, the rows of the global batch (`Row.to_bytes()`) as `world_size` ranks produce them, each stepping its
    own lanes (`lanes_of_rank`) in one LaneGroup, concatenated in rank order."""
    groups = [
        LaneGroup(spec, lanes_of_rank(spec.num_lanes, world_size, rank), rows_per_lane) for rank in range(world_size)
    ]
    return [[row.to_bytes() for g in groups for rows in g.next_step() for row in rows] for _ in range(steps)]


def assert_same_rows_for_any_layout(
    spec: EngineSpec, world_sizes: Iterable[int] | None = None, rows_per_lane: int = 2, steps: int = 4
) -> None:
    """Each step's global batch is the same for every W in `world_sizes` (default: every divisor of the lanes) as for
    one rank: rows belong to lanes, never to the ranks that produce them."""
    reference = global_batches(spec, 1, rows_per_lane, steps)
    sizes = [w for w in valid_world_sizes(spec.num_lanes) if w > 1] if world_sizes is None else world_sizes
    for w in sizes:
        for step, (got, want) in enumerate(zip(global_batches(spec, w, rows_per_lane, steps), reference), start=1):
            if got != want:
                i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                raise AssertionError(
                    f"W={w}: step {step}'s global batch differs from one rank's at row {i} "
                    f"(lane {i // rows_per_lane}, its row {i % rows_per_lane} of the step)"
                )
