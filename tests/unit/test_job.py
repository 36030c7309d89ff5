"""One job resolver: every mistake the trainer would hit is found before step 1, as one line naming the key."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers import data_table

from zephon_titan.cli import main
from zephon_titan.config import config_from_dict
from zephon_titan.engine.resume import HEADER_CAPACITY, HEADER_KEY
from zephon_titan.errors import ConfigError, ResumeError
from zephon_titan.loader.state import restore
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.job import load_job


def _job(
    tmp_path,
    corpus_dir,
    tokenizer_dir,
    training="global_batch_size = 16\nlocal_batch_size = 2",
    dataloader="",
    top="",
    model="",
):
    path = tmp_path / "job.toml"
    path.write_text(f"""
hf_assets_path = "{tokenizer_dir}"
{top}
[model]
module = "llama3"
config = "llama3_debugmodel"
{model}
[training]
seq_len = 32
{training}
[dataloader]
num_lanes = 8
{dataloader}
[dataloader.sources.code]
paths = ["{corpus_dir}/code/*.parquet"]
[dataloader.sources.prose]
paths = ["{corpus_dir}/prose/*.jsonl"]
""")
    return str(path)


def test_dataloader_global_batch_size_points_to_training(tmp_path, corpus_dir, tokenizer_dir):
    with pytest.raises(
        ConfigError,
        match=r"\[dataloader\] global_batch_size is not a loader setting; set "
        r"\[training\] global_batch_size instead",
    ):
        load_job(_job(tmp_path, corpus_dir, tokenizer_dir, dataloader="global_batch_size = 32"))


@pytest.mark.parametrize(
    "training, world, message",
    [
        (
            "global_batch_size = 20\nlocal_batch_size = 4",
            2,
            r"global batch size 20 is not a positive multiple of num_lanes 8",
        ),
        (
            "global_batch_size = 24\nlocal_batch_size = 5",
            2,
            r"12 rows per step, which is not a multiple of "
            r"training.local_batch_size = 5; use a local_batch_size in \[1, 2, 3, 4, 6, 12\]",
        ),
        (
            "global_batch_size = 16\nlocal_batch_size = 2",
            3,
            r"data-parallel size is 3, which does not divide training.global_batch_size = 16 rows per step; valid "
            r"data-parallel sizes: \[1, 2, 4, 8\] with local_batch_size = 2 \(.*; \[1, 2, 4, 8, 16\] with a smaller",
        ),
    ],
)
def test_preflight_finds_batch_layout_mistakes_before_torchtitan(
    tmp_path, corpus_dir, tokenizer_dir, training, world, message
):
    job = load_job(_job(tmp_path, corpus_dir, tokenizer_dir, training=training))
    with pytest.raises(ConfigError, match=message):
        job.preflight(world)
    load_job(_job(tmp_path, corpus_dir, tokenizer_dir)).preflight(2)  # negative control: a valid job passes


def test_a_wrong_hf_assets_path_is_named(tmp_path, corpus_dir, tokenizer_dir):
    job = load_job(_job(tmp_path, corpus_dir, "no/such/dir"))
    with pytest.raises(ConfigError, match=r"^hf_assets_path = 'no/such/dir' \(/.*/no/such/dir\) does not exist"):
        job.preflight(1)
    # With the loader's own tokenizer_path set, TorchTitan still loads hf_assets_path: still named.
    job = load_job(_job(tmp_path, corpus_dir, "no/such/dir", dataloader=f'tokenizer_path = "{tokenizer_dir}"'))
    with pytest.raises(ConfigError, match=r"^hf_assets_path = 'no/such/dir'"):
        job.preflight(1)


def test_a_model_smaller_than_the_tokenizer_is_refused(tmp_path, corpus_dir, tokenizer_dir):
    job = load_job(_job(tmp_path, corpus_dir, tokenizer_dir, model="vocab_size = 1000"))
    with pytest.raises(
        ConfigError,
        match=r"the model's vocabulary \(1000 embeddings\) is smaller than the "
        r"tokenizer's \(2000 ids, hf_assets_path = .*\); set \[model\] vocab_size = 2048",
    ):
        job.preflight(1)
    resized = load_job(_job(tmp_path, corpus_dir, tokenizer_dir, model="vocab_size = 4096")).config
    assert resized.model_spec.model.vocab_size == resized.model_spec.model.tok_embeddings.num_embeddings == 4096
    assert resized.loss.loss_fn.global_vocab_size == 4096


def test_validate_checks_the_whole_job(tmp_path, corpus_dir, tokenizer_dir, capsys):
    assert (
        main(
            [
                "validate",
                _job(tmp_path, corpus_dir, tokenizer_dir, training="global_batch_size = 16\nstesp = 4"),
                "--no-count",
            ]
        )
        == 2
    )
    assert "unknown key 'stesp' in [training]; did you mean 'steps'?" in capsys.readouterr().err
    assert main(["validate", _job(tmp_path, corpus_dir, tokenizer_dir, model="vocab_size = 100"), "--no-count"]) == 2
    assert "smaller than the tokenizer's" in capsys.readouterr().err
    assert main(["validate", _job(tmp_path, corpus_dir, "nowhere"), "--no-count"]) == 2
    assert "hf_assets_path = 'nowhere'" in capsys.readouterr().err
    assert main(["validate", _job(tmp_path, corpus_dir, tokenizer_dir), "--no-count"]) == 0
    out = capsys.readouterr().out
    assert "add_bos = true ('<|bos|>'" in out and "no add_bos_token" in out and "tokenizer: hf_assets_path" in out


def _loader(corpus_dir, tokenizer_dir, global_batch_size=16, **overrides):
    config = ZephonDataLoader.Config(
        data=config_from_dict(data_table(corpus_dir, tokenizer_dir, **overrides)), global_batch_size=global_batch_size
    )
    return config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=2)


def test_many_long_source_names_fit_the_header_slot_at_startup(tmp_path, corpus_dir, tokenizer_dir):
    from zephon_titan.config import MAX_SOURCE_NAME, MAX_SOURCES

    path = os.path.join(corpus_dir, "prose", sorted(os.listdir(os.path.join(corpus_dir, "prose")))[0])
    sources = {f"{i:03d}".ljust(MAX_SOURCE_NAME, "s"): {"paths": [path]} for i in range(MAX_SOURCES)}
    loader = _loader(corpus_dir, tokenizer_dir, sources=sources)
    state = loader.state_dict()  # the first save: no slot overflows
    assert state[HEADER_KEY].numel() == HEADER_CAPACITY
    _loader(corpus_dir, tokenizer_dir, sources=sources).load_state_dict(state)
    too_long = {"x" * (MAX_SOURCE_NAME + 1): {"paths": [path]}}
    with pytest.raises(ConfigError, match=f"a source name must have 1 to {MAX_SOURCE_NAME} characters"):
        _loader(corpus_dir, tokenizer_dir, sources=too_long)
    too_many = {f"s{i}": {"paths": [path]} for i in range(MAX_SOURCES + 1)}
    with pytest.raises(ConfigError, match=f"at most {MAX_SOURCES} are supported"):
        _loader(corpus_dir, tokenizer_dir, sources=too_many)


def test_a_new_global_batch_size_continues_every_lane_where_it_stopped(corpus_dir, tokenizer_dir):
    """G 16 -> 32 at a resume (2 -> 4 rows per lane per step): each lane goes on with its own stream."""
    from zephon_titan.engine import LaneStream

    old = _loader(corpus_dir, tokenizer_dir, global_batch_size=16)
    batches = iter(old)
    for _ in range(3 * 16 // 2):  # three steps of 8 microbatches of 2 rows
        next(batches)
    saved = old.state_dict()
    old.close()
    new = _loader(corpus_dir, tokenizer_dir, global_batch_size=32)
    new.load_state_dict(saved)
    got = [next(iter_) for iter_ in [iter(new)] for _ in range(2 * 32 // 2)]  # two steps of 32 rows
    new.close()
    inputs = torch.cat([inputs["input"] for inputs, _ in got]).numpy()
    streams = [LaneStream(new.spec, lane) for lane in range(8)]
    for stream in streams:
        stream.take(3 * 2)  # the three steps before the resume
    # Step 4 is lane 0's next 4 rows, then lane 1's, ...; then step 5 the same way.
    expected = [row.inputs for _ in range(2) for stream in streams for row in stream.take(4)]
    assert (inputs == expected).all()
    # Negative control: had the lanes kept 2 rows per step, step 4 would be other rows.
    assert not (inputs[:4] == expected[0:2] + expected[4:6]).all()


class _Step(torch.distributed.checkpoint.stateful.Stateful):
    def state_dict(self):
        return {"step": torch.tensor(6)}

    def load_state_dict(self, state_dict):
        pass


def test_a_model_only_checkpoint_names_last_save_model_only(tmp_path, corpus_dir, tokenizer_dir):
    checkpoint = str(tmp_path / "step-6")
    dcp.save({"train_state": _Step()}, checkpoint_id=checkpoint)  # what last_save_model_only writes, minus weights
    loader = _loader(corpus_dir, tokenizer_dir)
    states = {"dataloader": loader, "train_state": _Step()}
    with pytest.raises(
        ResumeError,
        match=r"saved model-only.*last_save_model_only.*--checkpoint.exclude_from_loading "
        r"dataloader",
    ):
        restore(states, checkpoint, loader)


def test_a_failed_plan_writes_nothing(tmp_path, corpus_dir, tokenizer_dir, capsys):
    out = tmp_path / "plan.jsonl"
    job = _job(tmp_path, corpus_dir, tokenizer_dir)
    assert main(["plan", job, "--steps", "3", "--from-checkpoint", str(tmp_path / "nothing"), "-o", str(out)]) == 2
    assert not out.exists() and not os.path.exists(f"{out}.partial")
    assert "wrote" not in capsys.readouterr().out
    assert main(["plan", job, "--steps", "3", "-o", str(out)]) == 0 and len(out.read_text().splitlines()) == 3


def test_verify_compares_every_field(tmp_path, capsys):
    line = '{{"step": {s}, "sha256": "ab", "rows": 16, "tokens": {{"a": {t}}}, "padding": 0}}\n'
    (tmp_path / "a.jsonl").write_text(line.format(s=1, t=5) + line.format(s=2, t=5))
    (tmp_path / "b.jsonl").write_text(line.format(s=1, t=5) + line.format(s=2, t=6))
    assert main(["verify", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 1
    assert "first difference at step 2 (tokens)" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--steps", "1-1"]) == 0


def test_error_messages_for_huge_batches_are_computed_in_bounded_time():
    # 2**40 rows per step is over the bound (refused as such); at the bound, rows per rank 2**17 with
    # local_batch_size 3: listing the valid local sizes must not walk every number.
    code = (
        "from zephon_titan.engine import validate_batch_layout\n"
        "for g in (2**40 * 8, 2**20):\n"
        "    try:\n        validate_batch_layout(8, g, 8, 3)\n    except Exception as e:\n        print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "is above the bound of 1048576" in out.splitlines()[0], out
    assert (
        "use a local batch size in [1, 2, 4, 8, 16" in out
    )  # the engine's words (the adapter names TorchTitan's keys)


def test_a_seq_len_above_the_models_maximum_is_refused(tmp_path, corpus_dir, tokenizer_dir, capsys):
    # TorchTitan's llama3 debug model caches RoPE for 131072 positions; a longer seq_len fails only when the model is
    # built (after the resume). A resume may change seq_len, up to this bound (docs/changing-a-run.md).
    job = load_job(_job(tmp_path, corpus_dir, tokenizer_dir))
    assert job.model_max_seq_len == 131072
    job.config.training.seq_len = 262144
    with pytest.raises(ConfigError, match=r"seq_len = 262144 is above the model's maximum sequence length 131072"):
        job.preflight(1)
    job.config.training.seq_len = 131072  # negative control: the maximum itself passes
    job.preflight(1)
    # validate says it too, in one line.
    path = _job(tmp_path, corpus_dir, tokenizer_dir)
    with open(path) as f:
        text = f.read().replace("seq_len = 32", "seq_len = 262144")
    with open(path, "w") as f:
        f.write(text)
    assert main(["validate", path, "--no-count"]) == 2
    assert "is above the model's maximum sequence length 131072" in capsys.readouterr().err


@pytest.mark.parametrize("hf", [False, True])
def test_the_safetensors_index_note_is_kept_only_for_hf_checkpoints(tmp_path, caplog, hf):
    """TorchTitan's own adapter warns that hf_assets_path has no model.safetensors.index.json: about how an HF-format
    save is sharded. A job that neither saves nor loads in HF format does not see it; one that does still does."""
    import logging

    from torchtitan.models.llama3.config_registry import llama3_debugmodel
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

    from zephon_titan.titan.job import without_inapplicable_warnings

    config = llama3_debugmodel()
    config.checkpoint.last_save_in_hf = hf
    with caplog.at_level(logging.WARNING), without_inapplicable_warnings(config):
        Llama3StateDictAdapter(config.model_spec.model, str(tmp_path))
    assert ("model.safetensors.index.json not found" in caplog.text) == hf
