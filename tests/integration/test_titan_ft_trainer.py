"""TorchTitan's own FT trainer with this loader (titan/ft_trainer.py, issue 49): no row lost or repeated when a replica
group is SIGKILLed mid-step and restarted.

torchft's lighthouse and 3 replica groups, each a torchrun job of 1 rank on CPU/gloo running ZephonFtTrainer
(TorchTitan 0.3's FaultTolerantTrainer, `[fault_tolerance] enable = true` in the job file, the replica id as a
command-line override) on TorchTitan's Llama-3 debug model and the tests' corpus (4 lanes, 12 rows of 64 tokens,
2 per microbatch). Group 2's torchrun job (agent and worker) is SIGKILLed inside step 5 and a fresh one started
once a survivor has committed step 9; it heals from a live peer (model, optimizer, LR schedule and the lane table).
Every committed step trains the plan's rows of that step in order, with 3, then 2, then 3 groups; the step the kill
fell in is retried with the same rows; every group's ledger SHA-256 is the plan's and `verify` finds their union
equal to the plan. Negative controls: the same check on the same run with one group's rows of one step dropped
fails, a ledger with one entry altered is refused by `verify` and by the union, and TorchTitan's own FT path
(FaultTolerantTrainer with its TorchFTManager: asynchronous quorum, `get_dp_info`'s fixed share per group; this
package's plain loader over that share) under the same kill, not restarted, fails the same check: the dead
group's share of every later step is lost and the retried step trains the next batch. (Restarted, its group fails
to load TorchTitan's per-group loader checkpoint with this loader: "the checkpoint's dataloader state has no
'lane_00002'" — a group's share of 4 rows straddles a lane whose entry is another group's.)

    PYTHONPATH=. python tests/integration/test_titan_ft_trainer.py OUT [stock]   # a run by hand, its comparison
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

pytest.importorskip("torchft", reason="torchft is not installed (the test extra installs torchft==0.2.0)")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(REPO, "examples")]

import ft_run  # noqa: E402

from zephon_titan import ft_launch  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

GROUPS, STEPS, KILL_STEP, RESTART_STEP, JOIN_TIMEOUT_MS = 3, 14, 5, 9, 5000
EVENT = "ZEPHON_FT_EVENT "


def launch(out: str, steps: int = STEPS, timeout: float = 300, trainer: str = "zephon", restart: bool = True) -> dict:
    """The lighthouse, 3 torchrun jobs, the kill and the restart; returns examples/ft_run.py's comparison with the
    plan (its compare and ledgers: the same checks as the plain-loop proof)."""
    os.makedirs(out, exist_ok=True)
    table_path = ft_run.build_job(tempfile.mkdtemp(prefix="job-", dir=out))
    with open(table_path) as f:
        job = ft_run.titan_job(out, json.load(f), steps, GROUPS)
    base = os.path.join(out, "lighthouse")
    # `zephon-titan torchft`'s lighthouse. Its join timeout (how late a group may be before a step goes on without
    # it) is 5 s: at 1 s, a load of ~3.5 left a group out of most steps, and once out of the last one, alone and
    # with no quorum to join (torchft's 60 s quorum timeout, the group failed).
    house, address = ft_launch.lighthouse(2, JOIN_TIMEOUT_MS, f"{base}.err")
    harness = {"barrier": base, "groups": GROUPS, "kill_step": KILL_STEP, "victim": GROUPS - 1, "trainer": trainer}

    def start(group: int, restarted: bool) -> subprocess.Popen:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": REPO,
            "TORCHFT_LIGHTHOUSE": address,
            "ZEPHON_FT_HARNESS": json.dumps(harness),
            "ZEPHON_FT_RESTARTED": "1" if restarted else "0",
        }
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
        cmd += [os.path.join(HERE, "ft_titan_replica.py"), "--job.config_file", job]
        cmd += ["--fault_tolerance.replica_id", str(group)]
        err = open(os.path.join(out, f"group{group}.err"), "a")
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, start_new_session=True, cwd=out
        )
        group_of[proc.pid] = group
        threading.Thread(target=read_events, args=(proc,), daemon=True).start()
        return proc

    events: queue.Queue = queue.Queue()
    group_of: dict[int, int] = {}

    def read_events(proc: subprocess.Popen) -> None:
        """A thread per group: its event lines as they come (select on a buffered pipe would miss lines that
        arrived together)."""
        assert proc.stdout is not None
        with open(os.path.join(out, f"group{group_of[proc.pid]}.out"), "a") as kept:  # TorchTitan's step lines
            for text in proc.stdout:
                if text.startswith(EVENT):
                    events.put(json.loads(text[len(EVENT) :]))
                else:
                    kept.write(text)

    procs: dict[int, subprocess.Popen] = {}
    try:
        procs = {g: start(g, False) for g in range(GROUPS)}
        victim, killed, restarted = GROUPS - 1, False, False
        old_pids: list[int] = []
        began = time.monotonic()
        while any(p.poll() is None for p in procs.values()):
            if time.monotonic() - began > timeout:
                raise SystemExit(f"the run took over {timeout} s; see {out}/group*.err")
            try:
                lines = [events.get(timeout=1.0)]
            except queue.Empty:
                lines = []
            if restarted and any(
                name.startswith(f"lighthouse.ready.{victim}.") and int(name.rsplit(".", 1)[1]) not in old_pids
                for name in os.listdir(out)
            ):
                open(f"{base}.rejoined", "w").close()
            for event in lines:
                if not killed and event["group"] == victim and event["event"] == "start" and event["step"] == KILL_STEP:
                    time.sleep(0.3)  # inside the victim's 2 s step: after its quorum, before its all-reduce
                    old_pids = kill_tree(procs[victim].pid)  # the torchrun job: agent and worker
                    killed = True
                elif restart and killed and not restarted and event["event"] == "end" and event["commit"]:
                    if event["step"] >= RESTART_STEP:
                        procs[victim].wait()
                        while any(_alive(pid) for pid in old_pids):
                            time.sleep(0.05)
                        open(f"{base}.hold", "w").close()  # the survivors wait for the new group to be up
                        procs[victim] = start(victim, True)
                        restarted = True
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_tree(p.pid)
        house.kill()
        house.wait()
    # (the victim, killed and not restarted, ends with SIGKILL's status)
    failed = {
        g: p.returncode for g, p in procs.items() if p.returncode and not (g == victim and killed and not restarted)
    }
    if failed:
        raise SystemExit(f"replica groups failed {failed}; see {out}/group*.err")
    loader = "zephon" if trainer == "zephon" else "stock"  # (ft_run.compare reads ledgers only of "zephon")
    args = argparse.Namespace(out=os.path.join(out, "checkpoint"), steps=steps, loader=loader, ranks=1)
    return {**ft_run.compare(args, ft_run.job_spec(table_path)), "table": table_path}


def kill_tree(pid: int) -> list[int]:
    """SIGKILL a process and every process under it (torchrun's workers are in a session of their own), children
    first found then all killed; returns their ids."""
    pids, todo = [], [pid]
    while todo:
        parent = todo.pop()
        pids.append(parent)
        found = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
        todo += [int(child) for child in found]
    for each in pids:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout[:1] != "Z"


def test_titan_ft_trainer_loses_and_repeats_no_row(tmp_path, capsys):
    from zephon_titan.cli.ledgers import cmd_verify
    from zephon_titan.engine.ledger import read_ledger
    from zephon_titan.errors import DataError
    from zephon_titan.loader.ft_steps import union_ledger

    result = launch(str(tmp_path / "run"))
    out = str(tmp_path / "run" / "checkpoint")  # the ledgers and the attempts: beside the checkpoints
    steps = result["steps"]
    every = list(range(1, STEPS + 1))
    assert result["committed_steps"] == every, result
    assert all(s["same_rows_as_plan"] and s["in_plan_order"] for s in steps.values()), steps
    assert result["lost_rows"] == result["repeated_rows"] == result["rows_not_of_their_step"] == 0
    counts = [len(steps[step]["participants"]) for step in every]
    # 3, then 2, then 3 again (a busy machine may leave a group out of a later step: it heals past it)
    assert counts[:4] == [3] * 4 and 2 in counts and 3 in counts[counts.index(2) :], counts
    assert steps[counts.index(2) + 1]["failed_attempts"] >= 1  # the kill's step, retried by the survivors
    assert result["retried_rows_equal_first_attempt"] and result["weights_agree"]
    assert result["ledger_sha_mismatches"] == [] and result["ledger_sha_matches"] >= 2 * STEPS
    groups = result["groups"]
    for g, got in groups.items():  # a group's ledger: exactly the steps it committed
        assert got["ledger_steps"] == got["committed_steps"], (g, got)
    assert groups[2]["ledger_steps"][:4] == [1, 2, 3, 4] and groups[2]["ledger_steps"][-1] > RESTART_STEP
    args = argparse.Namespace(a=os.path.join(out, "plan.jsonl"), b=os.path.join(out, "ledger.jsonl"), steps=None)
    args.prefix = False
    assert cmd_verify(args) == 0, capsys.readouterr().out

    # Negative control 1: the same check over the same run, one step without its dead group's share of rows.
    attempts = os.path.join(out, "attempts.group0.jsonl")
    with open(attempts) as f:
        lines = [json.loads(line) for line in f]
    two = counts.index(2) + 1
    for line in lines:
        if line["event"] == "end" and line["commit"] and line["step"] == two:
            line["rows"] = line["rows"][: len(line["rows"]) // 2]
    with open(attempts, "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    spec = ft_run.job_spec(result["table"])
    control = ft_run.compare(argparse.Namespace(out=out, steps=STEPS, loader="control", ranks=1), spec)
    assert control["lost_rows"] > 0 and not control["steps"][two]["same_rows_as_plan"], control

    # Negative control 2: a ledger with one entry changed is refused by verify and by the union.
    entries = read_ledger(os.path.join(out, "ledger.group1.jsonl"))
    bad = os.path.join(out, "ledger.bad.jsonl")
    altered = [e.to_json().replace(e.sha256, "0" * 64) if e.step == two else e.to_json() for e in entries]
    with open(bad, "w") as f:
        f.writelines(line + "\n" for line in altered)
    args.b = bad
    assert cmd_verify(args) == 1
    assert f"first difference at step {two}" in capsys.readouterr().out
    with pytest.raises(DataError, match=f"recorded step {two} differently"):
        union_ledger([entries, read_ledger(bad)])


def test_titan_stock_ft_path_loses_rows_under_the_same_kill(tmp_path):
    """The negative control of the proof above: TorchTitan's FT trainer as it is (see the module's docstring)."""
    try:
        control = launch(str(tmp_path / "stock"), trainer="stock", restart=False)
    except SystemExit as e:
        # TorchTitan's FT path as it ships can fail a group by itself: once in CI (2026-12-06, load ~5) group 0 died
        # in its own forward ("setStorage: ... out of bounds for storage of size 0", a parameter with no storage,
        # asynchronous quorum) and group 1 then timed out on the quorum. The control needs a run that ends: once more.
        if "replica groups failed" not in str(e):
            raise
        control = launch(str(tmp_path / "stock_again"), trainer="stock", restart=False)
    # TorchTitan's step counter counts the failed attempt too: training.steps attempts, one fewer commits.
    assert control["committed_steps"] == list(range(1, STEPS)), control
    steps = control["steps"]
    assert all(steps[s]["same_rows_as_plan"] for s in range(1, KILL_STEP)), steps  # 3 groups: the plan's rows
    assert not any(steps[s]["same_rows_as_plan"] for s in range(KILL_STEP, STEPS)), steps
    assert control["lost_rows"] >= (STEPS - KILL_STEP) * ft_run.GLOBAL_BATCH // GROUPS, control
    assert control["rows_not_of_their_step"] > 0 and not control["retried_rows_equal_first_attempt"], control


if __name__ == "__main__":
    stock = sys.argv[2:] == ["stock"]
    print(json.dumps(launch(sys.argv[1], trainer="stock" if stock else "zephon", restart=not stock), indent=1))
