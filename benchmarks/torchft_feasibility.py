"""Can torchft 0.2.0 run here: a lighthouse and 3 replica groups on CPU/gloo, a plain loop on its Manager.

    PYTHONPATH=.:/tmp/tfpkg python benchmarks/torchft_feasibility.py [--steps 14] [--kill-step 5] [--restart-step 9]

No zephon_titan import: it measures torchft alone (issue 49, step 4 of its plan). The launcher starts the
lighthouse in its own process, then one process per replica group (group world size 1, its own TCPStore);
each prints one JSON line per step (participants, participating rank, commit, seconds). At --kill-step the
launcher SIGKILLs group 2 while it is inside that step; when a survivor reaches --restart-step it starts group
2 again, which heals from a live peer. Output: every line, then a summary of what each group saw.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replica(group: int, groups: int, lighthouse: str, steps: int, step_sleep: float, barrier: str) -> None:
    import torch
    from torch.distributed import ReduceOp, TCPStore
    from torchft import Manager, ProcessGroupGloo

    torch.manual_seed(0)  # identical initial weights: init_sync is not needed for the first quorum
    store_port = free_port()
    store = TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False)
    model = torch.nn.Linear(8, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        use_async_quorum=False,  # heal before the forward pass: a step's participants are known up front
        timeout=timedelta(seconds=5),
        quorum_timeout=timedelta(seconds=20),
        connect_timeout=timedelta(seconds=10),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store_port,
        lighthouse_addr=lighthouse,
        replica_id=f"group{group}",
    )
    # `store` must stay referenced: it is the server. torchft's ProcessGroup of every step is rendezvoused in the
    # store of the quorum's first member, so a master dropped here fails every other group's configure.
    # The first quorum waits for every group: a group still importing torch is not heartbeating yet, and the
    # lighthouse would form the first quorum without it (join_timeout counts from the first request).
    open(f"{barrier}.{group}", "w").close()
    while not all(os.path.exists(f"{barrier}.{g}") for g in range(groups)) and not os.path.exists(f"{barrier}.go"):
        time.sleep(0.05)
    while manager.current_step() < steps and store is not None:
        start = time.monotonic()
        optim.zero_grad()
        manager.start_quorum()
        step = manager.current_step() + 1
        participants, rank = manager.num_participants(), manager.participating_rank()
        print(json.dumps({"group": group, "event": "start", "step": step}), flush=True)
        time.sleep(step_sleep)  # a step long enough for the launcher to kill a group inside it
        x = torch.full((4, 8), float(step))
        model(x).sum().backward()
        for p in model.parameters():
            assert p.grad is not None
            manager.allreduce(p.grad).wait()
        # Option 1 of docs/fault-tolerance.md: end-of-step lane states as an int64 table summed over the groups by
        # the Manager's own all-reduce (each lane owned by one participant, zeros elsewhere): does SUM on int64 work?
        table = torch.zeros((participants, 4), dtype=torch.int64)
        if rank is not None:
            table[rank] = step * 1000 + group
        manager.allreduce(table, reduce_op=ReduceOp.SUM).wait()
        commit = manager.should_commit()
        if commit:
            optim.step()
        line = {"group": group, "event": "end", "step": step, "participants": participants, "rank": rank}
        line |= {"commit": commit, "seconds": round(time.monotonic() - start, 2)}
        line["table"] = table[:, 0].tolist()  # each participant's row: step * 1000 + its group
        line["weight0"] = round(float(model.weight[0, 0].detach()), 6)  # equal on every group after a commit
        print(json.dumps(line), flush=True)
    manager.shutdown(wait=False)


def lighthouse_main(port_file: str, min_replicas: int) -> None:
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind="[::]:0", min_replicas=min_replicas, join_timeout_ms=1000, quorum_tick_ms=50, heartbeat_timeout_ms=1000
    )
    with open(port_file, "w") as f:
        f.write(server.address())
    while True:
        time.sleep(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", default="launcher")
    parser.add_argument("--group", type=int, default=0)
    parser.add_argument("--lighthouse", default="")
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--kill-step", type=int, default=5)
    parser.add_argument("--restart-step", type=int, default=9)
    parser.add_argument("--step-sleep", type=float, default=0.5)
    parser.add_argument("--barrier", default="")
    args = parser.parse_args()
    if args.role == "replica":
        return replica(args.group, args.groups, args.lighthouse, args.steps, args.step_sleep, args.barrier)
    if args.role == "lighthouse":
        return lighthouse_main(args.lighthouse, 2)
    port_file = f"/tmp/torchft_feasibility_{os.getpid()}"
    me = [sys.executable, os.path.abspath(__file__)]
    house_log = open(f"{port_file}.lighthouse.err", "w")
    house = subprocess.Popen([*me, "--role", "lighthouse", "--lighthouse", port_file], stderr=house_log)
    while not os.path.exists(port_file) or not open(port_file).read():
        time.sleep(0.1)
    address = open(port_file).read()
    print(f"lighthouse at {address}", flush=True)

    def start(group: int) -> subprocess.Popen:
        cmd = [*me, "--role", "replica", "--group", str(group), "--lighthouse", address, "--steps", str(args.steps)]
        cmd += ["--step-sleep", str(args.step_sleep), "--groups", str(args.groups), "--barrier", port_file]
        err = open(f"{port_file}.group{group}.err", "a")  # torchft's own log lines: why a step did not commit
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)

    procs = {g: start(g) for g in range(args.groups)}
    import select

    killed = restarted = False
    began = time.monotonic()
    lines: list[dict] = []
    while any(p.poll() is None for p in procs.values()) and time.monotonic() - began < 240:
        ready, _, _ = select.select([p.stdout for p in procs.values() if p.stdout], [], [], 1.0)
        for stream in ready:
            text = stream.readline()
            if not text:
                continue
            event = json.loads(text)
            event["t"] = round(time.monotonic() - began, 2)
            lines.append(event)
            print(json.dumps(event), flush=True)
            victim = args.groups - 1
            if (
                not killed
                and event["group"] == victim
                and event["event"] == "start"
                and event["step"] == args.kill_step
            ):
                time.sleep(args.step_sleep / 2)  # inside the step: after its quorum, before its allreduce
                os.kill(procs[victim].pid, signal.SIGKILL)
                print(json.dumps({"event": "SIGKILL", "group": victim, "step": args.kill_step}), flush=True)
                killed = True
            if killed and not restarted and event["event"] == "end" and event["step"] >= args.restart_step:
                procs[victim].wait()
                open(f"{port_file}.go", "w").close()  # a restarted group joins a running quorum, no barrier
                procs[victim] = start(victim)
                print(json.dumps({"event": "restart", "group": victim}), flush=True)
                restarted = True
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    house.kill()
    print(f"torchft's logs: {port_file}.group*.err")
    ends = [e for e in lines if e.get("event") == "end"]
    print("summary (group: step participants rank commit):")
    for g in range(args.groups):
        print(g, [(e["step"], e["participants"], e["rank"], e["commit"]) for e in ends if e["group"] == g])


if __name__ == "__main__":
    main()
