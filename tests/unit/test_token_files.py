"""Token files as sources, Megatron indexed datasets (`.bin` + `.idx`) and OLMo token files (`.npy` memmaps):
the documents of a JSONL fixture tokenized with the fixture tokenizer and written as token files give
byte-equal rows and ledger; a resume on another W equals the plan; each broken file is a one-line error
naming it before step 1."""

import json
import os

import numpy as np
import pytest
from helpers import data_table, make_spec, rows_digest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from token_files import write_dolma_metadata, write_megatron, write_olmo

from zephon_titan.config import SourceConfig, config_from_dict
from zephon_titan.engine import DataError, LaneStream
from zephon_titan.engine.lane_digests import step_digests
from zephon_titan.engine.lanes import LaneGroup
from zephon_titan.engine.resume import HEADER_KEY, lane_key
from zephon_titan.engine.sources import open_source
from zephon_titan.titan.dataloader import ZephonDataLoader


def _plain_sources(plain):
    return {"web": {"paths": [str(plain / "*.jsonl")], "block_bytes": 1 << 30}}


def _megatron_sources(root, **extra):
    return {"web": {"paths": [str(root / "*.bin")], "block_rows": 1 << 20, **extra}}


def _tokenized(plain, tokenizer):
    """Per plain file, its documents' ids (no special tokens), as the fixture tokenizer gives them."""
    out = {}
    for name in sorted(os.listdir(plain)):
        docs = [json.loads(line)["text"] for line in (plain / name).read_text(encoding="utf-8").splitlines()]
        out[name] = [e.ids for e in tokenizer.encode_batch(docs, add_special_tokens=False)]
    return out


def _write_all(root, tokenized, edit=lambda ids: ids, **kw):
    os.makedirs(root, exist_ok=True)
    for name, docs in tokenized.items():
        write_megatron(str(root / name.replace(".jsonl", "")), [edit(list(d)) for d in docs], **kw)
    return root


def _olmo_sources(root, eos, **extra):
    return {"web": {"paths": [str(root / "*.npy")], "block_bytes": 1 << 30, "eos_token_id": eos, **extra}}


def _write_olmo_all(root, tokenized, eos, **kw):
    os.makedirs(root, exist_ok=True)
    for name, docs in tokenized.items():
        write_olmo(str(root / name.replace(".jsonl", ".npy")), docs, eos, **kw)
    return root


def _lanes(spec, rows=12):
    return [rows_digest(LaneStream(spec, lane).take(rows)) for lane in range(spec.num_lanes)]


def _ledger(spec, steps=3, rows=2):
    return list(step_digests(LaneGroup(spec, range(spec.num_lanes), rows, None, 0), len(spec.sources), 0, steps))


def test_megatron_rows_and_ledger_equal_the_jsonl_documents(tmp_path, plain, corpus_dir, tokenizer_dir):
    reference = make_spec(corpus_dir, tokenizer_dir, sources=_plain_sources(plain))
    tokenized = _tokenized(plain, reference.tokenizer.tokenizer)
    bos, eos = reference.tokenizer.bos_id, reference.tokenizer.eos_id
    assert bos is not None and eos is not None  # the fixture adds both: the never-doubled case below needs them
    want_lanes, want_ledger = _lanes(reference), _ledger(reference)

    for case, edit, kw in [
        ("plain", lambda ids: ids, {}),
        ("with_specials", lambda ids: [bos, *ids, eos], {}),  # as preprocess_data --append-eod (and a BOS) writes
        ("sentences_uint32", lambda ids: ids, {"split": 5, "dtype": np.int32}),
    ]:
        root = _write_all(tmp_path / case, tokenized, edit, **kw)
        spec = make_spec(corpus_dir, tokenizer_dir, sources=_megatron_sources(root))
        assert spec.sources[0].num_blocks == 3, case
        assert _lanes(spec) == want_lanes, case
        assert _ledger(spec) == want_ledger, case

    # Negative control: one token changed, in the document lane 0's first row starts with, differs.
    piece = LaneStream(spec, 0).take(1)[0].pieces[0]
    name, doc, at = os.path.basename(piece.file).replace(".bin", ".jsonl"), piece.row, piece.doc_offset
    edited = [list(d) for d in tokenized[name]]
    edited[doc][at] = (edited[doc][at] + 1) % 100
    changed = {**tokenized, name: edited}
    spec = make_spec(corpus_dir, tokenizer_dir, sources=_megatron_sources(_write_all(tmp_path / "changed", changed)))
    assert _ledger(spec) != want_ledger


def test_specials_are_added_as_configured_and_never_doubled(tmp_path, corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [f"{corpus_dir}/prose/*.jsonl"]}})
    bos, eos = spec.tokenizer.bos_id, spec.tokenizer.eos_id
    docs = [[5, 6], [bos, 5, 6], [5, 6, eos], [bos, 5, 6, eos], [bos, bos, 5], [], [eos]]
    write_megatron(str(tmp_path / "d"), docs)
    source = open_source(SourceConfig(name="web", paths=[str(tmp_path / "d.bin")]))
    got = [list(t) for t in spec.tokenizer.encode(source.read_block(0).texts, source.specials_in_tokens)]
    assert got == [
        [bos, 5, 6, eos],
        [bos, 5, 6, eos],
        [bos, 5, 6, eos],
        [bos, 5, 6, eos],
        [bos, bos, 5, eos],  # only one BOS is the added one; the data's own second BOS stays
        [bos, eos],
        [bos, eos],
    ]
    # Without add_eos, a document's own EOS stays (the tokens are the document); none is added.
    no_eos = make_spec(corpus_dir, tokenizer_dir, add_eos=False)
    assert [list(t) for t in no_eos.tokenizer.encode(source.read_block(0).texts[:3], True)] == [
        [bos, 5, 6],
        [bos, 5, 6],
        [bos, 5, 6, eos],
    ]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=st.lists(st.lists(st.integers(0, 60000), max_size=9), max_size=12),
    block_rows=st.integers(1, 5),
    split=st.integers(0, 4),
    dtype=st.sampled_from([np.uint16, np.int32, np.int64]),
)
def test_blocks_give_back_every_document_in_order(tmp_path_factory, docs, block_rows, split, dtype):
    root = tmp_path_factory.mktemp("prop")
    write_megatron(str(root / "d"), docs, dtype=dtype, split=split)
    source = open_source(SourceConfig(name="p", paths=[str(root / "d.bin")], block_rows=block_rows))
    assert source.num_blocks == -(-len(docs) // block_rows)
    blocks = [source.read_block(b) for b in range(source.num_blocks)]
    assert [list(map(int, t)) for b in blocks for t in b.texts] == docs
    assert [r for b in blocks for r in b.rows] == list(range(len(docs)))


@pytest.mark.parametrize("fmt", ["megatron", "olmo"])
def test_a_resume_on_another_world_size_equals_the_plan(tmp_path, plain, corpus_dir, tokenizer_dir, fmt):
    tokenizer = make_spec(corpus_dir, tokenizer_dir).tokenizer
    tokenized = _tokenized(plain, tokenizer.tokenizer)
    if fmt == "megatron":
        sources = _megatron_sources(_write_all(tmp_path / "m", tokenized), block_rows=7)
    else:
        sources = _olmo_sources(
            _write_olmo_all(tmp_path / "o", tokenized, eos := tokenizer.eos_id), eos, block_bytes=4096
        )
    data = config_from_dict(data_table(corpus_dir, tokenizer_dir, num_lanes=2, sources=sources))
    config = ZephonDataLoader.Config(data=data, global_batch_size=12)

    def loaders(world, local):
        build = config.build
        return [build(dp_world_size=world, dp_rank=r, tokenizer=None, seq_len=64, local_batch_size=local) for r in range(world)]  # fmt: skip

    def run(group, steps, local):
        its, out = [iter(loader) for loader in group], []
        for _ in range(steps):
            for it in its:
                for _ in range(12 // len(group) // local):
                    next(it)
            out.append([d for loader in group for d in loader.last_step.lane_digests])
        return out

    plan = [
        digests for _, digests, _ in _ledger(make_spec(corpus_dir, tokenizer_dir, num_lanes=2, sources=sources), 4, 6)
    ]
    first = loaders(2, 3)
    assert run(first, 2, 3) == plan[:2]
    saved: dict = {}
    for loader in first:
        saved.update(loader.state_dict())
    resumed = loaders(3, 2)
    for loader in resumed:
        loader.load_state_dict({k: saved[k] for k in [HEADER_KEY, *map(lane_key, loader.lane_ids)]})
    assert run(resumed, 2, 2) == plan[2:]
    # Negative control: another seed's plan differs.
    other = make_spec(corpus_dir, tokenizer_dir, num_lanes=2, sources=sources, seed=8)
    assert [d for _, d, _ in _ledger(other, 4, 6)] != plan


# ---- broken files: one line each, naming the file, before step 1 ------------------------------------------


def _open(path, **kw):
    return open_source(SourceConfig(name="web", paths=[path], **kw))


def _one_line(excinfo, *names):
    message = str(excinfo.value)
    assert "\n" not in message
    for name in names:
        assert name in message, message
    return message


def test_a_truncated_bin_is_named_at_startup(tmp_path):
    bin_path, _ = write_megatron(str(tmp_path / "d"), [[1, 2, 3], [4, 5]])
    with open(bin_path, "r+b") as f:
        f.truncate(6)
    with pytest.raises(DataError) as e:
        _open(bin_path)
    assert "truncated" in _one_line(e, bin_path, "says the tokens end at byte 10")


def test_an_idx_that_disagrees_with_its_bin_is_named(tmp_path):
    bin_path, idx_path = write_megatron(str(tmp_path / "d"), [[1, 2, 3], [4, 5]])
    data = bytearray(open(idx_path, "rb").read())
    with open(idx_path, "wb") as f:  # a size the header does not give
        f.write(bytes(data) + b"\0" * 8)
    with pytest.raises(DataError) as e:
        _open(bin_path)
    _one_line(e, idx_path, "makes")
    # The first sequence 2 tokens long, not 3: the last one still ends at the .bin's end (startup's check),
    # but the second's pointer is not where the first ends.
    data[34:38] = np.array([2], "<i4").tobytes()
    with open(idx_path, "wb") as f:
        f.write(bytes(data))
    source = _open(bin_path)  # the end agrees (startup's check) ...
    with pytest.raises(DataError) as e:
        source.read_block(0)  # ... the pointers do not
    _one_line(e, idx_path, "not back to back")


def test_pointers_past_the_bin_blame_the_idx(tmp_path):
    """A middle document's pointer past the .bin's end (startup checks the first and last): the .idx is named,
    not the .bin ("truncated, or changed since listed" before)."""
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    bin_path, idx_path = write_megatron(str(tmp_path / "d"), docs)
    source = open_source(SourceConfig(name="web", paths=[bin_path], block_rows=1))
    assert [list(map(int, source.read_block(b).texts[0])) for b in range(3)] == docs  # the control
    data = bytearray(open(idx_path, "rb").read())
    pointers_at = 34 + 4 * len(docs)  # header (9 + 8 + 1 + 8 + 8 bytes), then the lengths (i32 each)
    assert np.frombuffer(bytes(data[pointers_at : pointers_at + 24]), "<i8").tolist() == [0, 6, 10]
    data[pointers_at + 8 : pointers_at + 16] = np.array([1000], "<i8").tobytes()
    with open(idx_path, "wb") as f:
        f.write(bytes(data))
    source = open_source(SourceConfig(name="web", paths=[bin_path], block_rows=1))
    with pytest.raises(DataError) as e:
        source.read_block(1)
    _one_line(e, idx_path, "point to bytes 1,000-1,004, outside", f"{bin_path} (18 bytes)")


def test_a_missing_idx_is_named(tmp_path):
    bin_path, idx_path = write_megatron(str(tmp_path / "d"), [[1, 2]])
    os.remove(idx_path)
    with pytest.raises(DataError) as e:
        _open(bin_path)
    _one_line(e, bin_path, idx_path)


@pytest.mark.parametrize(
    "offset, value, says",
    [
        (0, b"XXIDIDX\x00\x00", "not a Megatron index"),
        (9, (2).to_bytes(8, "little"), "index version 2"),
        (17, bytes([6]), "dtype code 6 (float64, not token ids)"),
        (17, bytes([9]), "dtype code 9 (unknown)"),
    ],
)
def test_a_wrong_header_is_named(tmp_path, offset, value, says):
    bin_path, idx_path = write_megatron(str(tmp_path / "d"), [[1, 2]])
    data = bytearray(open(idx_path, "rb").read())
    data[offset : offset + len(value)] = value
    open(idx_path, "wb").write(bytes(data))
    with pytest.raises(DataError) as e:
        _open(bin_path)
    _one_line(e, idx_path, says)


def test_a_wrong_dtype_that_still_fits_is_caught_by_the_size(tmp_path):
    """uint16 tokens under an int32 header: the sizes no longer agree with the .bin."""
    bin_path, idx_path = write_megatron(str(tmp_path / "d"), [[1, 2, 3], [4]])
    data = bytearray(open(idx_path, "rb").read())
    data[17] = 4  # int32
    open(idx_path, "wb").write(bytes(data))
    with pytest.raises(DataError) as e:
        _open(bin_path)
    _one_line(e, bin_path, idx_path)


def test_a_token_beyond_the_vocabulary_names_file_and_document(tmp_path, corpus_dir, tokenizer_dir):
    vocab = make_spec(corpus_dir, tokenizer_dir).tokenizer.vocab_size
    bin_path, _ = write_megatron(str(tmp_path / "d"), [[1, 2], [3, vocab + 5]], dtype=np.int32)
    spec = make_spec(corpus_dir, tokenizer_dir, num_lanes=1, sources={"web": {"paths": [bin_path]}})
    with pytest.raises(DataError) as e:
        LaneStream(spec, 0).take(1)
    _one_line(e, f"{bin_path} document 1: token id {vocab + 5} is outside the tokenizer's vocabulary")


def test_the_fingerprint_names_a_changed_index(tmp_path):
    bin_path, idx_path = write_megatron(str(tmp_path / "d"), [[1, 2, 3], [4]])
    before, st = _open(bin_path).fingerprint(), os.stat(bin_path)
    write_megatron(str(tmp_path / "d"), [[1, 2], [3, 4]])  # the same .bin bytes, other documents
    os.utime(bin_path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the .bin as it was: only the .idx changed
    after = _open(bin_path).fingerprint()
    assert after["layout"] == before["layout"]  # the same sizes and counts ...
    assert after["mtimes"] != before["mtimes"]  # ... but the .idx was rewritten
    write_megatron(str(tmp_path / "d"), [[1, 2, 3, 4]])  # one document fewer: a smaller .idx
    assert _open(bin_path).fingerprint()["layout"] != before["layout"]


@pytest.mark.slow  # importing megatron-core takes ~10 s
def test_the_fixture_writer_is_megatron_cores_layout(tmp_path):
    """tests/token_files.py writes the bytes megatron-core's IndexedDatasetBuilder writes, megatron-core's
    IndexedDataset reads them back, and zephon reads megatron-core's own files as the same documents."""
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset", reason="megatron-core is not installed")
    import torch

    docs = [[1, 2, 3], [], [7], list(range(40, 60)), [65535, 0]]
    for dtype, split in [(np.uint16, 0), (np.int32, 4)]:
        ours = str(tmp_path / f"ours_{split}")
        write_megatron(ours, docs, dtype=dtype, split=split)
        theirs = str(tmp_path / f"theirs_{split}")
        builder = indexed.IndexedDatasetBuilder(theirs + ".bin", dtype=dtype)
        for doc in docs:
            cuts = range(0, len(doc), split) if split and doc else [0]
            lengths = [len(doc[at : at + split]) if split else len(doc) for at in cuts]
            builder.add_document(torch.tensor(doc, dtype=torch.int64), lengths)
        builder.finalize(theirs + ".idx")
        for suffix in (".bin", ".idx"):
            assert open(ours + suffix, "rb").read() == open(theirs + suffix, "rb").read(), (dtype, split, suffix)
        dataset = indexed.IndexedDataset(ours)
        bounds = dataset.document_indices
        read = [[int(t) for s in range(bounds[d], bounds[d + 1]) for t in dataset[s]] for d in range(len(docs))]
        assert read == docs
        source = _open(theirs + ".bin", block_rows=2)
        assert [list(map(int, t)) for b in range(source.num_blocks) for t in source.read_block(b).texts] == docs


# ---- OLMo token files -------------------------------------------------------------------------------------


def test_olmo_rows_and_ledger_equal_the_jsonl_documents(tmp_path, plain, corpus_dir, tokenizer_dir):
    reference = make_spec(corpus_dir, tokenizer_dir, sources=_plain_sources(plain))
    tokenized = _tokenized(plain, reference.tokenizer.tokenizer)
    eos = reference.tokenizer.eos_id
    want_lanes, want_ledger = _lanes(reference), _ledger(reference)
    for dtype in (np.uint16, np.uint32):
        root = _write_olmo_all(tmp_path / dtype.__name__, tokenized, eos, dtype=dtype)
        spec = make_spec(corpus_dir, tokenizer_dir, sources=_olmo_sources(root, eos, token_dtype=dtype.__name__))
        assert spec.sources[0].num_blocks == 3
        assert _lanes(spec) == want_lanes and _ledger(spec) == want_ledger, dtype
    # Without add_eos the files' own EOS stays: the same rows still (it is the id add_eos would add).
    no_eos = make_spec(corpus_dir, tokenizer_dir, sources=_plain_sources(plain), add_eos=False)
    olmo_no_eos = make_spec(corpus_dir, tokenizer_dir, sources=_olmo_sources(root, eos, token_dtype="uint32"), add_eos=False)  # fmt: skip
    assert _ledger(olmo_no_eos) == _ledger(reference) != _ledger(no_eos)
    # Negative control: one token changed, in the document lane 0's first row starts with, differs.
    piece = LaneStream(spec, 0).take(1)[0].pieces[0]
    name = os.path.basename(piece.file).replace(".npy", ".jsonl")
    ids = np.fromfile(piece.file, dtype=np.uint32)
    ids[piece.row + piece.doc_offset] = (ids[piece.row + piece.doc_offset] + 1) % 100
    ids.tofile(piece.file)
    spec = make_spec(corpus_dir, tokenizer_dir, sources=_olmo_sources(root, eos, token_dtype="uint32"))
    assert _ledger(spec) != want_ledger and name in tokenized


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(0, 1500), max_size=8),
    block_bytes=st.integers(1024, 3000),
    dtype=st.sampled_from([np.uint16, np.uint32]),
    unterminated=st.booleans(),
)
def test_olmo_blocks_give_back_every_document_in_order(tmp_path_factory, lengths, block_bytes, dtype, unterminated):
    """Every document exactly once, at its token offset, whatever the block size cuts (the last one may
    lack its EOS: it ends at the file's end)."""
    eos = 7
    docs = [[8 + (i + j) % 50 for j in range(n)] for i, n in enumerate(lengths)]
    path = write_olmo(str(tmp_path_factory.mktemp("olmo") / "d.npy"), docs, eos, dtype=dtype)
    want = [[*d, eos] for d in docs]
    if unterminated and want and len(want[-1]) > 1:
        want[-1] = want[-1][:-1]
        np.fromfile(path, dtype=dtype)[:-1].tofile(path)
    source = _open(path, format="olmo", eos_token_id=eos, block_bytes=block_bytes, token_dtype=dtype.__name__)
    blocks = [source.read_block(b) for b in range(source.num_blocks)]
    assert [list(map(int, t)) for b in blocks for t in b.texts] == want
    offsets = [sum(map(len, want[:i])) for i in range(len(want))]
    assert [r for b in blocks for r in b.rows] == offsets


def test_olmo_mistakes_are_one_line_naming_the_file(tmp_path, corpus_dir, tokenizer_dir):
    from zephon_titan.errors import ConfigError

    path = write_olmo(str(tmp_path / "d.npy"), [[1, 2, 3], [4]], eos=0)
    with pytest.raises(ConfigError) as e:
        _open(path)  # no eos_token_id
    _one_line(e, "[dataloader.sources.web] OLMo token files need eos_token_id")
    with open(path, "r+b") as f:  # truncated mid-token
        f.truncate(os.path.getsize(path) - 1)
    with pytest.raises(DataError) as e:
        _open(path, eos_token_id=0)
    _one_line(e, path, "not a whole number of uint16 tokens")
    np.save(str(tmp_path / "real.npy"), np.array([1, 2, 0], dtype=np.uint16))  # a real .npy, with its header
    with pytest.raises(DataError) as e:
        _open(str(tmp_path / "real.npy"), eos_token_id=0)
    _one_line(e, "real.npy: a NumPy .npy file with a header")
    # A wrong EOS id: no document end for longer than a document may be.
    long = write_olmo(str(tmp_path / "long.npy"), [list(range(1, 3000))], eos=0)
    config = SourceConfig(name="web", paths=[long], eos_token_id=9999, block_bytes=1024)
    source = open_source(config, max_document_chars=2000)
    with pytest.raises(DataError) as e:
        source.read_block(0)
    _one_line(e, long, "no document end (eos_token_id 9999)")


def test_olmo_token_beyond_the_vocabulary_and_a_wrong_dtype_name_the_file(tmp_path, corpus_dir, tokenizer_dir):
    tokenizer = make_spec(corpus_dir, tokenizer_dir).tokenizer
    vocab, eos = tokenizer.vocab_size, tokenizer.eos_id
    path = write_olmo(str(tmp_path / "d.npy"), [[1, 2], [3, vocab + 5]], eos, dtype=np.uint32)
    sources = {"web": {"paths": [path], "eos_token_id": eos, "token_dtype": "uint32"}}
    with pytest.raises(DataError) as e:
        LaneStream(make_spec(corpus_dir, tokenizer_dir, num_lanes=1, sources=sources), 0).take(1)
    _one_line(e, f"{path} token offset 3: token id {vocab + 5} is outside the tokenizer's vocabulary")
    # uint16 ids read as uint32: pairs of ids make ids far beyond the vocabulary.
    path = write_olmo(str(tmp_path / "u16.npy"), [[5, 6, 7, 8, 9]], eos, dtype=np.uint16)
    sources = {"web": {"paths": [path], "eos_token_id": eos, "token_dtype": "uint32"}}
    with pytest.raises(DataError) as e:
        LaneStream(make_spec(corpus_dir, tokenizer_dir, num_lanes=1, sources=sources), 0).take(1)
    _one_line(e, path, "outside the tokenizer's vocabulary")


def test_a_dtype_or_eos_that_cannot_be_the_files_is_refused_at_startup(tmp_path, plain, corpus_dir, tokenizer_dir):
    """A raw memmap does not say its type: a wrong token_dtype or eos_token_id gave each file as one document of
    wrong ids, silently (validate and plan build the same sources, so they refuse it too)."""
    from zephon_titan.engine.spec import build_engine
    from zephon_titan.errors import ConfigError

    tokenizer = make_spec(corpus_dir, tokenizer_dir).tokenizer
    vocab, eos = tokenizer.vocab_size, tokenizer.eos_id
    docs = [d for docs in _tokenized(plain, tokenizer.tokenizer).values() for d in docs]
    wide = write_olmo(str(tmp_path / "wide.npy"), docs, eos, dtype=np.uint32)
    read = _open(wide, eos_token_id=eos, token_dtype="uint32").read_block(0).texts  # the control: the files' type
    assert [list(map(int, t)) for t in read[:3]] == [[*d, eos] for d in docs[:3]]
    # uint32 ids read as uint16 (ids followed by 0s): every other id is 0.
    with pytest.raises(DataError) as e:
        _open(wide, eos_token_id=eos, token_dtype="uint16")
    _one_line(e, wide, "every other uint16 id", "uint32", "set token_dtype")
    narrow = write_olmo(str(tmp_path / "narrow.npy"), docs, eos, dtype=np.uint16)
    with pytest.raises(DataError) as e:  # uint32 on uint64-written ids
        _open(write_olmo(str(tmp_path / "w64.npy"), docs, eos, dtype=np.uint64), eos_token_id=eos, token_dtype="uint32")
    _one_line(e, "every other uint32 id")
    # An EOS that cannot be stored in the dtype can never end a document.
    with pytest.raises(ConfigError) as e:
        _open(narrow, eos_token_id=70000, token_dtype="uint16")
    _one_line(e, "eos_token_id = 70000 does not fit token_dtype = 'uint16' (at most 65,535)")
    if eos > 255:  # uint8 on uint16 ids: the EOS does not fit either
        with pytest.raises(ConfigError) as e:
            _open(narrow, eos_token_id=eos, token_dtype="uint8")
        _one_line(e, "does not fit token_dtype = 'uint8'")
    # uint8 on a uint16 file of small ids: ids split into bytes, every other byte 0.
    small = write_olmo(str(tmp_path / "small.npy"), [[t % 200 + 1 for t in d] for d in docs[:20]], 250)
    with pytest.raises(DataError) as e:
        _open(small, eos_token_id=250, token_dtype="uint8")
    _one_line(e, "every other uint8 id")
    # An EOS id in range but not the files': no EOS in the first 32,768 ids, nor at the end.
    long = write_olmo(str(tmp_path / "long.npy"), [[t for d in docs for t in d][:40000]], eos)
    assert os.path.getsize(long) > 64 << 10
    wrong = next(t for t in range(1, vocab) if t != eos and t not in np.fromfile(long, dtype=np.uint16))
    with pytest.raises(DataError) as e:
        _open(long, eos_token_id=wrong)
    _one_line(e, long, f"no eos_token_id {wrong} in its first 32,768 uint16 ids nor at its end")
    _open(long, eos_token_id=eos)  # control: the file's own EOS is at its end
    # An EOS beyond the tokenizer's vocabulary (a uint32 id that fits the dtype).
    sources = _olmo_sources(tmp_path, vocab + 5, token_dtype="uint32", paths=[wide])
    config = config_from_dict(data_table(corpus_dir, tokenizer_dir, num_lanes=1, sources=sources))
    with pytest.raises(ConfigError) as e:
        build_engine(config, 32, tokenizer)
    _one_line(e, f"eos_token_id = {vocab + 5} is outside the tokenizer's vocabulary of {vocab:,} ids")


# ---- object storage ----------------------------------------------------------------------------------------


def test_token_files_in_the_bucket_equal_them_on_disk_read_by_ranges(s3, tmp_path, corpus_dir, tokenizer_dir):
    """Megatron and OLMo files uploaded to S3 (moto): the same blocks, rows and fingerprint but for where the
    files are; a block costs range requests only (its .idx slices and one .bin range; its byte range and
    tail), never a whole object."""
    from zephon_titan.engine.fingerprint import check_fingerprint, fingerprint
    from zephon_titan.engine.sources import storage
    from zephon_titan.errors import ResumeError

    eos = make_spec(corpus_dir, tokenizer_dir).tokenizer.eos_id
    docs = [[1 + (i * 7 + j) % 300 for j in range(5 + (i * 37) % 400)] for i in range(1500)]
    local_dir = tmp_path / "tok"
    local_dir.mkdir()
    write_megatron(str(local_dir / "m"), docs)
    write_olmo(str(local_dir / "o.npy"), docs, eos)
    uri = s3.upload(str(local_dir), "tokfiles")
    cases = {
        "m.bin": {"block_rows": 16},
        "o.npy": {"eos_token_id": eos, "block_bytes": 4096},
    }
    for name, options in cases.items():
        local = _open(str(local_dir / name), **options)
        remote = _open(f"{uri}/{name}", **options)
        assert remote.num_blocks == local.num_blocks > 5
        for block in (0, 3, local.num_blocks - 1):
            storage.open_input_file.cache_clear()
            s3.clear_requests()
            mine, theirs = remote.read_block(block), local.read_block(block)
            assert [list(t) for t in mine.texts] == [list(t) for t in theirs.texts] and mine.rows == theirs.rows
            gets = [r for r in s3.requests() if r["method"] == "GET" and not r["query"]]
            assert gets and all(r["range"] for r in gets), (name, gets)
            assert sum(r["bytes"] for r in gets) < os.path.getsize(local_dir / name) / 8, name
        # A run started on disk resumes from the bucket once told that only where the files are changed.
        sources = {"web": {"paths": [str(local_dir / name)], **options}}
        on_disk = fingerprint(make_spec(corpus_dir, tokenizer_dir, sources=sources))
        sources = {"web": {"paths": [f"{uri}/{name}"], **options}}
        in_bucket = fingerprint(make_spec(corpus_dir, tokenizer_dir, sources=sources))
        with pytest.raises(ResumeError, match=r"locations.web"):
            check_fingerprint(on_disk, in_bucket)
        check_fingerprint(on_disk, in_bucket, allow=["locations", "mtimes"])


@pytest.mark.parametrize("fmt", ["megatron", "olmo"])
def test_an_index_gives_the_same_source_and_names_a_changed_setting(tmp_path, fmt):
    from zephon_titan.errors import ConfigError

    docs = [[1 + (i + j) % 90 for j in range(3 + i % 40)] for i in range(200)]
    if fmt == "megatron":
        path, options, changed = write_megatron(str(tmp_path / "d"), docs)[0], {"block_rows": 16}, {"block_rows": 8}
    else:
        path, options = write_olmo(str(tmp_path / "d.npy"), docs, eos=0), {"eos_token_id": 0, "block_bytes": 1024}
        changed = {"token_dtype": "uint8"}
    index = str(tmp_path / "index.json")
    listed = _open(path, index=index, **options)  # lists the files and writes the index
    assert os.path.exists(index)
    indexed = _open(path, index=index, **options)  # reads it (no scan)
    assert indexed.files == listed.files and indexed.fingerprint() == listed.fingerprint()
    blocks = range(listed.num_blocks)
    assert [list(map(list, indexed.read_block(b).texts)) for b in blocks] == [list(map(list, listed.read_block(b).texts)) for b in blocks]  # fmt: skip
    with pytest.raises(ConfigError) as e:
        _open(path, index=index, **{**options, **changed})
    key = next(iter(changed))
    _one_line(e, index, f"was written for other settings ({key}: ")


def test_dolma_metadata_is_checked_against_its_token_file(tmp_path):
    docs = [[1 + (i + j) % 90 for j in range(3 + i % 40)] for i in range(50)]
    docs += [[]] * (sum(len(d) + 1 for d in docs) % 2)  # an even token count (an empty document is its EOS)
    path = write_olmo(str(tmp_path / "d.npy"), docs, eos=0)
    plain = _open(path, eos_token_id=0, block_bytes=1024)
    metadata = write_dolma_metadata(path, docs)
    checked = _open(path, eos_token_id=0, block_bytes=1024)  # agrees: the same source (metadata is only checked)
    assert checked.files == plain.files and checked.fingerprint() == plain.fingerprint()
    with pytest.raises(DataError) as e:  # uint16 tokens read as uint32: half as many
        _open(path, eos_token_id=0, token_dtype="uint32")
    _one_line(e, metadata, "another token_dtype")
    write_dolma_metadata(path, docs[:-1])  # one document short of the file
    with pytest.raises(DataError) as e:
        _open(path, eos_token_id=0)
    _one_line(e, metadata, path, "its documents end at token")
    write_dolma_metadata(path, [docs[0], *docs[2:]], ids=["a"] * len(docs))  # a gap is not a tiling either
    with pytest.raises(DataError) as e:
        _open(path, eos_token_id=0)
    _one_line(e, metadata, path)


def test_inspect_prints_token_file_pieces_by_their_own_row_unit(tmp_path, plain, corpus_dir, tokenizer_dir, capsys):
    """`inspect --step --lane` on Megatron and OLMo sources (a StopIteration traceback before: their pieces are
    placed by document and token offset, not row or byte offset)."""
    from zephon_titan.cli import main

    tokenizer = make_spec(corpus_dir, tokenizer_dir).tokenizer
    tokenized = _tokenized(plain, tokenizer.tokenizer)
    _write_all(tmp_path / "meg", tokenized)
    _write_olmo_all(tmp_path / "olmo", tokenized, tokenizer.eos_id)
    job = tmp_path / "job.toml"
    job.write_text(f"""
hf_assets_path = "{tokenizer_dir}"
[model]
module = "llama3"
config = "llama3_debugmodel"
[training]
seq_len = 64
global_batch_size = 4
local_batch_size = 2
[dataloader]
num_lanes = 2
[dataloader.sources.meg]
paths = ["{tmp_path}/meg/*.bin"]
[dataloader.sources.olmo]
paths = ["{tmp_path}/olmo/*.npy"]
eos_token_id = {tokenizer.eos_id}
""")
    assert main(["inspect", str(job), "--step", "1", "--lane", "0"]) == 0
    out = capsys.readouterr().out
    assert "step 1 lane 0 row 0" in out and "document tokens" in out
    assert "meg: " in out and "olmo: " in out and " document " in out and " token offset " in out


def test_dolma_metadata_that_inflates_past_its_token_file_is_refused_without_holding_it(tmp_path):
    """A .csv.gz of a few KB that inflates to tens of MB (a line per document of at least one token bounds it
    by the token file) and a field over csv's 128 KiB limit: one line each, memory bounded."""
    import gzip
    import tracemalloc

    docs = [[1 + (i + j) % 90 for j in range(9)] for i in range(100)]  # 1,000 tokens
    path = write_olmo(str(tmp_path / "d.npy"), docs, eos=0)
    metadata = write_dolma_metadata(path, docs)
    _open(path, eos_token_id=0)  # the control: the honest metadata passes
    bomb = b"0,10,a\n" + b"\n" * (48 << 20)
    with open(metadata, "wb") as f:
        f.write(gzip.compress(bomb, 9))
    assert os.path.getsize(metadata) < 100_000
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as e:
            _open(path, eos_token_id=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _one_line(e, metadata, "inflates past 1,304,576 bytes for 1,000 tokens")
    assert peak < 8 << 20, peak  # never the 48 MiB inflated
    with open(metadata, "wb") as f:
        f.write(gzip.compress(b"0,10," + b"x" * (200 << 10) + b"\n"))
    with pytest.raises(DataError) as e:
        _open(path, eos_token_id=0)
    _one_line(e, metadata, "line 1: longer than 65,536 bytes")


@pytest.mark.parametrize(
    "name, dtype",
    [("gpt_neox_20b", "uint16"), pytest.param("olmo2_dolma2", "uint32", marks=pytest.mark.slow)],  # dolma2: ~4 s
)
def test_real_tokenizers_files_as_olmo_and_megatron_write_them(tmp_path, plain, corpus_dir, name, dtype):
    """Tokenizers OLMo trained with (GPT-NeoX's ids fit uint16; dolma2's 100k ids need uint32): the JSONL
    documents written as the tools write them (each ending with the tokenizer's EOS) give the JSONL's rows."""
    from helpers import real_tokenizer

    directory = real_tokenizer(name)
    reference = make_spec(corpus_dir, directory, sources=_plain_sources(plain))
    eos = reference.tokenizer.eos_id
    assert eos is not None
    tokenized = _tokenized(plain, reference.tokenizer.tokenizer)
    olmo = _write_olmo_all(tmp_path / "o", tokenized, eos, dtype=np.dtype(dtype).type)
    megatron = _write_all(tmp_path / "m", tokenized, lambda ids: [*ids, eos], dtype=np.int32)  # --append-eod
    want = _ledger(reference)
    assert _ledger(make_spec(corpus_dir, directory, sources=_olmo_sources(olmo, eos, token_dtype=dtype))) == want
    assert _ledger(make_spec(corpus_dir, directory, sources=_megatron_sources(megatron))) == want


def test_worker_processes_read_token_files_as_the_process_does(tmp_path, plain, corpus_dir, tokenizer_dir):
    """A Megatron and an OLMo source mixed, the lanes in 2 worker processes (the files handed over as
    records): the same steps as in process; another seed differs."""
    from zephon_titan.engine import open_lane_group

    tokenizer = make_spec(corpus_dir, tokenizer_dir).tokenizer
    tokenized = _tokenized(plain, tokenizer.tokenizer)
    megatron = _megatron_sources(_write_all(tmp_path / "m", tokenized), block_rows=5)["web"]
    olmo = _olmo_sources(_write_olmo_all(tmp_path / "o", tokenized, tokenizer.eos_id), tokenizer.eos_id)["web"]
    sources = {"meg": {**megatron, "weight": 0.3}, "olmo": {**olmo, "block_bytes": 2048, "weight": 0.7}}

    def steps(workers, seed=7):
        spec = make_spec(corpus_dir, tokenizer_dir, sources=sources, seed=seed)
        with open_lane_group(spec, range(8), 2, num_workers=workers) as group:
            return [[rows_digest(rows) for rows in group.next_step()] for _ in range(3)]

    in_process = steps(0)
    assert steps(2) == in_process
    assert steps(0, seed=8) != in_process
