"""The config schema (config/): every field says whether it shapes the rows, and the fingerprint agrees.

For each field, one change from the base job (data_table: code Parquet + prose JSONL) to another valid
value: a field declared rows=True must change fingerprint(build_engine(...)), a rows=False field must not.
A field that matters only in some configurations (held-out data, best_fit, a Lance or Parquet source, a
registered format) is changed in a base job that has that configuration, as its Setting's rows_note says.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import LINES, data_table, registered_format, spec_of, with_special_tokens
from token_files import write_olmo

from zephon_titan.config import DataConfig, PhaseConfig, SourceConfig, config_from_dict, eval_rules, settings
from zephon_titan.engine import fingerprint

CLASSES = (DataConfig, SourceConfig, PhaseConfig)
FIELDS = [f"{cls.__name__}.{f.name}" for cls in CLASSES for f in dataclasses.fields(cls)]


def test_every_field_declares_whether_it_shapes_the_rows():
    undeclared = [
        f"{cls.__name__}.{f.name}"
        for cls in CLASSES
        for f in dataclasses.fields(cls)
        if not isinstance(f.metadata.get("setting") and f.metadata["setting"].rows, bool)
    ]
    assert not undeclared, f"declare each with setting(..., rows=True or False) in config/: {undeclared}"


class Job:
    """The fixtures a change needs: the base [dataloader] table and the files beside the corpus."""

    def __init__(self, corpus_dir: str, tokenizer_dir: str, extra: dict[str, str]):
        self.corpus_dir, self.tokenizer_dir, self.extra = corpus_dir, tokenizer_dir, extra

    def table(self, **overrides) -> dict:
        return copy.deepcopy(data_table(self.corpus_dir, self.tokenizer_dir, **overrides))

    def held_out(self, **overrides) -> dict:
        """Both sources hold documents out (so that split and split_seed select something)."""
        table = self.table(**overrides)
        for source in table["sources"].values():
            source["eval_fraction"] = 0.2
        return table

    def phased(self) -> dict:
        """Two phases; the weights come from them."""
        table = self.table()
        for source in table["sources"].values():
            source.pop("weight")
        table["phases"] = [
            {"start_step": 1, "weights": {"code": 1.0, "prose": 1.0}},
            {"start_step": 10, "weights": {"code": 1.0, "prose": 3.0}, "ramp_steps": 0},
        ]
        return table

    def excluding(self, lines: str = "prose x.jsonl 0\n", **overrides) -> dict:
        """Documents excluded from step 3 by a list of `lines` (written beside the other files)."""
        path = os.path.join(os.path.dirname(self.extra["parquet"]), f"exclude-{abs(hash(lines))}.txt")
        with open(path, "w") as f:
            f.write(lines)
        return self.table(**{"exclude": path, "exclude_from_step": 3, **overrides})

    def parquet(self, **source) -> dict:
        """The code source read from a Parquet file with a second text column and a token-id column."""
        return self.table(sources={**self.table()["sources"], "code": {"paths": [self.extra["parquet"]], **source}})

    def lance(self, **source) -> dict:
        return self.table(sources={**self.table()["sources"], "code": {"paths": [self.extra["lance"]], **source}})

    def chat(self, **source) -> dict:
        """The code source as chat: a JSON Lines file of conversations, the tokenizer with a chat template."""
        chat = {"paths": [self.extra["chat"]], "chat": True, **source}
        table = self.table(packing="best_fit", tokenizer_path=self.extra["chat_tokenizer"])
        return self.table(packing="best_fit", tokenizer_path=self.extra["chat_tokenizer"],
                          sources={**table["sources"], "code": chat})  # fmt: skip

    def olmo(self, **source) -> dict:
        """The code source read from an OLMo token file (uint16, documents ending with id 0)."""
        olmo = {"paths": [self.extra["olmo"]], "eos_token_id": 0, **source}
        return self.table(sources={**self.table()["sources"], "code": olmo})


def _set(table: dict, path: str, value) -> dict:
    """A copy of `table` with the key at `path` ("a.b.c"; "-" removes it) set to `value`."""
    table = copy.deepcopy(table)
    *parents, key = path.split(".")
    node = table
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value == "-":
        del node[key]
    else:
        node[key] = value
    return table


def _renamed_prose(table: dict) -> dict:
    table = copy.deepcopy(table)
    table["sources"]["text"] = table["sources"].pop("prose")
    return table


def _bos_or_eos(key: str) -> Callable[[Job], tuple[dict, dict]]:
    """Unset means "as the tokenizer says": set to the other choice."""

    def change(job: Job) -> tuple[dict, dict]:
        base = job.table()
        tokenizer = spec_of(config_from_dict(base), 64).tokenizer
        adds = (tokenizer.bos_id if key == "add_bos" else tokenizer.eos_id) is not None
        return base, _set(base, key, not adds)

    return change


def _same(job: Job, path: str, value) -> tuple[dict, dict]:
    return job.table(), _set(job.table(), path, value)


# field -> (the base table, the changed table). A new field needs a way to change it here.
CHANGES: dict[str, Callable[[Job], tuple[dict, dict]]] = {
    "DataConfig.sources": lambda job: (job.table(), _set(job.table(), "sources.code", "-")),
    "DataConfig.phases": lambda job: (
        _set(_set(job.table(), "sources.code.weight", "-"), "sources.prose.weight", "-"),
        _set(
            _set(_set(job.table(), "sources.code.weight", "-"), "sources.prose.weight", "-"),
            "phases",
            [{"start_step": 1, "weights": {"code": 1.0, "prose": 2.0}}],
        ),
    ),
    "DataConfig.num_lanes": lambda job: _same(job, "num_lanes", 4),
    "DataConfig.seed": lambda job: _same(job, "seed", 8),
    "DataConfig.split_seed": lambda job: (job.held_out(), job.held_out(split_seed=1)),
    "DataConfig.split": lambda job: (job.held_out(), job.held_out(split="eval")),
    "DataConfig.packing": lambda job: _same(job, "packing", "best_fit"),
    "DataConfig.mix_chunk_tokens": lambda job: _same(job, "mix_chunk_tokens", 32),
    "DataConfig.labels": lambda job: _same(job, "labels", "stream"),
    "DataConfig.shuffle": lambda job: _same(job, "shuffle", False),
    "DataConfig.exhaustion": lambda job: _same(job, "exhaustion", "redistribute"),
    "DataConfig.shuffle_window_blocks": lambda job: _same(job, "shuffle_window_blocks", 3),
    "DataConfig.best_fit_window_docs": lambda job: (
        job.table(packing="best_fit"),
        job.table(packing="best_fit", best_fit_window_docs=16),
    ),
    "DataConfig.best_fit_mixing": lambda job: (
        job.table(packing="best_fit"),
        job.table(packing="best_fit", best_fit_mixing="per_window"),
    ),
    "DataConfig.mix_by": lambda job: (job.chat(), _set(job.chat(), "mix_by", "targets")),
    "DataConfig.homogeneous_rows": lambda job: (job.chat(), _set(job.chat(), "homogeneous_rows", True)),
    "DataConfig.exclude": lambda job: (job.excluding("code a.parquet 1\n"), job.excluding("code a.parquet 2\n")),
    "DataConfig.exclude_from_step": lambda job: (job.excluding(), job.excluding(exclude_from_step=4)),
    "DataConfig.pipeline_from_step": lambda job: (
        _set(job.table(), "sources.prose.keep", "chars > 100"),
        _set(job.table(pipeline_from_step=5), "sources.prose.keep", "chars > 100"),
    ),
    "DataConfig.tokenizer_path": lambda job: _same(job, "tokenizer_path", job.extra["tokenizer"]),
    "DataConfig.add_bos": _bos_or_eos("add_bos"),
    "DataConfig.add_eos": _bos_or_eos("add_eos"),
    "DataConfig.tokenizer_backend": lambda job: _same(job, "tokenizer_backend", "tokenizers"),
    "DataConfig.num_workers": lambda job: _same(job, "num_workers", 2),
    "DataConfig.prefetch_factor": lambda job: _same(job, "prefetch_factor", 5),
    "DataConfig.max_document_chars": lambda job: _same(job, "max_document_chars", 1 << 24),
    # The s3_* settings are read only for s3:// paths: on local files they are set and ignored, and with
    # s3:// paths the fingerprint holds the files' locations, not the endpoint (test_object_storage*).
    "DataConfig.s3_endpoint_url": lambda job: _same(job, "s3_endpoint_url", "http://127.0.0.1:9"),
    "DataConfig.s3_region": lambda job: _same(job, "s3_region", "eu-west-1"),
    "DataConfig.s3_anonymous": lambda job: _same(job, "s3_anonymous", True),
    # The node cache holds copies of objects under their listed size and mtime (test_node_cache.py); local files
    # never go through it.
    "DataConfig.cache_dir": lambda job: _same(job, "cache_dir", job.extra["index"] + ".cache"),
    "DataConfig.cache_max_bytes": lambda job: _same(job, "cache_max_bytes", 1 << 20),
    "DataConfig.resume_allow": lambda job: _same(job, "resume_allow", ["mtimes", "locations"]),
    "SourceConfig.name": lambda job: (job.table(), _renamed_prose(job.table())),
    "SourceConfig.paths": lambda job: _same(
        job, "sources.prose.paths", [os.path.join(job.corpus_dir, "prose", "part-0000[01].jsonl")]
    ),
    "SourceConfig.weight": lambda job: _same(job, "sources.prose.weight", 0.5),
    "SourceConfig.text_field": lambda job: (job.parquet(), job.parquet(text_field="reversed")),
    "SourceConfig.token_field": lambda job: (job.parquet(), job.parquet(token_field="tokens")),
    "SourceConfig.format": lambda job: _same(job, "sources.prose.format", "lines"),  # a registered format
    "SourceConfig.block_bytes": lambda job: _same(job, "sources.prose.block_bytes", 8192),
    "SourceConfig.block_rows": lambda job: (job.lance(), job.lance(block_rows=7)),
    "SourceConfig.token_dtype": lambda job: (job.olmo(), job.olmo(token_dtype="uint8")),
    "SourceConfig.eos_token_id": lambda job: (job.olmo(), job.olmo(eos_token_id=1)),
    "SourceConfig.eval_fraction": lambda job: _same(job, "sources.prose.eval_fraction", 0.2),
    "SourceConfig.keep": lambda job: _same(job, "sources.prose.keep", "chars > 100"),
    "SourceConfig.repeat": lambda job: _same(job, "sources.prose.repeat", "0.5"),
    "SourceConfig.transform": lambda job: _same(job, "sources.prose.transform", ["pipeline_transforms:drop_short"]),
    "SourceConfig.chat": lambda job: (_set(job.chat(), "sources.code.chat", False), job.chat()),
    "SourceConfig.messages_field": lambda job: (job.chat(), job.chat(messages_field="other")),
    "SourceConfig.prompt_field": lambda job: (
        job.chat(prompt_field="q", response_field="a"),
        job.chat(prompt_field="a", response_field="a"),
    ),
    "SourceConfig.response_field": lambda job: (
        job.chat(prompt_field="q", response_field="a"),
        job.chat(prompt_field="q", response_field="q"),
    ),
    "SourceConfig.chat_template": lambda job: (job.chat(), job.chat(chat_template=job.extra["template"])),
    "SourceConfig.loss_on": lambda job: (job.chat(), job.chat(loss_on="all")),
    "SourceConfig.too_long": lambda job: (job.chat(), job.chat(too_long="truncate")),
    "SourceConfig.index": lambda job: _same(job, "sources.prose.index", job.extra["index"]),
    "PhaseConfig.start_step": lambda job: (job.phased(), _set(job.phased(), "phases.1.start_step", 20)),
    "PhaseConfig.weights": lambda job: (job.phased(), _set(job.phased(), "phases.1.weights.prose", 2.0)),
    "PhaseConfig.ramp_steps": lambda job: (job.phased(), _set(job.phased(), "phases.1.ramp_steps", 5)),
    "PhaseConfig.seq_len": lambda job: (job.phased(), _set(job.phased(), "phases.1.seq_len", 32)),
}


def test_every_field_has_a_change():
    assert sorted(CHANGES) == sorted(FIELDS), "add a way to change the new field to CHANGES"


@pytest.fixture(scope="module")
def job(tmp_path_factory, corpus_dir, tokenizer_dir, prose_docs) -> Job:
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("schema")
    docs = prose_docs[:60]
    ids = [e.ids for e in Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json")).encode_batch(docs)]
    parquet = str(root / "docs.parquet")
    columns = {"text": docs, "reversed": [d[::-1] for d in docs], "tokens": pa.array(ids, type=pa.list_(pa.int32()))}
    pq.write_table(pa.table(columns), parquet, row_group_size=8)
    lance = pytest.importorskip("lance")
    lance.write_dataset(pa.table({"text": docs}), str(root / "docs.lance"))
    # Another tokenizer: the fixture's, with one more special token (as a model repository may declare).
    other = with_special_tokens(tokenizer_dir, str(root / "tokenizer"), ["<|extra|>"])
    extra = {"parquet": parquet, "lance": str(root / "docs.lance"), "tokenizer": other, "index": str(root / "i.json")}
    # Conversations (two fields of them, and one question and answer), a tokenizer with a template, another one.
    extra["chat"] = str(root / "chat.jsonl")
    with open(extra["chat"], "w") as f:
        for d in docs[:20]:
            turns = [{"role": "user", "content": d[:80]}, {"role": "assistant", "content": d[80:200]}]
            record = {"text": d, "messages": turns, "other": turns[::-1][1:] + turns, "q": d[:50], "a": d[50:90]}
            f.write(json.dumps(record) + "\n")
    extra["chat_tokenizer"] = with_special_tokens(tokenizer_dir, str(root / "chat_tokenizer"), [])
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    with open(os.path.join(extra["chat_tokenizer"], "chat_template.jinja"), "w") as f:
        f.write(template + "{% if add_generation_prompt %}<assistant>{% endif %}")
    extra["template"] = str(root / "other.jinja")
    with open(extra["template"], "w") as f:
        f.write(template.replace("\n", " ") + "{% if add_generation_prompt %}<assistant>{% endif %}")
    # A document [1] first: eos_token_id = 1 (the changed setting) then still names an id of the first ones.
    extra["olmo"] = write_olmo(str(root / "docs.npy"), [[1], *ids], eos=0)
    return Job(corpus_dir, tokenizer_dir, extra)


def _fingerprint(table: dict) -> dict[str, str]:
    return fingerprint(spec_of(config_from_dict(table), 64))


@pytest.mark.parametrize("name", FIELDS)
def test_the_fingerprint_changes_exactly_with_the_fields_that_shape_rows(job, name):
    cls, key = name.split(".")
    declared = settings({c.__name__: c for c in CLASSES}[cls])[key]
    base, changed = CHANGES[name](job)
    assert base != changed
    with registered_format(LINES):
        before, after = _fingerprint(base), _fingerprint(changed)
    if declared.rows:
        assert before != after, f"{name} is declared rows=True, but changing it leaves the fingerprint as it was"
    else:
        assert before == after, f"{name} is declared rows=False, but changing it changes the fingerprint"


@pytest.mark.parametrize(
    "path, value",
    [
        ("sources.prose.format", "jsonl"),  # what auto resolves to
        ("mix_chunk_tokens", 64),  # what 0 means at seq_len 64
        ("tokenizer_path", "copy"),  # the same tokenizer, read from elsewhere
    ],
)
def test_a_value_equal_to_what_the_default_resolves_to_keeps_the_fingerprint(job, tmp_path, path, value):
    """The rows_notes: these fields are fingerprinted by what they resolve to, not as written."""
    if value == "copy":
        value = str(shutil.copytree(job.tokenizer_dir, tmp_path / "copy"))
    assert _fingerprint(job.table()) == _fingerprint(_set(job.table(), path, value))


# ---- the eval set ([validator.dataloader]) reads the schema's Eval rules ----------------------------------

_JOB = '[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n'
# A value other than the default for each [dataloader] key a training job may set (split needs held-out data).
_TRAINING = {
    "num_lanes": 4, "seed": 5, "split_seed": 3, "packing": "best_fit", "mix_chunk_tokens": 32, "labels": "stream",
    "shuffle": False, "shuffle_window_blocks": 3, "best_fit_window_docs": 16, "tokenizer_path": "tok",
    "add_bos": False, "add_eos": True, "tokenizer_backend": "tokenizers", "num_workers": 2, "prefetch_factor": 3,
    "max_document_chars": 1000, "s3_endpoint_url": "http://host", "s3_region": "r", "s3_anonymous": True,
    "resume_allow": ["mtimes"], "exclude": "list.txt", "exclude_from_step": 3, "pipeline_from_step": 4,
    "homogeneous_rows": True, "mix_by": "targets", "cache_dir": "/tmp/cache", "cache_max_bytes": 1 << 30,
}  # fmt: skip


def _toml(table: dict) -> str:
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in table.items())


def test_the_eval_set_inherits_as_the_schema_says(tmp_path):
    from zephon_titan.titan.job import read_job_config

    assert set(_TRAINING) | {"sources", "phases", "split", "exhaustion", "best_fit_mixing"} == set(settings(DataConfig))
    path = tmp_path / "job.toml"
    path.write_text(
        _JOB + "[dataloader]\n" + _toml(_TRAINING) + '[dataloader.sources.a]\npaths = ["a.jsonl"]\n'
        '[validator]\nenable = true\n[validator.dataloader.sources.e]\npaths = ["e.jsonl"]\n'
    )
    config = read_job_config(str(path))
    train, evaluation = config.dataloader.data, config.validator.dataloader.data
    defaults = DataConfig()
    for key, rule in eval_rules().items():
        if key not in settings(DataConfig) or key in ("sources", "phases"):
            continue
        if rule.rule in ("inherited", "training"):
            expected = getattr(train, key)
        else:
            expected = rule.default if rule.default is not None else getattr(defaults, key)
        assert getattr(evaluation, key) == expected, (key, rule)
    assert [s.name for s in evaluation.sources] == ["e"]


@pytest.mark.parametrize("key", sorted(k for k, rule in eval_rules().items() if rule.rule == "refused"))
def test_the_keys_the_schema_refuses_for_the_eval_set_are_refused(tmp_path, key):
    from zephon_titan.errors import ConfigError
    from zephon_titan.titan.job import read_job_config

    value = {"phases": [{"start_step": 1, "weights": {"e": 1}}], "resume_allow": [], "ledger": False,
             "exclude": "list.txt"}.get(key, 2)  # fmt: skip
    path = tmp_path / "job.toml"
    path.write_text(
        _JOB
        + '[dataloader.sources.a]\npaths = ["a.jsonl"]\n[validator.dataloader]\n'
        + (f"{key} = {json.dumps(value)}\n" if key != "phases" else "")
        + '[validator.dataloader.sources.e]\npaths = ["e.jsonl"]\n'
        + ("[[validator.dataloader.phases]]\nstart_step = 1\nweights = { e = 1 }\n" if key == "phases" else "")
    )
    with pytest.raises(ConfigError, match=rf"\[validator.dataloader\] {key} is not an eval set setting: "):
        read_job_config(str(path))
