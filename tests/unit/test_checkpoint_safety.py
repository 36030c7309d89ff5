"""No checkpoint byte runs code (loader/checkpoint.py): a `.metadata` payload, an entry that names code and a
loader entry stored as a Python object are refused in one line before anything runs, each beside a control
that shows plain DCP runs it; the loader state is bound to the checkpoint's step."""

import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from checkpoint_attacks import Payload, load_entries, plant_payload, recorded_globals, save_entries, with_loader_of
from helpers import write_job
from torch.distributed.checkpoint import FileSystemReader

from zephon_titan.cli import main
from zephon_titan.engine.resume import lane_key
from zephon_titan.errors import ResumeError
from zephon_titan.loader.checkpoint import ALLOWED_GLOBALS, read_checkpoint_metadata, safe_load
from zephon_titan.loader.state import decode_entry, restore
from zephon_titan.plan import plan_ledger
from zephon_titan.titan.data_run import StepCounter
from zephon_titan.titan.job import load_job


@pytest.fixture(scope="module")
def job(tmp_path_factory, corpus_dir, tokenizer_dir):
    return write_job(tmp_path_factory.mktemp("safety") / "job.toml", corpus_dir, tokenizer_dir, seq_len=32, local=4)


def _loader(job):
    resolved = load_job(job)
    return resolved.config.dataloader.build(
        dp_world_size=1, dp_rank=0, tokenizer=resolved.trainer_tokenizer(), seq_len=32, local_batch_size=4
    )


@pytest.fixture(scope="module")
def run(job, tmp_path_factory):
    """Checkpoints of a data-only run (the loader's entries and data_run's train_state) at steps 2 and 4."""
    folder = tmp_path_factory.mktemp("run")
    loader, counter = _loader(job), StepCounter()
    batches = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in (1, 2, 3, 4):
            for _ in range(4):
                next(batches)
            counter.step = step
            if step in (2, 4):
                dcp.save({"dataloader": loader, "train_state": counter}, checkpoint_id=str(folder / f"step-{step}"))
    loader.close()
    return folder


def _copy(run, step, tmp_path, name=None):
    target = str(tmp_path / (name or f"step-{step}"))
    shutil.copytree(run / f"step-{step}", target)
    return target


@pytest.fixture
def payload(run, tmp_path):
    """The step-2 checkpoint whose `.metadata` runs code when unpickled, then returns the genuine index."""
    checkpoint = _copy(run, 2, tmp_path)
    plant_payload(checkpoint, str(tmp_path / "marker"))
    return checkpoint, tmp_path / "marker"


def test_the_allow_list_is_what_real_checkpoints_name(run):
    seen = recorded_globals(str(run / "step-2"))
    assert ("torch.distributed.checkpoint.metadata", "Metadata") in seen
    assert seen <= ALLOWED_GLOBALS, seen - ALLOWED_GLOBALS
    assert read_checkpoint_metadata(str(run / "step-2")).state_dict_metadata.keys() == set(
        FileSystemReader(str(run / "step-2")).read_metadata().state_dict_metadata
    )


def test_control_plain_dcp_runs_the_payload_and_sees_nothing(payload, run):
    checkpoint, marker = payload
    metadata = FileSystemReader(checkpoint).read_metadata()
    assert marker.read_text() == "ran"  # the payload ran ...
    genuine = FileSystemReader(str(run / "step-2")).read_metadata()
    assert metadata.state_dict_metadata == genuine.state_dict_metadata  # ... and the index is the real one


def _refused(call, marker, match=r"its \.metadata refers to builtins\.eval, which no DCP checkpoint index holds"):
    with pytest.raises(ResumeError, match=match) as e:
        call()
    assert "\n" not in str(e.value)
    assert not marker.exists(), "a checkpoint byte ran"
    return str(e.value)


def test_the_payload_is_refused_by_the_index_reader(payload):
    checkpoint, marker = payload
    message = _refused(lambda: read_checkpoint_metadata(checkpoint), marker)
    assert message.startswith(checkpoint)


def test_the_payload_is_refused_by_the_resume_sequence(payload, job):
    checkpoint, marker = payload
    loader = _loader(job)
    _refused(lambda: restore({"dataloader": loader, "train_state": StepCounter()}, checkpoint, loader), marker)
    loader.close()


def test_the_payload_is_refused_by_plan(payload, job, capsys):
    checkpoint, marker = payload
    _refused(lambda: list(plan_ledger(job, 4, checkpoint)), marker)
    assert main(["plan", job, "--steps", "4", "--from-checkpoint", checkpoint]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refers to builtins.eval" in err[0]
    assert not marker.exists()


def test_plan_from_the_genuine_checkpoint_continues_the_run(run, job):
    # Control for the refusals: the same reader and loader accept the checkpoint they were built for.
    planned = {e.step: e.sha256 for e in plan_ledger(job, 6)}
    assert {e.step: e.sha256 for e in plan_ledger(job, 6, str(run / "step-2"))} == {s: planned[s] for s in (3, 4, 5, 6)}
    assert {e.step: e.sha256 for e in plan_ledger(job, 6, str(run / "step-4"))} == {5: planned[5], 6: planned[6]}


def test_an_entry_that_names_code_is_refused_weights_only(tmp_path):
    marker = tmp_path / "marker"
    checkpoint = str(tmp_path / "ckpt")
    save_entries(
        {"train_state.step": Payload(b"\x80\x04K\x04.", str(marker)), "train_state.x": torch.ones(2)}, checkpoint
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {"train_state": {"step": 0, "x": torch.zeros(2)}}
        dcp.load(state, checkpoint_id=checkpoint)  # control: DCP's own planner runs it
        assert marker.read_text() == "ran" and state["train_state"]["step"] == 4
        marker.unlink()
        state = {"train_state": {"step": 0, "x": torch.zeros(2)}}
        _refused(lambda: safe_load(state, checkpoint), marker, r"entry train_state.step is a Python object")
        assert state["train_state"]["step"] == 0


def test_plain_data_stored_as_bytes_still_loads(tmp_path):
    checkpoint = str(tmp_path / "ckpt")
    values = {"step": 6, "ntokens_seen": 12288, "betas": (0.9, 0.95), "fused": None, "name": "adamw"}
    save_entries({f"train_state.{k}": v for k, v in values.items()}, checkpoint)
    state = {"train_state": dict.fromkeys(values)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        safe_load(state, checkpoint)
    assert state["train_state"] == values


def test_a_loader_entry_stored_as_an_object_is_refused_before_dcp_reads_it(run, job, tmp_path):
    entries = load_entries(str(run / "step-2"))
    key = f"dataloader.{lane_key(3)}"
    entries[key] = decode_entry(entries[key], key)  # the same sealed state, as a Python dict: DCP pickles it
    checkpoint = str(tmp_path / "step-2")
    save_entries(entries, checkpoint)
    with warnings.catch_warnings():  # control: DCP's own load hands the loader the dict, which it accepts
        warnings.simplefilter("ignore")
        loader = _loader(job)
        dcp.load({"dataloader": loader, "train_state": StepCounter()}, checkpoint_id=checkpoint)
    assert loader.restored_step == 2
    loader.close()
    match = rf"dataloader.{lane_key(3)} is stored as a Python object, not a tensor"
    with pytest.raises(ResumeError, match=match):
        list(plan_ledger(job, 4, checkpoint))
    loader = _loader(job)
    with pytest.raises(ResumeError, match=match):
        restore({"dataloader": loader, "train_state": StepCounter()}, checkpoint, loader)
    loader.close()


def test_the_loader_state_of_another_step_is_refused_naming_both(run, job, tmp_path):
    """The attack: the step-4 `dataloader` entries in the step-2 checkpoint (train_state says 2)."""
    checkpoint = str(tmp_path / "step-2")
    with_loader_of(str(run / "step-2"), str(run / "step-4"), checkpoint)
    with pytest.raises(ResumeError, match=r"dataloader state is of step 4, its train_state of step 2"):
        list(plan_ledger(job, 6, checkpoint))
    # The resume sequence data_run and the trainer use: the check follows the load.
    loader, counter = _loader(job), StepCounter()
    with pytest.raises(
        ResumeError, match=rf"{checkpoint}: its dataloader state is of step 4, its train_state of step 2"
    ):
        restore({"dataloader": loader, "train_state": counter}, checkpoint, loader)
    assert (loader.restored_step, counter.step) == (4, 2)
    loader.close()


def test_a_folder_named_for_another_step_is_refused(run, job, tmp_path):
    # Without a train_state, the folder's name is the checkpoint's step.
    entries = {k: v for k, v in load_entries(str(run / "step-4")).items() if k.startswith("dataloader.")}
    save_entries(entries, str(tmp_path / "step-2"))
    with pytest.raises(ResumeError, match=r"dataloader state is of step 4, the folder is named for step 2"):
        list(plan_ledger(job, 6, str(tmp_path / "step-2")))
    save_entries(entries, str(tmp_path / "latest"))  # not named by step: nothing to compare with
    assert [e.step for e in plan_ledger(job, 6, str(tmp_path / "latest"))] == [5, 6]


def test_a_missing_checkpoint_is_one_line(tmp_path):
    for read in (read_checkpoint_metadata, lambda path: restore({}, path, None)):
        with pytest.raises(ResumeError, match="is not a readable DCP checkpoint"):
            read(str(tmp_path / "nothing"))


@pytest.mark.parametrize("body", [b"", b"not a pickle", b"\x80\x04K\x04.", b"\x80\x04\x95\x10"])
def test_a_damaged_index_is_one_line(tmp_path, body):
    (tmp_path / ".metadata").write_bytes(body)
    with pytest.raises(ResumeError, match=r"\.metadata is not a DCP checkpoint index") as e:
        read_checkpoint_metadata(str(tmp_path))
    assert "\n" not in str(e.value)
