"""loader/state.py: header version 3 (sources as a list, version 2 converted), and the checks of the
checkpoint's index that name why a checkpoint cannot load before DCP reads any entry."""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from checkpoint_attacks import load_entries, save_entries, with_header_edited
from helpers import data_table

from zephon_titan.config import config_from_dict
from zephon_titan.engine.resume import HEADER_KEY, Header, lane_key
from zephon_titan.errors import ResumeError
from zephon_titan.loader.state import Decoded, decode_entry, encode_header, restore
from zephon_titan.titan.data_run import StepCounter
from zephon_titan.titan.dataloader import ZephonDataLoader

ONE_PHASE = [{"start_step": 1, "weights": {"code": 0.4, "prose": 0.6}}]


def _loader(corpus_dir, tokenizer_dir, **overrides):
    table = data_table(corpus_dir, tokenizer_dir, **overrides)
    config = ZephonDataLoader.Config(data=config_from_dict(table), global_batch_size=16)
    return config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=2)


def _saved(corpus_dir, tokenizer_dir, folder, steps=2, **overrides):
    """A data-only checkpoint `folder`/step-N after `steps` steps, and the next step's rows."""
    loader, counter = _loader(corpus_dir, tokenizer_dir, **overrides), StepCounter()
    batches = iter(loader)
    for _ in range(steps * 8):
        next(batches)
    counter.step = steps
    checkpoint = str(folder / f"step-{steps}")
    dcp.save({"dataloader": loader, "train_state": counter}, checkpoint_id=checkpoint)
    following = torch.cat([next(batches)[0]["input"] for _ in range(8)])
    loader.close()
    return checkpoint, following


def _resumed(checkpoint, loader):
    restore({"dataloader": loader, "train_state": StepCounter()}, checkpoint, loader)
    batches = iter(loader)
    rows = torch.cat([next(batches)[0]["input"] for _ in range(8)])
    loader.close()
    return rows


@pytest.fixture(scope="module")
def saved(corpus_dir, tokenizer_dir, tmp_path_factory):
    return _saved(corpus_dir, tokenizer_dir, tmp_path_factory.mktemp("saved"))


def test_the_header_is_version_3_with_the_sources_as_a_list(saved):
    entries = load_entries(saved[0])
    header = decode_entry(entries[f"dataloader.{HEADER_KEY}"], HEADER_KEY)
    assert header["version"] == 3 and header["fingerprint"]["sources"] == ["code", "prose"]


def _as_version_2(header):
    header["version"], header["fingerprint"]["sources"] = 2, ",".join(header["fingerprint"]["sources"])


def test_a_version_2_header_is_converted_and_resumes(corpus_dir, tokenizer_dir, saved, tmp_path):
    checkpoint = with_header_edited(saved[0], str(tmp_path / "step-2"), _as_version_2)
    assert torch.equal(_resumed(checkpoint, _loader(corpus_dir, tokenizer_dir)), saved[1])
    # Negative control: version 3 reads `sources` as a list only.
    bad = with_header_edited(
        saved[0], str(tmp_path / "bad" / "step-2"), lambda h: _as_version_2(h) or h.update(version=3)
    )
    with pytest.raises(ResumeError, match=r"'header': field 'fingerprint' has no list of source names"):
        _resumed(bad, _loader(corpus_dir, tokenizer_dir))


def test_header_round_trip():
    header = Header(3, 16, 4, {"sources": ["a,b", "c"], "num_lanes": "8"})
    read = Header.from_entry(Decoded({HEADER_KEY: encode_header(header)}))
    assert read.sources == ["a,b", "c"] and read.step == 4 and read.seal == header.to_entry()["seal"]


def test_fewer_lanes_are_named_before_dcp_runs(corpus_dir, tokenizer_dir, tmp_path):
    checkpoint, following = _saved(corpus_dir, tokenizer_dir, tmp_path, num_lanes=4)
    with pytest.raises(ResumeError, match=r"no dataloader state for lane 4 of this run's 8 lanes \(it holds 4\); "
                       r"it was saved with fewer \[dataloader\] num_lanes") as e:  # fmt: skip
        _resumed(checkpoint, _loader(corpus_dir, tokenizer_dir))
    assert "\n" not in str(e.value)
    assert torch.equal(_resumed(checkpoint, _loader(corpus_dir, tokenizer_dir, num_lanes=4)), following)  # control


def test_a_lane_entry_removed_from_the_metadata_is_named_as_damage_not_a_lane_count(
    corpus_dir, tokenizer_dir, saved, tmp_path
):
    entries = load_entries(saved[0])
    del entries[f"dataloader.{lane_key(3)}"]
    save_entries(entries, str(tmp_path / "step-2"))
    with pytest.raises(ResumeError, match=r"its .metadata has no entry for lane 3 but has lanes up to 7: the "
                       r"checkpoint is damaged or incomplete") as e:  # fmt: skip
        _resumed(str(tmp_path / "step-2"), _loader(corpus_dir, tokenizer_dir))
    assert "\n" not in str(e.value) and "fewer" not in str(e.value)


def test_entries_of_another_size_are_named_before_dcp_runs(corpus_dir, tokenizer_dir, saved, tmp_path):
    entries = load_entries(saved[0])
    entries[f"dataloader.{lane_key(5)}"] = entries[f"dataloader.{lane_key(5)}"][:700].clone()
    save_entries(entries, str(tmp_path / "step-2"))
    with pytest.raises(ResumeError, match=r"dataloader entries have other sizes than a zephon_titan state"):
        _resumed(str(tmp_path / "step-2"), _loader(corpus_dir, tokenizer_dir))


def _unweighted(corpus_dir, tokenizer_dir, **more):
    sources = data_table(corpus_dir, tokenizer_dir)["sources"] | more
    return {name: {k: v for k, v in source.items() if k != "weight"} for name, source in sources.items()}


def test_a_resume_that_adds_a_source_loads_the_smaller_entries(corpus_dir, tokenizer_dir, tmp_path):
    sources = _unweighted(corpus_dir, tokenizer_dir)
    checkpoint, _ = _saved(corpus_dir, tokenizer_dir, tmp_path, phases=ONE_PHASE, sources=sources)
    prose = os.path.join(corpus_dir, "prose", "*.jsonl")
    sources = _unweighted(corpus_dir, tokenizer_dir, extra={"paths": [prose], "block_bytes": 8192})
    later = ONE_PHASE + [{"start_step": 5, "weights": {"extra": 1.0}}]  # the added source only after step 2
    loader = _loader(corpus_dir, tokenizer_dir, sources=sources, phases=later)
    assert loader.state_dict()[lane_key(0)].numel() > load_entries(checkpoint)[f"dataloader.{lane_key(0)}"].numel()
    _resumed(checkpoint, loader)  # its rows: tests/integration/test_schedule_resume.py (against plan)
    assert loader.restored is not None and (loader.restored.step, loader.restored.added) == (2, ["extra"])
