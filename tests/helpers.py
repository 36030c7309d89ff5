"""Test helpers: build engines from small configs, compare row streams."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal

from hypothesis import strategies as st

from zephon_titan.engine import LaneStream
from zephon_titan.engine.sources import formats
from zephon_titan.engine.sources.base import FileBlocks, Source
from zephon_titan.engine.sources.block_documents import BlockDocuments
from zephon_titan.testing import epoch_rows
from zephon_titan.testing import spec_from_table as spec_of


def data_table(corpus_dir: str, tokenizer_dir: str, **overrides) -> dict:
    """A `[dataloader]` table over the test corpus (prose JSONL + code Parquet)."""
    sources = (
        overrides.pop("sources")
        if "sources" in overrides
        else {
            "code": {"paths": [os.path.join(corpus_dir, "code", "*.parquet")], "weight": 0.4},
            "prose": {"paths": [os.path.join(corpus_dir, "prose", "*.jsonl")], "weight": 0.6, "block_bytes": 16384},
        }
    )
    table = {"num_lanes": 8, "seed": 7, "tokenizer_path": tokenizer_dir, "shuffle_window_blocks": 2, "sources": sources}
    table.update(overrides)
    return table


def make_spec(corpus_dir: str, tokenizer_dir: str, seq_len: int = 64, **overrides):
    return spec_of(data_table(corpus_dir, tokenizer_dir, **overrides), seq_len)


def rows_digest(rows) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(row.to_bytes())
    return h.hexdigest()


def drain_pieces(spec):
    """Every (piece, row) of every lane of a finite (redistribute) run, lane by lane to exhaustion."""
    return [(p, row) for row in epoch_rows(spec) for p in row.pieces]


# What a seq_len change is drawn over (at a resume: test_seq_len_change.py; in the job: test_seq_len_schedule.py):
# both packers (best_fit also as runs saved before per_step mixed), both label rules, longer and shorter rows.
SEQ_LEN_CHANGE = {
    "packing": st.sampled_from(["wrap", "best_fit", "best_fit/per_window"]),
    "labels": st.sampled_from(["document", "stream"]),
    "longer": st.booleans(),
}


def engine_checkpoint(spec, steps: int, rows: int = 2, fp=None, group=None) -> dict:
    """A checkpoint's loader entries after `steps` steps of `spec` (as a loader saves them); `group`: lanes of
    `spec` stepped already to the end of step `steps` (a resumed run's)."""
    from zephon_titan.engine import LaneGroup, fingerprint
    from zephon_titan.engine.resume import HEADER_VERSION, Header, LaneEntry
    from zephon_titan.loader.state import encode_state

    if group is None:
        group = LaneGroup(spec, range(spec.num_lanes), rows, None, 0)
        for _ in range(steps):
            group.next_step()
    lanes = {lane: LaneEntry(state, [0] * len(spec.sources), 0) for lane, state in group.state().items()}
    header = Header(HEADER_VERSION, rows * spec.num_lanes, steps, fp or fingerprint(spec))
    return encode_state(header, lanes, len(spec.sources))


# Real tokenizers that come with the project's shared data (CI has them, a user's clone may not).
SHARED_TOKENIZERS = os.environ.get("ZEPHON_SHARED_TOKENIZERS") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "data", "tokenizers"
)
REAL_TOKENIZERS = ("gpt2", "gpt_neox_20b", "olmo2_dolma2", "torchtitan_test")


def gate_real_tokenizers():
    """REAL_TOKENIZERS as pytest params for the slower tests: GPT-2 in the gate, the others in the slow tier
    (the fixture tokenizer, with special tokens, covers the same properties in the gate)."""
    import pytest

    return [name if name == "gpt2" else pytest.param(name, marks=pytest.mark.slow) for name in REAL_TOKENIZERS]


def real_tokenizer(name: str) -> str:
    """The directory of a real tokenizer, or a skip naming what is missing."""
    import pytest

    path = os.path.join(SHARED_TOKENIZERS, name)
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        pytest.skip(
            f"real tokenizer {path} is absent (it comes with the shared data; fixture tokenizers cover the same)"
        )
    return path


def with_special_tokens(tokenizer_dir: str, target: str, extra: list[str]) -> str:
    """A copy of a fixture tokenizer whose tokenizer_config.json also declares `extra` special tokens
    (in added_tokens_decoder, as Hugging Face model repositories do); tokenizer.json does not know them."""
    import json
    import shutil

    from tokenizers import Tokenizer

    os.makedirs(target, exist_ok=True)
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), target)
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
        config = json.load(f)
    size = Tokenizer.from_file(os.path.join(target, "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    config["added_tokens_decoder"] = {
        str(size + i): {
            "content": s,
            "special": True,
            "normalized": False,
            "lstrip": False,
            "rstrip": False,
            "single_word": False,
        }
        for i, s in enumerate(extra)
    }
    with open(os.path.join(target, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return target


def special_token_strings(tokenizer_dir: str) -> list[str]:
    """Every special-token string a tokenizer directory declares (config and tokenizer.json)."""
    import json

    with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
        config = json.load(f)
    with open(os.path.join(tokenizer_dir, "tokenizer.json")) as f:
        added = json.load(f).get("added_tokens", [])
    found = [config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")]
    found = [t.get("content") if isinstance(t, dict) else t for t in found]
    found += [t.get("content") for t in config.get("added_tokens_decoder", {}).values()]
    found += [t["content"] for t in added if t.get("special")]
    return sorted({t for t in found if isinstance(t, str) and t.strip()})


def write_job(path, corpus_dir: str, tokenizer_dir: str, *, seq_len: int = 64, batch: int = 16, local: int = 2,
              dataloader: str = "", source: str = "", validator: str = "", training: str = "") -> str:  # fmt: skip
    """A job TOML over the fixture corpus (code: Parquet, prose: JSONL) at `path`; the strings are extra
    TOML lines for [dataloader], for each source's table, after them (e.g. a [validator] table) and for
    [training]."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"""
hf_assets_path = "{tokenizer_dir}"
[model]
module = "llama3"
config = "llama3_debugmodel"
[training]
seq_len = {seq_len}
global_batch_size = {batch}
local_batch_size = {local}
{training}
[dataloader]
num_lanes = 8
seed = 7
shuffle_window_blocks = 2
{dataloader}
[dataloader.sources.code]
paths = ["{corpus_dir}/code/*.parquet"]
weight = 0.4
{source}
[dataloader.sources.prose]
paths = ["{corpus_dir}/prose/*.jsonl"]
weight = 0.6
block_bytes = 16384
{source}
{validator}
""")
    return str(path)


class LinesSource(Source):
    """Plain text: each non-empty line is a document, one block per file (a format a test registers)."""

    format_name = "lines"
    row_unit = "line"

    def _scan(self, file) -> FileBlocks:
        return FileBlocks(file.path, file.size, file.mtime_ns, 1)

    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        path = self.files[file_index].path
        with open(path, encoding="utf-8") as f:
            numbered = [(n, line.rstrip("\n")) for n, line in enumerate(f) if line.strip()]
        return BlockDocuments(path, [text for _, text in numbered], [n for n, _ in numbered])


LINES = formats.Format(
    name="lines",
    extensions=(".txt",),
    open=lambda source, files, max_chars, options: LinesSource(
        source.name, files, source.text_field, max_chars, options
    ),
)


@contextlib.contextmanager
def registered_format(fmt: formats.Format):
    """`fmt` in the format registry for the duration."""
    formats.register_format(fmt)
    try:
        yield fmt
    finally:
        formats.unregister_format(fmt.name)


@contextlib.contextmanager
def registered_packer(cls):
    """`cls` in the packing registry for the duration (as registered_format for formats)."""
    from zephon_titan.engine import packing

    packing.register_packer(cls)
    try:
        yield cls
    finally:
        packing._PACKERS.pop(cls.name, None)


def read_validation_entries(path: str) -> list[dict]:
    """The entries of a validation.jsonl; a bad line (the last one too) is a DataError naming file and line."""
    from zephon_titan.engine.eval_set import VALIDATION_RECORD
    from zephon_titan.engine.jsonl_log import read_entries

    return read_entries(path, VALIDATION_RECORD)[0]


def assert_same_files_and_blocks(remote, local, what: str = "") -> None:
    """Two opened sources (object storage, local disk) list the same file names, sizes and block counts
    and read the same texts and rows in every block."""
    assert remote.num_blocks == local.num_blocks > 3
    assert [(os.path.basename(f.path), f.size, f.num_blocks) for f in remote.files] == [
        (os.path.basename(f.path), f.size, f.num_blocks) for f in local.files
    ]
    for block in range(local.num_blocks):
        mine, theirs = remote.read_block(block), local.read_block(block)
        assert (mine.texts, mine.rows) == (theirs.texts, theirs.rows), f"{what} block {block}"


def assert_same_lane_rows(local, remote, other_seed, lanes=(0, 5), rows: int = 25) -> None:
    """The lanes of `remote` (the same documents elsewhere) give the rows of `local`; those of
    `other_seed` differ (the comparison can fail)."""
    for lane in lanes:
        expected = rows_digest(LaneStream(local, lane).take(rows))
        assert rows_digest(LaneStream(remote, lane).take(rows)) == expected
        assert rows_digest(LaneStream(other_seed, lane).take(rows)) != expected


def listing_error(path: str) -> str:
    """The one-line ConfigError of listing `path` with the environment as it is now (the filesystems
    cached for the old environment are dropped before and after)."""
    import pytest

    from zephon_titan.engine.sources import storage
    from zephon_titan.engine.sources.base import expand_paths
    from zephon_titan.errors import ConfigError

    storage._filesystem.cache_clear()
    try:
        with pytest.raises(ConfigError) as error:
            expand_paths("s", [path])
    finally:
        storage._filesystem.cache_clear()
    message = str(error.value)
    assert "\n" not in message, message
    return message


@contextlib.contextmanager
def within_seconds(seconds: int):
    """A hang in the block is a failure (TimeoutError), not a stuck suite (main thread only: SIGALRM)."""

    def stop(*_):
        raise TimeoutError(f"no answer in {seconds} s: the loader hangs")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ---- a corpus with columns to filter on (keep, repeat, transform: tests/unit/test_pipeline.py, test_transforms.py)

SCORED_LANGS = ["en", "de", "fr", None]


def scored_record(i: int, text: str) -> dict:
    """A document's columns: a quality in [0, 1) (null for every 11th), a language, a nested source."""
    quality = None if i % 11 == 5 else ((i * 7919) % 1000) / 1000
    lang = SCORED_LANGS[i % 4]
    return {"text": text, "quality": quality, "lang": lang, "meta": {"site": f"s{i % 3}", "score": i % 5}}


def write_scored(root: str, prose_docs: list[str], code_docs: list[str]) -> str:
    """prose: 2 JSONL files; code: 2 Parquet files (4 rows per row group), each record with scored_record's columns."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(f"{root}/prose")
    os.makedirs(f"{root}/code")
    docs = [d for d in prose_docs if d.strip()][:120]
    for f in range(2):
        with open(f"{root}/prose/part-{f}.jsonl", "w") as out:
            for i in range(f, len(docs), 2):
                out.write(json.dumps(scored_record(i, docs[i])) + "\n")
    code = [d for d in code_docs if d.strip()][:40]
    for f in range(2):
        records = [scored_record(i, code[i]) for i in range(f, len(code), 2)]
        pq.write_table(pa.Table.from_pylist(records), f"{root}/code/part-{f}.parquet", row_group_size=4)
    return root


def scored_table(root, tokenizer_dir, keep=("", ""), repeat=("", ""), **overrides) -> dict:
    """A `[dataloader]` table over write_scored's corpus, each source with its keep and repeat."""
    sources = {
        "code": {"paths": [f"{root}/code/*.parquet"], "weight": 0.4, "keep": keep[0], "repeat": repeat[0]},
        "prose": {
            "paths": [f"{root}/prose/*.jsonl"],
            "weight": 0.6,
            "block_bytes": 8192,
            "keep": keep[1],
            "repeat": repeat[1],
        },
    }
    table = {"num_lanes": 4, "seed": 7, "tokenizer_path": tokenizer_dir, "shuffle_window_blocks": 2}
    table.update(sources=sources, **overrides)
    return table


def scored_records(root: str) -> dict[tuple[str, int], dict]:
    """Every document by (file, row) as the sources name them: Parquet row numbers, JSONL byte offsets."""
    import json

    import pyarrow.parquet as pq

    out = {}
    for name in sorted(os.listdir(f"{root}/code")):
        path = f"{root}/code/{name}"
        for row, record in enumerate(pq.read_table(path).to_pylist()):
            out[(path, row)] = record
    for name in sorted(os.listdir(f"{root}/prose")):
        path = f"{root}/prose/{name}"
        offset = 0
        with open(path, "rb") as f:
            for line in f:
                out[(path, offset)] = json.loads(line)
                offset += len(line)
    return out


def _mix64(x: int) -> int:
    m = (1 << 64) - 1
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & m
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & m
    return x ^ (x >> 31)


def reference_copies(repeat: float, seed: int, source: str, file: str, row: int, epoch: int = 0) -> int:
    """A document's trained copies in a pass under `repeat`, computed apart from the engine (splitmix64 over Python
    integers, not numpy): floor(repeat), plus one where the keyed hash of its identity falls under frac(repeat)."""
    import math
    import posixpath

    from zephon_titan.engine.shuffle import derive_key

    key = derive_key(seed, "repeat", source, posixpath.basename(file), epoch)
    u = _mix64((row * 0x9E3779B97F4A7C15 + key) & ((1 << 64) - 1)) >> 11
    whole = math.floor(repeat)
    return whole + (u < (repeat - whole) * 2.0**53)


# ---- committed checkpoints of earlier versions (tests/fixtures/checkpoint_*) ---------------------------------------


def clone_fixture(folder: str, tmp_path, monkeypatch):
    """A committed checkpoint fixture as a clone has it: copied (new modification times), used from its own folder."""
    import shutil

    target = tmp_path / os.path.basename(folder)
    shutil.copytree(folder, target, copy_function=shutil.copy, ignore=shutil.ignore_patterns("*.py", "*.md"))
    monkeypatch.chdir(target)
    return target


def fresh_plan(folder: str, steps: int) -> dict:
    """The fixture's job planned from step 1 with this code, by step: computed now, nothing hard-coded."""
    from zephon_titan.plan import plan_ledger

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return {e.step: e for e in plan_ledger("job.toml", steps)}
    finally:
        os.chdir(cwd)


def data_run_resumed(checkpoint: str, steps: int, monkeypatch) -> list:
    """The ledger of a 1-rank data_run of job.toml (in the current folder) resumed from `checkpoint` to `steps`,
    after the fixture's committed ledger.jsonl."""
    import shutil
    import socket
    import warnings

    from zephon_titan.engine.ledger import read_ledger
    from zephon_titan.titan import data_run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    shutil.copy("ledger.jsonl", "resumed.jsonl")
    args = ["--job.config_file", "job.toml", "--steps", str(steps), "--resume", checkpoint, "--ledger", "resumed.jsonl"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert data_run.main(args) == 0
    return read_ledger("resumed.jsonl")
