import dataclasses
from typing import Any

import pytest
from helpers import data_table, spec_of

from zephon_titan.config import DataConfig, SourceConfig, config_from_dict
from zephon_titan.errors import ConfigError
from zephon_titan.toml_file import load_data_config


def config_to_dict(config: DataConfig) -> dict[str, Any]:
    """The inverse of config_from_dict (JSON/TOML friendly)."""
    names = [f.name for f in dataclasses.fields(config) if f.name != "sources"]
    table = {name: getattr(config, name) for name in names if getattr(config, name) is not None}  # TOML has no null
    table["sources"] = {
        s.name: {f.name: getattr(s, f.name) for f in dataclasses.fields(SourceConfig) if f.name != "name"}
        for s in config.sources
    }
    if config.phases:
        for source in table["sources"].values():
            source.pop("weight")  # the phases hold the weights
        table["phases"] = [dataclasses.asdict(p) for p in config.phases]
    else:
        table.pop("phases")
    return table


def test_toml_round_trip(tmp_path, corpus_dir, tokenizer_dir):
    path = tmp_path / "job.toml"
    path.write_text(f"""
[dataloader]
num_lanes = 4
seed = 3
tokenizer_path = "{tokenizer_dir}"

[dataloader.sources.prose]
paths = ["{corpus_dir}/prose/*.jsonl"]
weight = 2

[dataloader.sources.code]
paths = "{corpus_dir}/code/*.parquet"
""")
    config = load_data_config(str(path))
    assert config.source_names() == ["code", "prose"]  # sorted, whatever the file order
    assert config.sources[1].weight == 2.0 and config.num_lanes == 4
    assert config_from_dict(config_to_dict(config)) == config


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_lanse": 8}, r"unknown key 'num_lanse' in \[dataloader\]; did you mean 'num_lanes'\?"),
        ({"num_lanes": 0}, r"num_lanes must be >= 1, got 0"),
        ({"num_lanes": "8"}, r"num_lanes must be int, got '8'"),
        ({"exhaustion": "stop"}, r"exhaustion must be one of repeat, redistribute"),
        ({"sources": {}}, r"has no sources"),
        ({"sources": {"a": {"weight": 1}}}, r"\[dataloader.sources.a\] needs `paths`"),
        ({"sources": {"a": {"paths": ["x"], "weight": 0}}}, r"weight must be a finite number > 0, got 0"),
        ({"sources": {"a": {"paths": ["x"], "weight": -1.5}}}, r"weight must be a finite number > 0"),
        ({"sources": {"a": {"paths": ["x"], "wieght": 1}}}, r"unknown key 'wieght' .*did you mean 'weight'"),
        ({"sources": {"a": {"paths": []}}}, r"paths must be a non-empty list"),
        ({"s3_endpoint_url": "localhost:9000"}, r"s3_endpoint_url must start with http:// or https://"),
        ({"sources": {"a": {"paths": ["x"], "block_bytes": 10}}}, r"block_bytes must be >= 1024, got 10"),
        ({"prefetch_factor": 0}, r"prefetch_factor must be >= 1, got 0"),
        ({"resume_allow": ["seed"]}, r"resume_allow: 'seed' cannot be allowed"),
    ],
)
def test_config_mistakes_are_named(corpus_dir, tokenizer_dir, change, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data_table(corpus_dir, tokenizer_dir, **change))


def test_an_unknown_format_is_named_when_the_engine_is_built(corpus_dir, tokenizer_dir):
    table = data_table(corpus_dir, tokenizer_dir)
    table["sources"]["prose"]["format"] = "csv"
    with pytest.raises(
        ConfigError,
        match=r"\[dataloader.sources.prose\] format must be one of auto, jsonl, lance, litdata, mds, "
        r"megatron, olmo, parquet, got 'csv'",
    ):
        spec_of(config_from_dict(table), 64)


def test_an_unknown_packing_is_named_before_the_first_row(corpus_dir, tokenizer_dir):
    from zephon_titan.engine import LaneStream, fingerprint

    spec = spec_of(config_from_dict(data_table(corpus_dir, tokenizer_dir, packing="greedy")), 64)
    for build in (lambda: fingerprint(spec), lambda: LaneStream(spec, 0)):
        with pytest.raises(ConfigError, match=r"\[dataloader\] packing must be one of wrap, best_fit, got 'greedy'"):
            build()


def test_missing_files_fail_when_the_engine_is_built(corpus_dir, tokenizer_dir):
    table = data_table(corpus_dir, tokenizer_dir)
    table["sources"]["prose"]["paths"] = ["/no/such/dir/*.jsonl"]
    with pytest.raises(ConfigError, match="source 'prose': path '/no/such/dir/\\*.jsonl' matches no file"):
        spec_of(config_from_dict(table), 64)


@pytest.mark.parametrize("seq_len", [0, -3, 2.5])
def test_bad_seq_len(corpus_dir, tokenizer_dir, seq_len):
    with pytest.raises(ConfigError, match="seq_len must be an integer >= 1"):
        spec_of(config_from_dict(data_table(corpus_dir, tokenizer_dir)), seq_len)


def test_missing_tokenizer_file(corpus_dir, tmp_path):
    with pytest.raises(ConfigError, match="holds no tokenizer.json"):
        spec_of(config_from_dict(data_table(corpus_dir, str(tmp_path))), 64)


def test_missing_toml_table(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[training]\nsteps = 3\n")
    with pytest.raises(ConfigError, match=r"job.toml has no \[dataloader\] table"):
        load_data_config(str(path))


def test_old_worker_knob_names_are_read_with_a_warning(corpus_dir, tokenizer_dir):
    with pytest.warns(DeprecationWarning, match=r"workers is deprecated: use num_workers = 0"):
        config = config_from_dict(data_table(corpus_dir, tokenizer_dir, workers=1, prefetch_steps=3))
    assert (config.num_workers, config.prefetch_factor) == (0, 3)
    with pytest.warns(DeprecationWarning):
        assert config_from_dict(data_table(corpus_dir, tokenizer_dir, workers=4)).num_workers == 4
    with pytest.raises(ConfigError, match=r"sets both workers \(its old name\) and num_workers; keep num_workers"):
        config_from_dict(data_table(corpus_dir, tokenizer_dir, workers=2, num_workers=2))


@pytest.mark.parametrize("name", ["web,en", "web\nen", "tab\there"])
def test_a_source_name_the_checkpoint_cannot_hold_is_refused_at_config_time(corpus_dir, tokenizer_dir, name):
    """Source names are listed separated by commas in messages, log lines and `init --weights`; a comma or a
    control character is refused when the config is read (config/sources.py, validate_source)."""
    table = data_table(corpus_dir, tokenizer_dir)
    table["sources"] = {name: table["sources"]["prose"]}
    with pytest.raises(ConfigError, match="a source name may not contain") as e:
        config_from_dict(table)
    assert "\n" not in str(e.value)  # one line, the offending character shown escaped
    # Control: the same source under a name of ordinary characters (dash, dot, slash, unicode) is read.
    table["sources"] = {"web-en.v2/ü": table["sources"][name]}
    assert config_from_dict(table).source_names() == ["web-en.v2/ü"]
