"""The data path alone under torchrun with real DCP checkpoints, at more ranks than the trainer test."""

import os
import shutil

import pytest
from checkpoint_attacks import load_entries, plant_payload, save_entries, with_loader_of
from conftest import CPU_CONFIG, assert_refused, check, ledger, run_each, torchrun

from zephon_titan.loader.state import decode_entry

pytestmark = pytest.mark.integration
MODULE = "zephon_titan.titan.data_run"
STEPS = 5


def data_run(workdir, nproc, ledger_name, *extra):
    args = [
        "--job.config_file",
        CPU_CONFIG,
        "--steps",
        str(STEPS),
        "--local-batch-size",
        "2",
        "--ledger",
        ledger_name,
        *extra,
    ]
    check(torchrun(workdir, MODULE, nproc, args))
    return ledger(os.path.join(workdir, ledger_name))


@pytest.fixture(scope="module")
def reference(workdir):
    """The uninterrupted run on 2 ranks. (Resumes at other rank counts, 4 -> 8 and 4 -> 2, are
    test_elastic_scale.py's; 2 -> 4 -> 2 and 2 -> 1 with the real trainer are test_trainer_resume.py's.)"""
    reference = data_run(
        workdir, 2, "data/ref.jsonl", "--save-at", "2", "--save-at", "4", "--checkpoint", "data/ref_ckpt"
    )
    assert sorted(reference) == list(range(1, STEPS + 1)) and len(set(reference.values())) == STEPS
    return reference


@pytest.mark.slow
def test_worker_processes_change_nothing_even_across_a_resume(workdir, reference):
    config = _config_with(workdir, "workers.toml", "seed = 2026", "seed = 2026\nnum_workers = 2\nprefetch_factor = 3")
    args = [
        "--job.config_file",
        config,
        "--steps",
        str(STEPS),
        "--local-batch-size",
        "2",
        "--ledger",
        "data/workers.jsonl",
    ]
    check(torchrun(workdir, MODULE, 2, args + ["--save-at", "2", "--checkpoint", "data/ckpt_workers"]))
    assert ledger(os.path.join(workdir, "data/workers.jsonl")) == reference
    # Saved with 2 worker processes per rank (prefetching ahead), resumed in-process on 4 ranks.
    resumed = data_run(workdir, 4, "data/workers.jsonl", "--resume", "data/ckpt_workers/step-2")
    assert resumed == reference


def test_another_seed_differs_at_every_step(workdir, reference, monkeypatch):
    # Negative control for the ledger comparison itself (planned: plan equals real runs, test_one_truth.py).
    from zephon_titan.plan import plan_ledger

    monkeypatch.chdir(workdir)
    other_config = _config_with(workdir, "other_seed.toml", "seed = 2026", "seed = 2027")
    other = {e.step: e.sha256 for e in plan_ledger(other_config, STEPS)}
    assert {e.step: e.sha256 for e in plan_ledger(CPU_CONFIG, STEPS)} == reference
    assert all(other[s] != reference[s] for s in reference)


def _config_with(workdir, name, old, new):
    path = os.path.join(workdir, name)
    with open(CPU_CONFIG) as f:
        text = f.read()
    assert old in text
    with open(path, "w") as f:
        f.write(text.replace(old, new))
    return path


def test_a_changed_lane_count_is_refused_with_its_reason(crafted):
    assert_refused(crafted["lanes_16"], "saved with fewer [dataloader] num_lanes")
    assert_refused(crafted["lanes_4"], "num_lanes: 8 -> 4")


@pytest.mark.slow
def test_torchtitans_builtin_loader_cannot_resume_on_another_size(workdir):
    args = ["--job.config_file", CPU_CONFIG, "--steps", "3", "--builtin"]
    check(torchrun(workdir, MODULE, 2, args + ["--save-at", "2", "--checkpoint", "data/builtin"]))
    result = torchrun(workdir, MODULE, 4, args + ["--resume", "data/builtin/step-2", "--local-batch-size", "2"])
    assert result.returncode != 0
    assert "Missing key in checkpoint state_dict: dataloader.dp_rank_2" in result.stdout + result.stderr


@pytest.fixture(scope="module")
def crafted(workdir, reference):
    """data_run resumed from crafted copies of the reference run's step-2 checkpoint, then (control) from the
    genuine one on 1 rank: (exit status, output) per case, in one launch."""
    root = os.path.join(workdir, "data", "crafted")
    genuine, later = os.path.join(workdir, "data/ref_ckpt/step-2"), os.path.join(workdir, "data/ref_ckpt/step-4")
    # The attack: a .metadata that writes a marker and returns the genuine index (plain DCP runs it,
    # then resumes as if nothing happened: tests/unit/test_checkpoint_safety.py's control).
    payload = os.path.join(root, "payload", "step-2")
    shutil.copytree(genuine, payload)
    plant_payload(payload, os.path.join(root, "payload_ran"))
    # A lane's sealed state as a Python dict, which DCP pickles (and its own load would hand to the loader).
    entries = load_entries(genuine)
    entries["dataloader.lane_00003"] = decode_entry(entries["dataloader.lane_00003"], "dataloader.lane_00003")
    save_entries(entries, os.path.join(root, "object", "step-2"))
    # The step-4 `dataloader` entries in the step-2 checkpoint.
    with_loader_of(genuine, later, os.path.join(root, "step4_in_2", "step-2"))
    shutil.copy(os.path.join(workdir, "data/ref.jsonl"), os.path.join(workdir, "data/genuine.jsonl"))
    base = ["--job.config_file", CPU_CONFIG, "--local-batch-size", "2"]
    runs = [
        base + ["--steps", "3", "--resume", os.path.join(root, case, "step-2")]
        for case in ("payload", "object", "step4_in_2")
    ]
    runs.append(base + ["--steps", str(STEPS), "--resume", genuine, "--ledger", "data/genuine.jsonl"])
    # The genuine checkpoint (8 lanes) under a job with another lane count.
    for lanes in (16, 4):
        config = _config_with(workdir, f"lanes_{lanes}.toml", "num_lanes = 8", f"num_lanes = {lanes}")
        runs.append(["--job.config_file", config, "--steps", "3", "--resume", genuine])
    # A save into a full disk: the rank's data file of step 2 is /dev/full, whose every write is ENOSPC.
    full = os.path.join(root, "full")
    os.makedirs(os.path.join(full, "step-2"))
    os.symlink("/dev/full", os.path.join(full, "step-2", "__0_0.distcp"))
    runs.append(base + ["--steps", "3", "--save-at", "2", "--checkpoint", full])
    outcomes = run_each(workdir, "data_run", runs)
    return dict(zip(("payload", "object", "step4_in_2", "genuine", "lanes_16", "lanes_4", "full"), outcomes))


def test_a_save_into_a_full_disk_ends_in_one_line(workdir, crafted):
    code, output = crafted["full"]
    errors = [line for line in output.splitlines() if line.startswith("zephon_titan: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in output, output[-3000:]
    folder = os.path.join(workdir, "data", "crafted", "full")
    assert f"cannot save the checkpoint {folder}/step-2: No space left on device (" in errors[0]
    assert "GiB free of" in errors[0] and f"the last complete checkpoint in {folder} (none)" in errors[0]
    assert not os.path.exists(os.path.join(folder, "step-2", ".metadata"))  # nothing a resume could take


def test_a_payload_metadata_is_refused_without_running(workdir, crafted):
    assert_refused(crafted["payload"], "its .metadata refers to builtins.eval")
    assert not os.path.exists(os.path.join(workdir, "data", "crafted", "payload_ran")), "a checkpoint byte ran"


def test_a_loader_entry_stored_as_an_object_is_refused(crafted):
    assert_refused(crafted["object"], "dataloader.lane_00003 is stored as a Python object, not a tensor")


def test_the_loader_state_of_another_step_is_refused(workdir, crafted, reference):
    assert_refused(crafted["step4_in_2"], "its dataloader state is of step 4, its train_state of step 2")
    # Control: the genuine checkpoint resumes (on 1 rank) to the uninterrupted run's batches.
    assert crafted["genuine"][0] == 0, crafted["genuine"][1][-3000:]
    assert ledger(os.path.join(workdir, "data/genuine.jsonl")) == reference
