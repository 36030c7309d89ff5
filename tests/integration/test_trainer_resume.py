"""The real TorchTitan trainer and CheckpointManager under torchrun (gloo, CPU, tiny Llama):
save on W ranks, resume on W' ranks, compare every global batch's SHA-256 and the losses."""

import os
import re
import shutil

import pytest
from checkpoint_attacks import load_entries, plant_payload, recorded_globals, save_entries, with_loader_of
from conftest import (
    CPU_CONFIG,
    assert_refused,
    check,
    copy_checkpoint,
    cpu_job_args,
    ledger,
    losses,
    run_each,
    torchrun,
)

from zephon_titan.engine.ledger import read_ledger
from zephon_titan.errors import ResumeError
from zephon_titan.loader.checkpoint import ALLOWED_GLOBALS
from zephon_titan.loader.state import decode_entry

pytestmark = pytest.mark.integration
STEPS = 6


_TOKENS = re.compile(r"zephon tokens consumed: code (\d+), prose (\d+) \(total (\d+)")
_SHARES = re.compile(r"share since the last log: code ([0-9.]+), prose ([0-9.]+)")


def train(workdir, run, nproc, *extra):
    args = cpu_job_args(run, STEPS, *extra)
    result = check(torchrun(workdir, "zephon_titan.train_cpu", nproc, args))
    output = result.stdout + result.stderr
    train.output[run] = output
    token_lines = _TOKENS.findall(output)
    train.tokens[run] = tuple(int(x) for x in token_lines[-1])  # after the last step, over all ranks
    train.shares[run] = [tuple(float(x) for x in line) for line in _SHARES.findall(output)]  # one per step
    return ledger(os.path.join(workdir, run, "checkpoint", "ledger.jsonl")), losses(output)


train.tokens = {}
train.shares = {}
train.output = {}


@pytest.fixture(scope="module")
def uninterrupted(workdir):
    return train(workdir, "runs/w2", 2)


@pytest.fixture(scope="module")
def resumed(workdir, uninterrupted):
    """Resumed on more ranks, then back (a chain). One rank: the slow tier's test_a_resume_on_one_rank."""
    copy_checkpoint(workdir, "runs/w2", 2, "runs/w2_to_w4")
    runs = {"2 -> 4": train(workdir, "runs/w2_to_w4", 4)}
    copy_checkpoint(workdir, "runs/w2_to_w4", 4, "runs/w4_to_w2")
    runs["2 -> 4 -> 2"] = train(workdir, "runs/w4_to_w2", 2)
    return runs


def test_resume_on_other_world_sizes_gives_identical_batches(uninterrupted, resumed):
    assert_resumes_equal(uninterrupted, resumed)


@pytest.mark.slow
def test_a_resume_on_one_rank(workdir, uninterrupted):
    """2 -> 1 rank: the batches, losses, token counts and shares of the uninterrupted run."""
    copy_checkpoint(workdir, "runs/w2", 2, "runs/w2_to_w1")
    assert_resumes_equal(uninterrupted, {"2 -> 1": train(workdir, "runs/w2_to_w1", 1)})
    assert train.tokens["runs/w2_to_w1"] == train.tokens["runs/w2"]
    assert_shares_are_the_ledgers(workdir, "runs/w2_to_w1", None)


def assert_resumes_equal(uninterrupted, resumed):
    ref_ledger, ref_losses = uninterrupted
    assert sorted(ref_ledger) == list(range(1, STEPS + 1))
    assert len(set(ref_ledger.values())) == STEPS
    for name, (got_ledger, got_losses) in resumed.items():
        worst = max(abs(loss - ref_losses[step]) for step, loss in got_losses.items())
        print(
            f"{name}: steps {sorted(got_losses)} resumed, ledger equal: {got_ledger == ref_ledger}, "
            f"largest loss difference {worst:.2e}"
        )
        assert got_ledger == ref_ledger, name  # every step's global batch, before and after the resume
        first = min(got_losses)
        assert first in (3, 5), f"{name}: the run did not resume from its checkpoint (first step {first})"
        for step, loss in got_losses.items():
            # Replicate-only DP: only the order of float sums differs between world sizes.
            assert loss == pytest.approx(ref_losses[step], rel=2e-4, abs=2e-4), f"{name} step {step}"


def test_plan_predicts_every_run(workdir, uninterrupted, resumed, monkeypatch, tmp_path):
    monkeypatch.chdir(workdir)  # the job's data paths are relative to its working directory
    from zephon_titan.cli import main
    from zephon_titan.plan import plan_ledger

    planned = {e.step: e.sha256 for e in plan_ledger(CPU_CONFIG, STEPS)}
    assert planned == uninterrupted[0]  # 2 ranks
    for name, (got_ledger, _) in resumed.items():  # 4 ranks, then 2 again, across resumes
        assert got_ledger == planned, name
    # From a checkpoint, and through the command line, compared with `verify`.
    out = str(tmp_path / "from_step4.jsonl")
    assert (
        main(
            [
                "plan",
                CPU_CONFIG,
                "--steps",
                str(STEPS),
                "--from-checkpoint",
                "runs/w2_to_w4/checkpoint/step-4",
                "-o",
                out,
            ]
        )
        == 0
    )
    assert sorted(ledger(out)) == [5, 6]
    assert main(["verify", out, "runs/w4_to_w2/checkpoint/ledger.jsonl", "--steps", "5-6"]) == 0


def test_token_accounting_is_global_and_survives_resizes(workdir, resumed):
    entries = read_ledger(os.path.join(workdir, "runs/w2", "checkpoint", "ledger.jsonl"))
    code = sum(e.tokens["code"] for e in entries)
    prose = sum(e.tokens["prose"] for e in entries)
    assert code > 0 and prose > 0
    assert train.tokens["runs/w2"] == (code, prose, code + prose)
    for run in ("runs/w2_to_w4", "runs/w4_to_w2"):
        assert train.tokens[run] == train.tokens["runs/w2"], run


def test_our_lines_come_once_per_job_and_a_resume_says_what_it_cuts_from_the_ledger(resumed):
    out = train.output["runs/w2_to_w4"]  # 4 ranks, resumed after step 2 with the ledger of steps 1-6
    assert out.count("zephon_titan: tokenizer backend") == 1, out[-3000:]  # rank 0's; ranks 1-3 keep warnings only
    assert out.count("steps 3-6 cut from the ledger (this run resumes after step 2)") == 1, out[-3000:]


@pytest.mark.slow  # the gate refuses a changed seed before the model is built (tests/unit/test_resume_preflight.py)
def test_fingerprint_mismatch_fails_before_the_first_step(workdir, uninterrupted):
    # Negative control: the same checkpoint with another data seed must be refused, naming the change.
    copy_checkpoint(workdir, "runs/w2", 2, "runs/other_seed")
    result = torchrun(
        workdir, "zephon_titan.train_cpu", 2, cpu_job_args("runs/other_seed", STEPS, "--dataloader.seed", "7")
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "seed: 2026 -> 7" in output
    assert not losses(output), "a training step ran despite the mismatch"


def test_per_step_shares_are_global_and_survive_resizes(workdir, resumed):
    # zephon/share/<source> with log_freq = 1: each logged step's share equals the ledger's, on any W.
    for run, first in (("runs/w2", 1), ("runs/w2_to_w4", None), ("runs/w4_to_w2", None)):
        assert_shares_are_the_ledgers(workdir, run, first)


def assert_shares_are_the_ledgers(workdir, run, first):
    entries = {e.step: e for e in read_ledger(os.path.join(workdir, "runs/w2", "checkpoint", "ledger.jsonl"))}
    shares = train.shares[run]
    steps = range(STEPS - len(shares) + 1, STEPS + 1)
    assert shares and (first is None or steps[0] == first), run
    for step, (code, prose) in zip(steps, shares):
        tokens = entries[step].tokens
        assert code == pytest.approx(tokens["code"] / (tokens["code"] + tokens["prose"]), abs=1e-4), (run, step)
        assert code + prose == pytest.approx(1, abs=2e-4)


@pytest.mark.slow
def test_a_new_global_batch_size_at_resume_continues_every_lane(workdir, uninterrupted, monkeypatch):
    """Save with 16 rows per step on 2 ranks, resume with 32 on 4: steps 3-4 are every lane's next 4 rows
    of its uninterrupted stream (lane by lane), as `plan --from-checkpoint` with the new size predicts."""
    from zephon_titan.engine import LaneStream, batch_digest, lane_digest
    from zephon_titan.plan import plan_ledger
    from zephon_titan.titan.job import load_job

    copy_checkpoint(workdir, "runs/w2", 2, "runs/w2_g32")
    args = cpu_job_args("runs/w2_g32", 4, "--training.global_batch_size", "32")
    output = check(torchrun(workdir, "zephon_titan.train_cpu", 4, args)).stdout
    assert "global batch size 16 -> 32 rows from the next step on" in output
    entries = {e.step: e for e in read_ledger(os.path.join(workdir, "runs/w2_g32", "checkpoint", "ledger.jsonl"))}
    assert [entries[s].rows for s in (1, 2, 3, 4)] == [16, 16, 32, 32]
    assert {s: entries[s].sha256 for s in (1, 2)} == {s: uninterrupted[0][s] for s in (1, 2)}

    monkeypatch.chdir(workdir)
    streams = [LaneStream(load_job(CPU_CONFIG).spec, lane) for lane in range(8)]
    for stream in streams:
        stream.take(2 * 2)  # steps 1-2: 2 rows per lane
    expected = {step: batch_digest(lane_digest(s.take(4)) for s in streams) for step in (3, 4)}
    assert {s: entries[s].sha256 for s in (3, 4)} == expected
    job = os.path.join(workdir, "g32.toml")
    with open(job, "w") as f:
        f.write(f'[job]\nextends = "{CPU_CONFIG}"\n[training]\nglobal_batch_size = 32\n')
    planned = {e.step: e for e in plan_ledger(job, 4, "runs/w2/checkpoint/step-2")}
    assert planned == {s: entries[s] for s in (3, 4)}
    # Negative control: a run with 32 rows per step from the start has other steps 3-4.
    from_start = {e.step: e.sha256 for e in plan_ledger(job, 4)}
    assert from_start[3] != expected[3] and from_start[4] != expected[4]


@pytest.mark.slow
def test_a_source_added_at_resume_with_an_annealing_phase(workdir, uninterrupted, monkeypatch):
    """The real trainer resumes the 2-rank step-2 checkpoint on 1 rank with a schedule that adds `anneal`
    from step 4: steps 1-2 stay, steps 3-4 are `plan --from-checkpoint` of the new job (DCP loads the
    checkpoint's smaller lane entries: ZephonTrainer sizes them from its metadata)."""
    from zephon_titan.plan import plan_ledger

    with open(CPU_CONFIG) as f:
        text = f.read().replace("weight = 0.3\n", "").replace("weight = 0.7\n", "")
    text += (
        '\n[dataloader.sources.anneal]\npaths = ["demo_out/prose/*.jsonl"]\nblock_bytes = 8192\n'
        "\n[[dataloader.phases]]\nstart_step = 1\nweights = { code = 0.3, prose = 0.7 }\n"
        "\n[[dataloader.phases]]\nstart_step = 4\nweights = { anneal = 0.5, code = 0.5 }\n"
    )
    job = os.path.join(workdir, "anneal.toml")
    with open(job, "w") as f:
        f.write(text)
    copy_checkpoint(workdir, "runs/w2", 2, "runs/w2_anneal")
    args = ["--job.config_file", job, "--dump_folder", "runs/w2_anneal", "--training.steps", "4"]
    output = check(torchrun(workdir, "zephon_titan.train_cpu", 1, args)).stdout
    assert "sources added at this resume: anneal" in output
    entries = {e.step: e for e in read_ledger(os.path.join(workdir, "runs/w2_anneal", "checkpoint", "ledger.jsonl"))}
    assert {s: entries[s].sha256 for s in (1, 2)} == {s: uninterrupted[0][s] for s in (1, 2)}
    monkeypatch.chdir(workdir)
    assert {e.step: e for e in plan_ledger(job, 4, "runs/w2/checkpoint/step-2")} == {3: entries[3], 4: entries[4]}
    assert entries[3].tokens["anneal"] == 0 < entries[4].tokens["anneal"]


@pytest.fixture(scope="module")
def crafted(workdir, uninterrupted):
    """The trainer resumed (1 rank, one launch) from crafted copies of the 2-rank run's step-4 checkpoint:
    (exit status, output) per case. The genuine checkpoints' resumes are the `resumed` fixture's."""
    source = os.path.join(workdir, "runs/w2/checkpoint")
    cases = {}
    for case in ("payload", "object", "step6_in_4"):
        run = f"runs/crafted_{case}"
        copy_checkpoint(workdir, "runs/w2", 4, run)
        cases[case] = os.path.join(workdir, run, "checkpoint", "step-4")
    # The attack: a .metadata that writes a marker and returns the genuine index.
    plant_payload(cases["payload"], os.path.join(workdir, "runs", "payload_ran"))
    # A lane's sealed state as a Python dict (which DCP pickles; its own load would hand it to the loader).
    entries = load_entries(os.path.join(source, "step-4"))
    entries["dataloader.lane_00003"] = decode_entry(entries["dataloader.lane_00003"], "dataloader.lane_00003")
    shutil.rmtree(cases["object"])
    save_entries(entries, cases["object"])
    # The step-6 `dataloader` entries in the step-4 checkpoint (model, optimizer, train_state of step 4).
    shutil.rmtree(cases["step6_in_4"])
    with_loader_of(os.path.join(source, "step-4"), os.path.join(source, "step-6"), cases["step6_in_4"])
    # The genuine step-4 checkpoint resumed into a full disk: step 6's save writes into /dev/full (ENOSPC).
    copy_checkpoint(workdir, "runs/w2", 4, "runs/crafted_full_disk")
    cases["full_disk"] = os.path.join(workdir, "runs/crafted_full_disk/checkpoint/step-6")
    os.makedirs(cases["full_disk"])
    os.symlink("/dev/full", os.path.join(cases["full_disk"], "__0_0.distcp"))
    outcomes = run_each(workdir, "train_cpu", [cpu_job_args(f"runs/crafted_{case}", STEPS) for case in cases])
    return dict(zip(cases, outcomes)), cases


def test_the_allow_list_covers_the_trainers_checkpoints(workdir, uninterrupted):
    for step in (2, 4, 6):
        seen = recorded_globals(os.path.join(workdir, f"runs/w2/checkpoint/step-{step}"))
        assert ("torch.distributed.checkpoint.metadata", "Metadata") in seen and seen <= ALLOWED_GLOBALS, seen


def test_the_trainer_refuses_a_payload_metadata_without_running_it(workdir, crafted):
    assert_refused(crafted[0]["payload"], "its .metadata refers to builtins.eval")
    assert not os.path.exists(os.path.join(workdir, "runs", "payload_ran")), "a checkpoint byte ran in the trainer"


def test_a_trainer_save_into_a_full_disk_ends_in_one_line(crafted, uninterrupted):
    """Steps 5 and 6 train; step 6's save fails: one line naming the checkpoint and the free space, no
    traceback; the step-4 checkpoint stays the last complete one, the one a resume picks."""
    code, output = crafted[0]["full_disk"]
    errors = [line for line in output.splitlines() if line.startswith("zephon_titan: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in output, output[-3000:]
    folder = os.path.dirname(crafted[1]["full_disk"])
    assert f"cannot save the checkpoint {folder}/step-6: No space left on device (" in errors[0], errors[0]
    assert f"the last complete checkpoint in {folder} (step-4)" in errors[0]
    trained = ledger(os.path.join(folder, "ledger.jsonl"))  # steps 5 and 6 ran, as the uninterrupted run's
    assert {s: trained[s] for s in (5, 6)} == {s: uninterrupted[0][s] for s in (5, 6)}


def test_the_trainer_refuses_a_loader_entry_stored_as_an_object(crafted):
    assert_refused(crafted[0]["object"], "dataloader.lane_00003 is stored as a Python object, not a tensor")


def test_the_trainer_refuses_the_loader_state_of_another_step(workdir, crafted, monkeypatch):
    """Everything else of the crafted checkpoint loads (it was re-saved whole): only the bound step fails."""
    assert_refused(crafted[0]["step6_in_4"], "its dataloader state is of step 6, its train_state of step 4")
    from zephon_titan.plan import plan_ledger

    monkeypatch.chdir(workdir)
    with pytest.raises(ResumeError, match="its dataloader state is of step 6, its train_state of step 4"):
        list(plan_ledger(CPU_CONFIG, STEPS, crafted[1]["step6_in_4"]))


@pytest.mark.slow
def test_more_ranks_than_lanes_with_the_real_trainer(workdir, monkeypatch):
    """2 lanes, 12 rows per step: the trainer saves on 2 ranks and resumes on 3 (W not dividing L) and on 4
    (W > L); every step's global batch equals the plan's, and the losses are finite."""
    import math

    from zephon_titan.plan import plan_ledger

    monkeypatch.chdir(workdir)
    job = os.path.join(workdir, "two_lanes_job.toml")
    with open(job, "w") as f:
        f.write(
            f'[job]\nextends = "{CPU_CONFIG}"\n[training]\nglobal_batch_size = 12\nlocal_batch_size = 1\n'
            "[dataloader]\nnum_lanes = 2\n"
        )
    planned = {e.step: e.sha256 for e in plan_ledger(job, STEPS)}

    def run(name, nproc):
        args = ["--job.config_file", job, "--dump_folder", name, "--training.steps", str(STEPS)]
        output = check(torchrun(workdir, "zephon_titan.train_cpu", nproc, [*args, "--metrics.disable_color_printing"]))
        return ledger(os.path.join(workdir, name, "checkpoint", "ledger.jsonl")), losses(output.stdout + output.stderr)

    assert run("runs/two_lanes_w2", 2)[0] == planned
    for nproc in (3, 4):
        copy_checkpoint(workdir, "runs/two_lanes_w2", 2, f"runs/two_lanes_w{nproc}")
        got, got_losses = run(f"runs/two_lanes_w{nproc}", nproc)
        assert got == planned, nproc
        assert min(got_losses) == 3 and all(math.isfinite(v) for v in got_losses.values()), got_losses
