"""`zephon-titan torchft`: torchft's lighthouse and R replica groups, each a torchrun job of D ranks, on this node.

    zephon-titan torchft --groups 3 --nproc 2 [--min-replicas 2] [--max-restarts 3] train.py [ARGS ...]
    zephon-titan torchft --lighthouse http://HOST:29510 --group-ids 2,3 --nproc 2 train.py   # groups on this node
    zephon-titan torchft --groups 3 zephon_titan/train.py --job.config_file job.toml \
        --fault_tolerance.replica_id {group}        # TorchTitan's FT trainer ([fault_tolerance] in the job file)

As torchft's own torchx.py launches it: group g is `torchrun --nnodes 1 --nproc-per-node D --master-port P
--max-restarts K train.py ARGS` with TORCHFT_LIGHTHOUSE, REPLICA_GROUP_ID=g and NUM_REPLICA_GROUPS=R set; the
script builds torchft's Manager (replica_id=f"group{g}": torchft 0.2.0 reads the trailing digits as the group's
number; rank, world size and store from torchrun's environment) and FtSteps (group=g, dp_rank=RANK,
dp_size=WORLD_SIZE). The lighthouse runs in a process of its own (torchft.coordination.LighthouseServer, its
log in the log folder) unless --lighthouse names one already running (groups spread over nodes: this command on each, --group-ids its own).
A group that ends with an error is one line here, with the file holding its output; the others train on (that
is the point), and the command's status is 1 when any group failed. docs/fault-tolerance.md: what a job sets.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from zephon_titan.errors import ConfigError, ZephonError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "torchft",
        help="torchft's lighthouse and replica groups (one torchrun job each) training while groups die and rejoin",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("script", help="the training script every rank runs (it builds the Manager and FtSteps)")
    p.add_argument(
        "script_args", nargs=argparse.REMAINDER, help="its arguments; {group} in them is each group's number"
    )
    p.add_argument("--groups", type=int, default=2, help="replica groups in the job (NUM_REPLICA_GROUPS)")
    p.add_argument("--group-ids", default="", help="the groups started here, e.g. 0,1 (default: all of --groups)")
    p.add_argument("--nproc", type=int, default=1, help="ranks per replica group (torchrun --nproc-per-node)")
    p.add_argument("--lighthouse", default="", help="URL of a running lighthouse (default: one in this process)")
    p.add_argument("--min-replicas", type=int, default=1, help="the lighthouse's fewest groups for a quorum")
    p.add_argument(
        "--join-timeout-ms",
        type=int,
        default=10000,
        help="how long the lighthouse waits for a late group before a step goes on without it (it heals past)",
    )
    p.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts of a group whose rank failed")
    p.add_argument("--log-dir", default="", help="each group's output, group<g>.log (default: a new temporary folder)")
    p.set_defaults(run=run)


def group_ids(text: str, groups: int) -> list[int]:
    if groups < 1:
        raise ConfigError(f"--groups must be at least 1, got {groups}")
    if not text:
        return list(range(groups))
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--group-ids takes group numbers separated by commas, e.g. 0,1; got {text!r}") from None
    bad = [g for g in ids if not 0 <= g < groups]
    if bad or len(set(ids)) != len(ids):
        raise ConfigError(f"--group-ids must name distinct groups in [0, {groups}); got {text}")
    return ids


GROUP_FIELD = "{group}"
"""In the script's arguments, each group's number (TorchTitan's FT trainer takes it as --fault_tolerance.replica_id)."""


def group_command(
    script: str, script_args: list[str], nproc: int, master_port: int, max_restarts: int, group: int = 0
) -> list[str]:
    """One replica group: torchrun on this node, its own store port (the group's store: torchft rendezvouses
    every quorum's cross-group PG in it); GROUP_FIELD in an argument replaced by the group's number."""
    launcher = ["--nnodes", "1", "--nproc-per-node", str(nproc), "--master-port", str(master_port)]
    launcher += ["--max-restarts", str(max_restarts)]
    args = [arg.replace(GROUP_FIELD, str(group)) for arg in script_args]
    return [sys.executable, "-m", "torch.distributed.run", *launcher, script, *args]


def group_env(lighthouse: str, group: int, groups: int) -> dict[str, str]:
    env = dict(os.environ, TORCHFT_LIGHTHOUSE=lighthouse, REPLICA_GROUP_ID=str(group))
    env["NUM_REPLICA_GROUPS"] = str(groups)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LIGHTHOUSE = """
import sys, time
from torchft.coordination import LighthouseServer
server = LighthouseServer(bind="[::]:0", min_replicas=int(sys.argv[1]), join_timeout_ms=int(sys.argv[2]))
print(server.address(), flush=True)
while True:
    time.sleep(3600)
"""


def lighthouse(min_replicas: int, join_timeout_ms: int, log: str) -> tuple[subprocess.Popen, str]:
    """The lighthouse in a process of its own (its log lines would flood this console); its URL."""
    with open(log, "w") as f:
        cmd = [sys.executable, "-c", LIGHTHOUSE, str(min_replicas), str(join_timeout_ms)]
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=f, text=True)
    address = server.stdout.readline().strip() if server.stdout else ""
    if not address:
        server.wait()
        raise ZephonError(f"the lighthouse did not start (exit {server.returncode}); its output: {log}")
    return server, address


def run(args: argparse.Namespace) -> int:
    ids = group_ids(args.group_ids, args.groups)
    if args.nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {args.nproc}")
    if not os.path.exists(args.script):
        raise ConfigError(f"the training script {args.script} does not exist")
    if importlib.util.find_spec("torchft") is None:
        raise ZephonError("zephon-titan torchft needs torchft: pip install torchft==0.2.0")
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="zephon-torchft-")
    os.makedirs(log_dir, exist_ok=True)
    server = None
    address = args.lighthouse
    if not address:
        server, address = lighthouse(args.min_replicas, args.join_timeout_ms, os.path.join(log_dir, "lighthouse.log"))
    print(
        f"zephon-titan: lighthouse {address}; groups {ids} of {args.groups}, {args.nproc} ranks each; logs in {log_dir}"
    )
    groups: dict[int, subprocess.Popen] = {}
    logs: dict[int, str] = {}
    try:
        for g in ids:
            logs[g] = os.path.join(log_dir, f"group{g}.log")
            cmd = group_command(args.script, args.script_args, args.nproc, free_port(), args.max_restarts, g)
            with open(logs[g], "w") as log:  # the child keeps its own descriptor
                groups[g] = subprocess.Popen(
                    cmd, env=group_env(address, g, args.groups), stdout=log, stderr=subprocess.STDOUT
                )
        return wait(groups, logs)
    finally:
        for p in groups.values():
            if p.poll() is None:
                p.terminate()
        if server is not None:
            server.terminate()
            server.wait()


def wait(groups: dict[int, subprocess.Popen], logs: dict[int, str]) -> int:
    """Until every group has ended; one line per group as it ends."""
    failed, running = [], dict(groups)
    while running:
        for g, p in list(running.items()):
            if p.poll() is None:
                continue
            del running[g]
            if p.returncode:
                failed.append(g)
                print(f"zephon-titan: replica group {g} failed (torchrun exit {p.returncode}); its output: {logs[g]}")
            else:
                print(f"zephon-titan: replica group {g} finished")
        time.sleep(0.2)
    return 1 if failed else 0
