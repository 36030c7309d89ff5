"""The tokenizer backend is a speed knob only: fastokens gives the ids of `tokenizers` or is not used.

For the fixture tokenizer (with special tokens only tokenizer_config.json declares) and every real
tokenizer present: the backend chosen, rows and fingerprint identical with both backends, a save
with one backend resumed with the other. A tokenizer fastokens cannot encode with falls back with a
log line; a broken fast tokenizer (one merge removed) is caught by the probe check and by the
first-documents check; worker processes import neither torch nor torchtitan.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest
from helpers import (
    SHARED_TOKENIZERS,
    data_table,
    gate_real_tokenizers,
    make_spec,
    real_tokenizer,
    special_token_strings,
    with_special_tokens,
)

from zephon_titan.config import config_from_dict
from zephon_titan.engine import ConfigError, DataError, LaneState, LaneStream, fingerprint, tokenizer_backends
from zephon_titan.engine.tokenize import BackendMismatch
from zephon_titan.engine.tokenizer_backends import (
    FastBackend,
    ReferenceBackend,
    fast_eligibility,
    first_difference,
    load_fast,
    probe_texts,
    select_backend,
)
from zephon_titan.titan.tokenizer import load_tokenizer

# Tokenizers fastokens 0.3.5 cannot encode with ("byte 0x20 has no token in vocabulary").
FAST_REFUSES = {"torchtitan_test"}


@pytest.fixture(scope="module")
def special_dir(tokenizer_dir, tmp_path_factory) -> str:
    return with_special_tokens(tokenizer_dir, str(tmp_path_factory.mktemp("special")), ["<|im_start|>", "<|x|>"])


def _tokenizer_path(name, special_dir):
    return special_dir if name == "fixture" else real_tokenizer(name)


def _corpus_with_specials(root, tokenizer_path, prose_docs):
    """A JSONL source whose documents hold the tokenizer's special-token strings."""
    specials = special_token_strings(tokenizer_path)
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "docs.jsonl"), "w", encoding="utf-8") as f:
        for i, doc in enumerate(prose_docs[:120]):
            s = specials[i % len(specials)]
            f.write(json.dumps({"text": f"{doc[:700]} {s}{doc[700:900]}\n\t  {s}"}) + "\n")
    return {"web": {"paths": [os.path.join(root, "*.jsonl")], "block_bytes": 8192}}


@pytest.mark.parametrize("name", ["fixture", *gate_real_tokenizers()])
def test_both_backends_give_the_same_rows_and_resume_each_other(name, special_dir, tmp_path, prose_docs, caplog):
    path = _tokenizer_path(name, special_dir)
    sources = _corpus_with_specials(str(tmp_path / "data"), path, prose_docs)

    def spec(backend):
        return make_spec(str(tmp_path), path, seq_len=80, sources=sources, tokenizer_backend=backend, num_lanes=2)

    with caplog.at_level(logging.INFO, logger="zephon_titan"):
        chosen = spec("auto").tokenizer.select_backend()
    if name in FAST_REFUSES:
        assert chosen == "tokenizers" and "tokenizing with tokenizers, not fastokens: fastokens cannot" in caplog.text
        with pytest.raises(ConfigError, match="tokenizer_backend = fastokens, but fastokens cannot"):
            spec("fastokens").tokenizer.select_backend()
        return
    assert chosen == "fastokens", caplog.text
    fast, slow = spec("fastokens"), spec("tokenizers")
    assert fast.tokenizer.select_backend() == "fastokens" and slow.tokenizer.select_backend() == "tokenizers"
    assert fingerprint(fast) == fingerprint(slow)  # a speed knob: not part of the data stream
    for lane in range(2):
        a, b = LaneStream(fast, lane), LaneStream(slow, lane)
        assert [r.to_bytes() for r in a.take(40)] == [r.to_bytes() for r in b.take(40)]
        assert fast.tokenizer._backend.name == "fastokens"  # still fast: the first-document check passed
        # Saved with one backend, resumed with the other (both ways): the same continuation.
        saved = {"fastokens": a.state(), "tokenizers": b.state()}
        expected = [r.to_bytes() for r in a.take(10)]
        for state, other in ((saved["fastokens"], spec("tokenizers")), (saved["tokenizers"], spec("fastokens"))):
            resumed = LaneStream(other, lane, LaneState.from_dict(json.loads(json.dumps(state.to_dict()))))
            assert [r.to_bytes() for r in resumed.take(10)] == expected


def _broken_json(tokenizer_path) -> str:
    """The tokenizer.json with its first (highest-priority) merge removed."""
    data = json.loads(load_tokenizer(tokenizer_path).tokenizer.to_str())
    data["model"]["merges"] = data["model"]["merges"][1:]
    return json.dumps(data)


def test_a_broken_fast_tokenizer_is_caught_by_the_probe_check(tokenizer_dir, caplog):
    reference = load_tokenizer(tokenizer_dir).tokenizer
    broken = _broken_json(tokenizer_dir)
    with caplog.at_level(logging.INFO, logger="zephon_titan"):
        backend, reason = select_backend(reference, "auto", loaded=load_fast(broken))
    assert backend.name == "tokenizers" and "fastokens gives other ids than tokenizers for the probe text" in reason
    assert "tokenizing with tokenizers, not fastokens" in caplog.text
    with pytest.raises(ConfigError, match="tokenizer_backend = fastokens, but fastokens gives other ids"):
        select_backend(reference, "fastokens", loaded=load_fast(broken))
    # Control: the unbroken tokenizer passes the same check.
    assert select_backend(reference, "auto")[0].name == "fastokens"


def test_a_fast_backend_that_differs_on_a_document_stops_the_run_naming_it(tokenizer_dir, tmp_path, prose_docs):
    """A difference found at run time is a hard error naming the document, never a silent switch."""
    tokenizer = load_tokenizer(tokenizer_dir, backend="auto")
    reference = load_tokenizer(tokenizer_dir, backend="tokenizers")
    tokenizer.select_backend()
    tokenizer._backend = FastBackend(_broken_json(tokenizer_dir))  # as if it had passed the probes
    with pytest.raises(BackendMismatch, match="fastokens gives other ids than tokenizers for this document") as e:
        tokenizer.encode(prose_docs[:8])
    assert reference.encode([prose_docs[e.value.index]])[0].tolist() != []  # it names one of the eight
    # Through a lane: the error names the file and line (engine/feed.py).
    sources = {"web": {"paths": [str(_write_jsonl(tmp_path / "data", prose_docs[:20]))]}}
    spec = make_spec(str(tmp_path), tokenizer_dir, seq_len=64, sources=sources, num_lanes=1)
    spec.tokenizer.select_backend()
    spec.tokenizer._backend = FastBackend(_broken_json(tokenizer_dir))
    with pytest.raises(DataError, match=r"docs\.jsonl byte offset \d+ \(source 'web'\): fastokens gives other ids"):
        LaneStream(spec, 0).take(4)
    # Control: the real fast backend encodes the same documents without a word.
    spec = make_spec(str(tmp_path), tokenizer_dir, seq_len=64, sources=sources, num_lanes=1)
    assert spec.tokenizer.select_backend() == "fastokens"
    assert len(LaneStream(spec, 0).take(4)) == 4


def test_the_runtime_check_covers_the_first_documents_until_its_character_budget(
    tokenizer_dir, prose_docs, monkeypatch
):
    """The check of a process's first documents stops once VERIFY_CHARS characters are checked (it cost
    seconds of the first step at 1,024 lanes), and the document that reaches the budget is checked whole."""
    monkeypatch.setattr(tokenizer_backends, "VERIFY_CHARS", len(prose_docs[0]) + 1)
    broken = FastBackend(_broken_json(tokenizer_dir))
    tokenizer = load_tokenizer(tokenizer_dir, backend="auto")
    assert tokenizer.select_backend() == "fastokens"
    tokenizer.encode(prose_docs[:1])  # checked: one character of the budget left
    tokenizer._backend = broken
    with pytest.raises(BackendMismatch):  # reaches the budget: checked whole
        tokenizer.encode(prose_docs[1:2])
    # Past the budget nothing is compared: what guards the ids then is the verified list (select_backend).
    tokenizer = load_tokenizer(tokenizer_dir, backend="auto")
    tokenizer.encode(prose_docs[:2])
    tokenizer._backend = broken
    reference = load_tokenizer(tokenizer_dir, backend="tokenizers")
    assert tokenizer.encode(prose_docs[2:3])[0].tolist() != reference.encode(prose_docs[2:3])[0].tolist()


def _write_jsonl(root, docs):
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "docs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    return path


@pytest.fixture
def held_load(monkeypatch):
    """Hold the fast backend's background load until the test sets the event."""
    gate = threading.Event()
    real = tokenizer_backends.load_fast

    def load_when_released(tokenizer_json):
        gate.wait(60)
        return real(tokenizer_json)

    monkeypatch.setattr(tokenizer_backends, "load_fast", load_when_released)
    return gate


def test_the_first_encode_waits_for_the_backend_load(tokenizer_dir, prose_docs, held_load):
    """No document is encoded before the backend is chosen: which backend gave a document's ids
    never depends on how long the load took."""
    tokenizer = load_tokenizer(tokenizer_dir, backend="auto")
    reference = load_tokenizer(tokenizer_dir, backend="tokenizers")
    tokenizer.start_backend()
    got = []
    encoder = threading.Thread(target=lambda: got.append(tokenizer.encode(prose_docs[:40])))
    encoder.start()
    encoder.join(1.0)
    assert encoder.is_alive() and not got  # waiting for the load, not encoding with the reference meanwhile
    held_load.set()
    encoder.join(60)
    assert tokenizer._backend.name == "fastokens"
    assert [a.tolist() for a in got[0]] == [b.tolist() for b in reference.encode(prose_docs[:40])]


# A pre-tokenizer the two regex engines read differently: `\h` is a hex digit in Oniguruma (tokenizers)
# and horizontal whitespace in PCRE2 (fastokens). Nothing in the probe set exercises it.
HEX_OR_SPACE = {"type": "Split", "pattern": {"Regex": "Q\\h"}, "behavior": "Isolated", "invert": False}
TRIGGERS = ["Qathe", "a Q the"]  # documents on which the two engines' ids differ


def _variant(tokenizer_dir: str, target, pre_tokenizer) -> str:
    """A copy of the tokenizer directory whose tokenizer.json has another pre-tokenizer."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), target / name)
    data = json.loads((target / "tokenizer.json").read_text())
    data["pre_tokenizer"] = pre_tokenizer(data["pre_tokenizer"])
    (target / "tokenizer.json").write_text(json.dumps(data))
    return str(target)


@pytest.fixture(scope="module")
def diverging_dir(tokenizer_dir, tmp_path_factory) -> str:
    """The fixture tokenizer with the \\h pre-tokenizer in front of its byte-level one."""
    return _variant(
        tokenizer_dir,
        tmp_path_factory.mktemp("diverging"),
        lambda byte_level: {"type": "Sequence", "pretokenizers": [HEX_OR_SPACE, byte_level]},
    )


def test_the_backend_is_chosen_from_the_files_never_by_sampling(tokenizer_dir, diverging_dir, caplog):
    reference = load_tokenizer(diverging_dir).tokenizer
    fast, ref = FastBackend(reference.to_str()), ReferenceBackend(reference)
    # Control: this fast tokenizer passes every probe and still gives other ids on ordinary-looking text,
    # so a check by sampling (probes, first documents) lets it through.
    assert first_difference(ref, fast, probe_texts(reference)) is None
    assert all(first_difference(ref, fast, [t]) == 0 for t in TRIGGERS)
    with caplog.at_level(logging.INFO, logger="zephon_titan"):
        backend, reason = select_backend(reference, "auto")
    assert backend.name == "tokenizers" and "is not on the verified list" in reason and "Q\\\\h" in reason
    assert caplog.text.count("tokenizing with tokenizers, not fastokens: fastokens is not verified") == 1
    with pytest.raises(ConfigError, match="tokenizer_backend = fastokens, but fastokens is not verified for this"):
        select_backend(reference, "fastokens")
    # The fixture tokenizer (byte-level, GPT-2's shape) is on the list.
    assert fast_eligibility(load_tokenizer(tokenizer_dir).tokenizer.to_str()) is None


@pytest.mark.parametrize("name", ["fixture", *gate_real_tokenizers()])
def test_the_verified_list_admits_the_fields_tokenizers(name, special_dir):
    data = json.loads(load_tokenizer(_tokenizer_path(name, special_dir)).tokenizer.to_str())
    assert fast_eligibility(json.dumps(data)) is None
    # Controls: each part of the structure is compared.
    for part, value in (
        ("normalizer", {"type": "NFKC"}),
        ("pre_tokenizer", {"type": "ByteLevel", "add_prefix_space": True}),
    ):
        assert "not on the verified list" in fast_eligibility(json.dumps({**data, part: value}))
    model = {**data["model"], "byte_fallback": True}
    assert "model settings" in fast_eligibility(json.dumps({**data, "model": model}))
    added = [{"id": 0, "content": "<x>", "lstrip": True, "rstrip": False, "single_word": False}]
    assert "sets lstrip" in fast_eligibility(json.dumps({**data, "added_tokens": added}))


def test_a_fastokens_release_other_than_the_verified_one_is_not_used(tokenizer_dir, monkeypatch):
    monkeypatch.setattr(tokenizer_backends, "fastokens_version", lambda: "0.4.0")
    backend, reason = select_backend(load_tokenizer(tokenizer_dir).tokenizer, "auto")
    assert backend.name == "tokenizers" and "fastokens 0.4.0 is installed; the verified list is for" in reason


def _hex_or_space_job(tmp_path, diverging_dir, prose_docs, workers: int) -> str:
    """A job whose documents exercise the \\h pre-tokenizer only late: 400 documents of 100 characters of
    real text in file order, a trigger in every 20th from the 301st on."""
    data = tmp_path / "hex"
    if not data.exists():
        text = "".join(prose_docs)
        docs = [text[i : i + 100] for i in range(0, 100 * 400, 100)]
        for i in range(300, len(docs), 20):
            docs[i] = f"{docs[i][:50]} {TRIGGERS[i % 2]} {docs[i][50:]}"
        _write_jsonl(data, docs)
    path = tmp_path / f"hex_{workers}.toml"
    path.write_text(f"""
hf_assets_path = "{diverging_dir}"
[model]
module = "llama3"
config = "llama3_debugmodel"
[training]
seq_len = 64
global_batch_size = 8
local_batch_size = 8
[dataloader]
num_lanes = 1
num_workers = {workers}
shuffle = false  # file order: the first trigger is the 301st document
[dataloader.sources.web]
paths = ["{data}/docs.jsonl"]
block_bytes = 1000000
""")
    return str(path)


def test_rows_do_not_depend_on_timing_workers_or_what_is_installed(tmp_path, diverging_dir, prose_docs, monkeypatch):
    """The attack's shape: `plan` of a job whose tokenizer the two engines read differently, on documents
    that exercise it only after the first 256, run in process (three times, the load fast or held back),
    with a worker, and on a machine without fastokens: one ledger."""
    from zephon_titan.plan import plan_ledger

    steps = 40  # 320 rows of 64 tokens (~20k): past the 300th document (~15k)

    def ledger(workers=0):
        return [e.sha256 for e in plan_ledger(_hex_or_space_job(tmp_path, diverging_dir, prose_docs, workers), steps)]

    reference = ledger()
    assert len(reference) == steps
    assert ledger() == reference
    assert ledger(workers=1) == reference
    slow_load = tokenizer_backends.load_fast
    monkeypatch.setattr(
        tokenizer_backends, "load_fast", lambda text: (__import__("time").sleep(1.0), slow_load(text))[1]
    )
    assert ledger() == reference
    monkeypatch.setattr(tokenizer_backends, "fastokens_version", lambda: None)  # as if it were not installed
    assert ledger() == reference
    # Negative control: had fastokens been trusted for this tokenizer, the rows would differ.
    monkeypatch.setattr(tokenizer_backends, "fastokens_version", lambda: tokenizer_backends.FASTOKENS_VERSION)
    monkeypatch.setattr(tokenizer_backends, "fast_eligibility", lambda text: None)
    monkeypatch.setattr(tokenizer_backends, "VERIFY_DOCUMENTS", 0)  # the runtime check is a test of its own
    assert ledger() != reference


@pytest.mark.parametrize("name", ["fixture", "gpt2"])
def test_a_process_that_exits_while_the_fast_backend_loads_exits_cleanly(name, special_dir):
    # The load runs in Rust without the GIL; at exit Python stops daemon threads and one stopped
    # inside Rust aborts the process ("FATAL: exception not rethrown", exit code 134: seen with GPT-2).
    script = textwrap.dedent(
        f"""
        from zephon_titan.titan.tokenizer import load_tokenizer
        tokenizer = load_tokenizer({_tokenizer_path(name, special_dir)!r}, backend="auto")
        tokenizer.start_backend()
        print(len(tokenizer.encode(["exits at once"])[0]))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "FATAL" not in out.stderr, (out.returncode, out.stderr[-2000:])


@pytest.fixture(scope="module")
def refused_dir(tokenizer_dir, tmp_path_factory) -> str:
    """The fixture tokenizer with a pre-tokenizer off fastokens' verified list (Whitespace)."""
    return _variant(tokenizer_dir, tmp_path_factory.mktemp("refused"), lambda _: {"type": "Whitespace"})


@pytest.mark.parametrize("workers", [0, 2])
def test_the_trainers_loader_says_its_backend_before_the_first_batch(corpus_dir, refused_dir, workers, caplog):
    from zephon_titan.titan.dataloader import ZephonDataLoader

    def first_batch(backend):
        data = config_from_dict(data_table(corpus_dir, refused_dir, tokenizer_backend=backend, num_workers=workers))
        config = ZephonDataLoader.Config(data=data, global_batch_size=8)
        loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=8)
        return next(iter(loader))

    with caplog.at_level(logging.INFO):
        first_batch("auto")
    if workers:  # each worker chose and checked its own; this process says it once, naming them
        assert caplog.text.count("tokenizer backend tokenizers (fastokens is not verified for this tokenizer") == 1
        assert "(loader workers 0, 1)" in caplog.text
    else:
        assert caplog.text.count("tokenizing with tokenizers, not fastokens: fastokens is not verified for this") == 1
        assert "tokenizer backend tokenizers (fastokens is not verified for this tokenizer" in caplog.text
    with pytest.raises(ConfigError, match="tokenizer_backend = fastokens, but fastokens is not verified for this"):
        first_batch("fastokens")


def test_backend_setting_is_checked(corpus_dir, tokenizer_dir):
    with pytest.raises(ConfigError, match="tokenizer_backend must be one of auto, tokenizers, fastokens, got 'rust'"):
        config_from_dict(data_table(corpus_dir, tokenizer_dir, tokenizer_backend="rust"))


def test_worker_processes_import_neither_torch_nor_torchtitan(corpus_dir, tokenizer_dir, tmp_path):
    # A parent script that has imported torch and torchtitan (as the trainer has) starts 2 workers; a
    # spawned child would re-import that script as its main module, unless the engine prevents it.
    script = textwrap.dedent(
        f"""
        import sys, torch, torchtitan
        sys.path.insert(0, {os.path.join(os.path.dirname(__file__), "..")!r})
        from helpers import make_spec
        from zephon_titan.engine import open_lane_group

        if __name__ == "__main__":
            spec = make_spec({corpus_dir!r}, {tokenizer_dir!r})
            with open_lane_group(spec, range(8), 2, num_workers=2) as group:
                group.next_step()
                for proc in group._procs:
                    maps = open(f"/proc/{{proc.pid}}/maps").read()
                    rss = next(l for l in open(f"/proc/{{proc.pid}}/status") if l.startswith("VmRSS"))
                    print(proc.pid, "torch" in maps, rss.split()[1])
        """
    )
    (tmp_path / "parent.py").write_text(script)
    out = subprocess.run([sys.executable, "parent.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    workers = [line.split() for line in out.stdout.splitlines()]
    assert len(workers) == 2
    for pid, has_torch, rss_kb in workers:
        print(f"worker {pid}: torch mapped {has_torch}, RSS {int(rss_kb) // 1024} MB")
        assert has_torch == "False"  # no torch library or module file is mapped into the worker


def test_validate_check_tokenizer_compares_every_document(tmp_path, corpus_dir, tokenizer_dir, capsys):
    from test_cli import _job

    from zephon_titan.cli import main
    from zephon_titan.cli.check_tokenizer import check_tokenizer
    from zephon_titan.titan.job import load_job

    job = _job(tmp_path, corpus_dir, tokenizer_dir)
    assert main(["validate", job, "--check-tokenizer"]) == 0
    out = capsys.readouterr().out
    assert "backend: fastokens (a verified configuration; matches tokenizers on" in out
    assert "fastokens and tokenizers give the same ids for all" in out
    # Negative control: a fast tokenizer with one merge removed is caught, naming the file and row.
    assert check_tokenizer(load_job(job).spec, fast_json=_broken_json(tokenizer_dir)) == 1
    assert "first difference: " in capsys.readouterr().out


def test_with_workers_the_trainer_process_loads_no_fast_backend(corpus_dir, tokenizer_dir, caplog):
    """The workers tokenize: they load and check fastokens, and say so through the trainer process, which
    keeps only the reference (for the fingerprint) and spends neither the load nor its memory."""
    from zephon_titan.titan.dataloader import ZephonDataLoader

    data = config_from_dict(data_table(corpus_dir, tokenizer_dir, tokenizer_backend="auto", num_workers=2))
    loader = ZephonDataLoader.Config(data=data, global_batch_size=8).build(
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=8
    )
    try:
        with caplog.at_level(logging.INFO):
            next(iter(loader))
        assert caplog.text.count("tokenizer backend fastokens (a verified configuration; matches tokenizers on") == 1
        assert "(loader workers 0, 1)" in caplog.text
        assert loader.spec.tokenizer._backend is None and loader.spec.tokenizer._loading is None
    finally:
        loader.close()


@pytest.mark.parametrize("backend", ["auto", "tokenizers"])
def test_truncation_or_padding_in_tokenizer_json_never_cuts_or_pads_a_document(tokenizer_dir, tmp_path, backend):
    data = json.loads(load_tokenizer(tokenizer_dir).tokenizer.to_str())
    data["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None,
                       "pad_id": 0, "pad_type_id": 0, "pad_token": "<|pad|>"}  # fmt: skip
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), tmp_path / name)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    texts = ["a short one", "a much longer document of many words than the first " * 3]
    # Control: the tokenizers library itself truncates and pads with this file.
    raw = load_tokenizer(str(tmp_path)).tokenizer.__class__.from_str(json.dumps(data))
    assert [len(e.ids) for e in raw.encode_batch(texts, add_special_tokens=False)] == [4, 4]
    plain, loaded = load_tokenizer(tokenizer_dir, backend=backend), load_tokenizer(str(tmp_path), backend=backend)
    assert [a.tolist() for a in loaded.encode(texts)] == [a.tolist() for a in plain.encode(texts)]
    assert loaded.digest() == plain.digest()  # the same ids: the same data stream


def _real_texts(prose_docs, code_docs) -> list[str]:
    """The shared corpora (C4, Wikipedia, Gutenberg, ...) where present, and always the standard library."""
    texts = list(prose_docs) + list(code_docs)
    corpora = os.path.join(os.path.dirname(os.path.dirname(SHARED_TOKENIZERS)), "data", "corpus")
    for root, _, files in os.walk(corpora):
        for name in sorted(files):
            if name.endswith(".jsonl"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    texts += [v for line in f for v in json.loads(line).values() if isinstance(v, str)][:20000]
    return texts


@pytest.mark.slow
@pytest.mark.parametrize("pre_tokenizer", sorted(tokenizer_backends.VERIFIED))
def test_every_verified_configuration_matches_the_reference_on_real_text(
    pre_tokenizer, tokenizer_dir, prose_docs, code_docs
):
    """The evidence behind VERIFIED: each pre-tokenizer, with each verified normalizer and both
    ignore_merges settings, over a real vocabulary (OLMo-2's or GPT-2's where present, else the
    fixture's) and every real text at hand."""
    byte_level = tokenizer_backends.VERIFIED[pre_tokenizer]["type"] == "ByteLevel"
    shared = os.path.join(SHARED_TOKENIZERS, "gpt2" if byte_level else "olmo2_dolma2", "tokenizer.json")
    base = json.loads(
        open(shared).read() if os.path.isfile(shared) else load_tokenizer(tokenizer_dir).tokenizer.to_str()
    )
    texts = _real_texts(prose_docs, code_docs) + probe_texts(load_tokenizer(tokenizer_dir).tokenizer)
    for normalizer in tokenizer_backends.VERIFIED_NORMALIZERS:
        for ignore_merges in (False, True):
            canonical = json.dumps(tokenizer_backends.VERIFIED[pre_tokenizer])  # + what the library needs to load it
            loadable = json.loads(canonical.replace('"type": "ByteLevel"', '"type": "ByteLevel", "trim_offsets": true'))
            data = {**base, "normalizer": normalizer, "pre_tokenizer": loadable}
            data["model"] = {**base["model"], "ignore_merges": ignore_merges}
            text = json.dumps(data)
            assert fast_eligibility(text) is None
            reference = ReferenceBackend(load_tokenizer(tokenizer_dir).tokenizer.from_str(text))
            bad = first_difference(reference, FastBackend(text), texts)
            assert bad is None, (normalizer, ignore_merges, texts[bad][:200])
