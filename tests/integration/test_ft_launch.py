"""`zephon-titan torchft` (zephon_titan/ft_launch.py) with torchft 0.2.0: its lighthouse and 2 replica groups, each
a torchrun job of 2 ranks running examples/ft_run.py's replica (a Manager and FtSteps per rank, a gloo group
inside each group), 4 steps. The union of the groups' ledgers is the plan's, both ranks of a group hold the same
ledger, and every entry records 2 groups of 4 live ranks. Then 3 groups of 2 ranks, a rank of group 1 exiting
inside step 3: torchrun (--max-restarts 1) starts the group again, it heals from a live group and trains on; the
survivors retry step 3 between them; the union is the plan's (this found that a restarted group's rank 1 read
the dead Manager's address from torchrun's store: ft_run's replica now has rank 0 serve a fresh store). A group whose ranks fail for good is one line and status 1,
while the other group's end is reported too. The kill-and-restart proof with its negative control (torchft's
DistributedSampler) is tests/integration/test_torchft_elastic.py.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

torchft = pytest.importorskip("torchft", reason="torchft is not installed (the test extra installs torchft==0.2.0)")

import ft_run  # noqa: E402  (examples/, on the path through tests/conftest.py)

from zephon_titan.cli import main  # noqa: E402
from zephon_titan.engine.ledger import read_ledger  # noqa: E402
from zephon_titan.loader.ft_steps import union_ledger  # noqa: E402

pytestmark = [pytest.mark.slow]  # ~50 s on the 2-core machine: up to 3 torchrun agents and 6 ranks

STEPS = 4


def launcher(
    tmp_path, script: str, *script_args: str, groups: int = 2, nproc: int = 2, min_replicas: int = 2
) -> list[str]:
    return [
        "torchft",
        "--groups",
        str(groups),
        "--nproc",
        str(nproc),
        "--max-restarts",
        "1",
        "--min-replicas",
        str(min_replicas),
        "--join-timeout-ms",
        "1000",
        "--log-dir",
        str(tmp_path / "logs"),
        script,
        *script_args,
    ]


def replica(tmp_path, steps: int) -> tuple[str, list[str]]:
    """A job and the arguments of examples/ft_run.py's replica role (its group, rank and store: torchrun's)."""
    table = ft_run.build_job(str(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    args = ["--role", "replica", "--table", table, "--barrier", str(out / "barrier"), "--out", str(out)]
    return table, [*args, "--steps", str(steps), "--kill-step", "0"]


def test_two_groups_of_two_ranks_train_the_plan(tmp_path, capsys):
    table, args = replica(tmp_path, STEPS)
    out = tmp_path / "out"
    assert main(launcher(tmp_path, ft_run.__file__, *args)) == 0, capsys.readouterr()
    said = capsys.readouterr().out
    assert "replica group 0 finished" in said and "replica group 1 finished" in said
    ledgers = {name: read_ledger(str(out / name)) for name in sorted(os.listdir(out)) if name.startswith("ledger.")}
    assert sorted(ledgers) == [f"ledger.group{g}{dp}.jsonl" for g in (0, 1) for dp in (".dp1", "")]
    for g in (0, 1):
        assert ledgers[f"ledger.group{g}.dp1.jsonl"] == ledgers[f"ledger.group{g}.jsonl"]
    union = union_ledger(ledgers.values())
    _, plan = ft_run.plan(ft_run.job_spec(table), STEPS)
    assert [dataclasses.replace(e, membership=None) for e in union] == plan
    assert all(e.membership == {"participants": 2, "groups": [0, 1], "attempt": 1, "ranks": 4} for e in union)


def test_titan_ft_trainer_under_the_launcher(tmp_path, capsys):
    """TorchTitan's FT trainer with this loader (`[fault_tolerance]` in the job file, titan/ft_trainer.py), 2 groups of
    1 rank, then of 2 ranks (DP inside each group), `{group}` in the arguments as each group's replica id: the union
    of the groups' ledgers is `plan`'s of the same job file (`verify`: identical; a plan of another seed is not: the
    check can fail), every entry names both groups and its live ranks, and the two layouts log the same loss at
    every step (the gradient is of the step's rows, whoever trains them)."""
    import importlib.util

    from logs import parse_losses

    train_cpu = importlib.util.find_spec("zephon_titan.train_cpu")  # its path: importing it would patch torch here
    assert train_cpu is not None and train_cpu.origin is not None
    with open(ft_run.build_job(str(tmp_path))) as f:
        table = json.load(f)
    losses = []
    for nproc in (1, 2):
        out = tmp_path / f"run{nproc}"
        out.mkdir()
        job = ft_run.titan_job(str(out), table, 3, groups=2)
        args = ["--job.config_file", job, "--fault_tolerance.replica_id", "{group}"]
        assert main(launcher(tmp_path / f"launch{nproc}", train_cpu.origin, *args, nproc=nproc)) == 0
        said = capsys.readouterr().out
        assert "replica group 0 finished" in said and "replica group 1 finished" in said
        union = union_ledger(read_ledger(str(out / "checkpoint" / f"ledger.group{g}.jsonl")) for g in (0, 1))
        assert [e.step for e in union] == [1, 2, 3]
        assert all(
            e.membership == {"participants": 2, "groups": [0, 1], "attempt": 1, "ranks": 2 * nproc} for e in union
        )
        with open(out / "ledger.jsonl", "w") as f:
            f.writelines(e.to_json() + "\n" for e in union)
        with open(tmp_path / f"launch{nproc}" / "logs" / "group1.log") as f:
            losses.append(parse_losses(f.read()))
    assert main(["plan", job, "--steps", "3", "-o", str(tmp_path / "plan.jsonl")]) == 0
    for nproc in (1, 2):
        assert main(["verify", str(tmp_path / "plan.jsonl"), str(tmp_path / f"run{nproc}" / "ledger.jsonl")]) == 0
        assert "identical" in capsys.readouterr().out
    assert sorted(losses[0]) == [1, 2, 3] and losses[0] == losses[1], losses
    assert_another_seed_differs(tmp_path, job, 3, str(tmp_path / "run1" / "ledger.jsonl"))


def assert_another_seed_differs(tmp_path, job: str, steps: int, ledger: str) -> None:
    """The control of a `verify` against the plan: the plan of the same job with another seed is not the ledger."""
    with open(job) as f:
        other = f.read().replace("seed = 7", "seed = 8")
    assert other != open(job).read()
    with open(tmp_path / "other.toml", "w") as f:
        f.write(other)
    assert main(["plan", str(tmp_path / "other.toml"), "--steps", str(steps), "-o", str(tmp_path / "other.jsonl")]) == 0
    assert main(["verify", str(tmp_path / "other.jsonl"), ledger]) == 1


def test_a_failing_group_is_one_line_and_the_status(tmp_path, capsys):
    script = tmp_path / "fails_in_group_1.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['REPLICA_GROUP_ID'] == '1' else 0)\n")
    assert main(launcher(tmp_path, str(script))) == 1
    said = capsys.readouterr().out
    log = tmp_path / "logs" / "group1.log"
    assert f"zephon-titan: replica group 1 failed (torchrun exit 1); its output: {log}" in said
    assert "replica group 0 finished" in said and log.exists()


def test_a_rank_that_fails_is_restarted_by_torchrun_and_heals(tmp_path, capsys):
    table, args = replica(tmp_path, 8)
    out = tmp_path / "out"
    assert main(launcher(tmp_path, ft_run.__file__, *args, "--crash", "1:3", groups=3)) == 0
    events = {
        g: [json.loads(line) for line in open(out / f"attempts.group{g}.jsonl") if '"start"' not in line]
        for g in range(3)
    }
    ledgers = {g: read_ledger(str(out / f"ledger.group{g}.jsonl")) for g in range(3)}
    for g in range(3):  # rank 1 of each group, the restarted one's included, recorded the same steps
        assert read_ledger(str(out / f"ledger.group{g}.dp1.jsonl")) == ledgers[g]
    for g in range(3):  # a group's ledger: exactly its commits, the restarted group's two lives together
        assert [e.step for e in ledgers[g]] == [a["step"] for a in events[g] if a["event"] == "end" and a["commit"]]
    healed = [(a["from"], a["to"]) for a in events[1] if a["event"] == "healed"]
    assert len(healed) == 1 and healed[0][0] == 0 and healed[0][1] >= 2, events[1]  # the new life healed
    assert [e.step for e in ledgers[1]] == [1, 2, *range(healed[0][1] + 1, 9)]
    union = union_ledger(ledgers.values())
    _, plan = ft_run.plan(ft_run.job_spec(table), 8)
    assert [dataclasses.replace(e, membership=None) for e in union] == plan
    # Step 3's first attempt failed on the survivors (the rank exited after the quorum); the retry committed. Here
    # by groups 0 and 2: torchrun's restart (imports, seconds) is far slower than the lighthouse's join timeout.
    assert union[2].membership == {"participants": 2, "groups": [0, 2], "attempt": 2, "ranks": 4}
    assert union[-1].membership["groups"] == [0, 1, 2]  # back to 3 groups


def test_titan_ft_trainer_group_restarted_by_torchrun_heals(tmp_path, capsys, monkeypatch):
    """TorchTitan's FT trainer (titan/ft_trainer.py), 2 groups of 2 ranks under the launcher: rank 1 of group 1 exits
    inside step 3, torchrun (--max-restarts 1) starts the group's 2 ranks again, and the new life heals from group 0
    and trains on with it. Group 0 trains on alone meanwhile (min_replica_size 1); the harness holds it before step
    5 until the new life is about to ask for its first quorum (its pause, not the loader's). The union of the
    groups' ledgers is `plan`'s (`verify`: identical; another seed's plan is not). This found that the new life's
    ranks read dead addresses from torchrun's store (the Manager's: refused; gloo's: a hang): rank 0 now serves a
    fresh store per life (loader/ft_store.py)."""
    with open(ft_run.build_job(str(tmp_path))) as f:
        table = json.load(f)
    out = tmp_path / "run"
    out.mkdir()
    steps = 6
    job = ft_run.titan_job(str(out), table, steps, groups=2)
    harness = {"barrier": str(tmp_path / "barrier"), "groups": 2, "kill_step": 0, "victim": -1, "trainer": "zephon"}
    monkeypatch.setenv("ZEPHON_FT_HARNESS", json.dumps({**harness, "crash": [1, 3, 1]}))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ft_titan_replica.py")
    args = ["--job.config_file", job, "--fault_tolerance.replica_id", "{group}"]
    assert main(launcher(tmp_path / "launch", script, *args, nproc=2, min_replicas=1)) == 0, capsys.readouterr()
    said = capsys.readouterr().out
    assert "replica group 0 finished" in said and "replica group 1 finished" in said
    folder = out / "checkpoint"
    ledgers = {g: read_ledger(str(folder / f"ledger.group{g}.jsonl")) for g in (0, 1)}
    events = [json.loads(line) for line in open(folder / "attempts.group1.jsonl")]
    healed = [(e["from"], e["to"]) for e in events if e["event"] == "healed"]
    assert len(healed) == 1 and healed[0][1] >= 2, events  # the new life healed, to the step its rank left or later
    assert [e.step for e in ledgers[1]] == [1, 2, *range(healed[0][1] + 1, steps + 1)]
    assert [e.step for e in ledgers[0]] == list(range(1, steps + 1))
    union = union_ledger(ledgers.values())
    assert union[-1].membership == {"participants": 2, "groups": [0, 1], "attempt": 1, "ranks": 4}  # back to 2
    with open(out / "ledger.jsonl", "w") as f:
        f.writelines(e.to_json() + "\n" for e in union)
    assert main(["plan", job, "--steps", str(steps), "-o", str(tmp_path / "plan.jsonl")]) == 0
    assert main(["verify", str(tmp_path / "plan.jsonl"), str(out / "ledger.jsonl")]) == 0
    assert "identical" in capsys.readouterr().out
    assert_another_seed_differs(tmp_path, job, steps, str(out / "ledger.jsonl"))
