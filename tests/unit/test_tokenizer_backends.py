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
from helpers import REAL_TOKENIZERS, data_table, make_spec, real_tokenizer, special_token_strings, with_special_tokens

from zephon_titan.config import config_from_dict
from zephon_titan.engine import ConfigError, LaneState, LaneStream, fingerprint, tokenizer_backends
from zephon_titan.engine.tokenizer_backends import (
    VERIFY_DOCUMENTS,
    FastBackend,
    ReferenceBackend,
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


@pytest.mark.parametrize("name", ["fixture", *REAL_TOKENIZERS])
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


def test_a_fast_backend_that_differs_on_a_document_is_replaced_by_the_reference(tokenizer_dir, prose_docs, caplog):
    tokenizer = load_tokenizer(tokenizer_dir, backend="auto")
    reference = load_tokenizer(tokenizer_dir, backend="tokenizers")
    tokenizer.select_backend()
    tokenizer._backend = FastBackend(_broken_json(tokenizer_dir))  # as if it had passed the probes
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        got = tokenizer.encode(prose_docs[:8])
    assert [g.tolist() for g in got] == [r.tolist() for r in reference.encode(prose_docs[:8])]
    assert "fastokens gave other ids than tokenizers for a document" in caplog.text
    assert tokenizer._backend.name == "tokenizers"


def _broken_beyond_probes(tokenizer_path, texts) -> str:
    """The tokenizer.json with one merge removed that no probe text needs and one of `texts` does:
    a fast tokenizer the probe check passes and a document check must catch."""
    reference = load_tokenizer(tokenizer_path).tokenizer
    data = json.loads(reference.to_str())
    ref, probes = ReferenceBackend(reference), probe_texts(reference)
    in_texts, in_probes = (set(ref.encode_flat(t)[0].tolist()) for t in (texts, probes))
    vocab = data["model"]["vocab"]
    for i, (a, b) in enumerate(data["model"]["merges"]):
        if vocab.get(a + b) not in in_texts - in_probes:  # candidates: tokens only the texts end with
            continue
        broken = json.loads(json.dumps(data))
        del broken["model"]["merges"][i]
        fast = FastBackend(json.dumps(broken))
        if first_difference(ref, fast, texts) is not None and first_difference(ref, fast, probes) is None:
            return json.dumps(broken)
    raise AssertionError("no merge is needed by the texts and not by the probes")


@pytest.fixture
def held_load(monkeypatch):
    """Hold the fast backend's background load until the test sets the event; `held_load.json` (if
    set) is loaded instead of the tokenizer's own tokenizer.json. The real load runs then."""
    gate = threading.Event()
    gate.json = None
    real = tokenizer_backends.load_fast

    def load_when_released(tokenizer_json):
        gate.wait(60)
        return real(gate.json or tokenizer_json)

    monkeypatch.setattr(tokenizer_backends, "load_fast", load_when_released)
    return gate


def test_the_reference_tokenizes_while_the_fast_backend_loads(tokenizer_dir, prose_docs, held_load):
    tokenizer = load_tokenizer(tokenizer_dir, backend="auto")
    reference = load_tokenizer(tokenizer_dir, backend="tokenizers")
    tokenizer.start_backend()
    first = tokenizer.encode(prose_docs[:40])
    assert tokenizer._backend is None  # still loading: these are the reference's own ids
    held_load.set()
    tokenizer._loading.join()
    second = tokenizer.encode(prose_docs[40:70])
    assert tokenizer._backend.name == "fastokens"
    # Checked on the 40 documents the reference did while it loaded, then on the next 30 as usual.
    assert tokenizer._verify_left == VERIFY_DOCUMENTS - 70
    assert [a.tolist() for a in first + second] == [b.tolist() for b in reference.encode(prose_docs[:70])]


def test_documents_tokenized_while_the_fast_backend_loads_are_its_first_check(
    tokenizer_dir, prose_docs, held_load, caplog
):
    broken = _broken_beyond_probes(tokenizer_dir, prose_docs[:40])
    # Control: the probe check alone lets this fast tokenizer through.
    chosen, _ = select_backend(load_tokenizer(tokenizer_dir).tokenizer, "auto", loaded=FastBackend(broken))
    assert chosen.name == "fastokens"
    tokenizer = load_tokenizer(tokenizer_dir, backend="auto")
    reference = load_tokenizer(tokenizer_dir, backend="tokenizers")
    tokenizer.start_backend()
    first = tokenizer.encode(prose_docs[:40])  # by the reference: the broken backend is not loaded yet
    held_load.json = broken
    held_load.set()
    tokenizer._loading.join()
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        second = tokenizer.encode(["plain words", "that every merge list handles"])  # no difference here
    assert "fastokens gave other ids than tokenizers for a document" in caplog.text  # found in the first 40
    assert tokenizer._backend.name == "tokenizers"
    expected = reference.encode(prose_docs[:40] + ["plain words", "that every merge list handles"])
    assert [a.tolist() for a in first + second] == [b.tolist() for b in expected]


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
    """The fixture tokenizer with a pre-tokenizer fastokens does not support (Whitespace)."""
    target = tmp_path_factory.mktemp("refused")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), target / name)
    data = json.loads((target / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Whitespace"}
    (target / "tokenizer.json").write_text(json.dumps(data))
    return str(target)


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
        assert caplog.text.count("tokenizer backend tokenizers (fastokens cannot load") == 1
        assert "(loader workers 0, 1)" in caplog.text
    else:
        assert caplog.text.count("tokenizing with tokenizers, not fastokens: fastokens cannot load this tokenizer") == 1
        assert "tokenizer backend tokenizers (fastokens cannot load" in caplog.text
    with pytest.raises(ConfigError, match="tokenizer_backend = fastokens, but fastokens cannot load this tokenizer"):
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

    from zephon_titan.cli import _check_tokenizer, main
    from zephon_titan.titan.job import load_job

    job = _job(tmp_path, corpus_dir, tokenizer_dir)
    assert main(["validate", job, "--check-tokenizer"]) == 0
    out = capsys.readouterr().out
    assert "backend: fastokens (matches tokenizers on" in out
    assert "fastokens and tokenizers give the same ids for all" in out
    # Negative control: a fast tokenizer with one merge removed is caught, naming the file and row.
    assert _check_tokenizer(load_job(job).spec, fast_json=_broken_json(tokenizer_dir)) == 1
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
        assert caplog.text.count("tokenizer backend fastokens (matches tokenizers on") == 1
        assert "(loader workers 0, 1)" in caplog.text
        assert loader.spec.tokenizer._backend is None and loader.spec.tokenizer._loading is None
    finally:
        loader.close()
