"""Elastic while running, no row lost or repeated: torchft's lighthouse and 3 replica groups on CPU/gloo (issue 49).

    PYTHONPATH=. python examples/ft_run.py [--loader zephon|sampler] [--ranks 2] [--steps 16] [--sit-out 0:12]

An example, not a benchmark: it is how a loop wires loader/ft_steps.py to torchft's Manager, and its output is a
proof, not a figure. TorchTitan's Llama-3 debug model (SDPA attention on CPU) trains on the test corpus
(examples/corpus.py: prose JSONL and code Parquet, a BPE trained on them) in a plain loop built on torchft's
Manager, the way torchft's own train_ddp.py is: TorchTitan's FT trainer is not wired to loader/ft_steps.py yet (its
loader takes a fixed share per group, `get_dp_info`), and its FT path on CPU takes minutes per process here.

The launcher starts the lighthouse, then 3 replica groups of --ranks processes (a rank each, with its Manager; with
2 or more, a gloo group inside the group for the gradients and the loader's table, the group's store served by
its rank 0). It SIGKILLs group 2 (every rank) inside step --kill-step (after its quorum, before its all-reduce),
starts it again once a survivor has committed
--restart-step (it heals from a live peer: model, optimizer and the loader's lane table), and the run goes on to
--steps. Each group writes one line per attempt (step, attempt, participants, its rank, commit, the SHA-256 of
each row it trained) and, with --loader zephon, its ledger of committed steps (out/ledger.groupG.jsonl); the
run's ledger is their union (out/ledger.jsonl): a group left out of a step heals past it and lacks it. --sit-out
GROUP:STEP makes a group late to STEP's quorum (what a busy machine does by chance). Then the launcher compares
with the plan (the same job's lanes simulated in one process): per committed step,
the rows trained by its participants against the plan's rows of that step, and the ledger's SHA-256 against the
plan's. --loader sampler is the negative control: torchft's own torchft.data.DistributedSampler over the same
rows (the plan's, in global order), one batch of G/(3 x ranks) rows per rank and attempt, as torchft's examples
use it.

`--role replica` is one rank; under `zephon-titan torchft` (torchrun) it takes its group, rank and store from the
environment, and --crash GROUP:STEP makes a rank of GROUP exit inside STEP once (torchrun restarts the group).
"""

from __future__ import annotations

import argparse
import collections
import glob
import hashlib
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "examples")]

GROUPS, LANES, GLOBAL_BATCH, LOCAL_BATCH, SEQ_LEN, VOCAB = 3, 4, 12, 2, 64, 2048


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_job(root: str) -> str:
    """The corpus and tokenizer of the tests, and the [dataloader] table as JSON (path returned)."""
    import corpus

    prose, code = corpus.prose_documents(), corpus.code_documents(max_files=40)
    tokenizer = corpus.train_tokenizer(prose + code, os.path.join(root, "tokenizer"), vocab_size=2000)
    corpus.write_jsonl(prose, os.path.join(root, "prose"), num_files=3)
    corpus.write_parquet(code, os.path.join(root, "code"), num_files=3, row_group_size=4)
    table = corpus.two_source_table(root, tokenizer, LANES, seed=7)
    path = os.path.join(root, "table.json")
    with open(path, "w") as f:
        json.dump(table, f)
    return path


def toml_value(value) -> str:
    return json.dumps(value)  # strings, numbers and lists of them are written alike in TOML


def titan_job(out: str, table: dict, steps: int, groups: int) -> str:
    """The same job as a job file for TorchTitan's FT trainer with this loader (titan/ft_trainer.py), as a user
    writes it: the debug model recipe, the [dataloader] table, and [fault_tolerance] (the replica id is each group's
    command-line override, `--fault_tolerance.replica_id`). Returns its path (in `out`, the run's dump folder)."""
    lines = [
        f"hf_assets_path = {toml_value(table['tokenizer_path'])}",
        f"dump_folder = {toml_value(out)}",
        '[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"',
        f"[training]\nseq_len = {SEQ_LEN}\nlocal_batch_size = {LOCAL_BATCH}",
        f"global_batch_size = {GLOBAL_BATCH}\nsteps = {steps}",
        "[checkpoint]\nenable = false",
        "[metrics]\nlog_freq = 1\ndisable_color_printing = true",
        "[debug]\nseed = 42",
        f"[fault_tolerance]\nenable = true\ngroup_size = {groups}\nmin_replica_size = 1",
        "process_group_timeout_ms = 5000",
        "[dataloader]",
        *(f"{key} = {toml_value(value)}" for key, value in table.items() if key != "sources"),
    ]
    for name, source in table["sources"].items():
        lines += [f"[dataloader.sources.{name}]", *(f"{k} = {toml_value(v)}" for k, v in source.items())]
    path = os.path.join(out, "job.toml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def job_spec(table_path: str):
    from zephon_titan.testing import spec_from_table

    with open(table_path) as f:
        return spec_from_table(json.load(f), seq_len=SEQ_LEN)


def row_id(row) -> str:
    return hashlib.sha256(row.to_bytes()).hexdigest()[:16]


def plan(spec, steps: int):
    """Per step: the plan's rows (global order) and its ledger entry, from every lane simulated here."""
    from zephon_titan.engine import batch_digest, lane_digest, open_lane_group, rows_per_lane
    from zephon_titan.engine.ledger import step_entry
    from zephon_titan.engine.rows import step_tally

    rows, entries = [], []
    with open_lane_group(spec, range(LANES), rows_per_lane(GLOBAL_BATCH, LANES)) as group:
        for step in range(1, steps + 1):
            lanes = group.next_step()
            rows.append([row for lane in lanes for row in lane])
            counts = step_tally(rows[-1], len(spec.sources))
            entries.append(step_entry(spec, step, batch_digest(lane_digest(r) for r in lanes), GLOBAL_BATCH, counts))
    return rows, entries


def debug_model():
    """TorchTitan's Llama-3 debug model (`debugmodel`: 6 layers, dim 256, 6.2 M parameters), its attention SDPA
    (FlexAttention has no CPU backward), built the same on every rank from the seed."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    config = model_registry("debugmodel").model
    assert config.vocab_size == VOCAB, config.vocab_size  # the rows' ids are below the test BPE's vocabulary
    for _, _, parent, attr in list(config.traverse(FlexAttention.Config)):
        if isinstance(parent, list):
            parent[attr] = ScaledDotProductAttention.Config()
        elif parent is not None:
            setattr(parent, attr, ScaledDotProductAttention.Config())
    return config.build()


def replica(args) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore
    from torchft import Manager, ProcessGroupGloo

    from zephon_titan.loader.ft_store import fresh_group_store

    torch.manual_seed(0)  # identical initial weights on every group: the first quorum needs no sync
    # The group's store: rank 0 serves it, for the group's life (torchft rendezvouses every quorum's PG in it).
    torchrun = "REPLICA_GROUP_ID" in os.environ and "RANK" in os.environ
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # torchrun's restarts of this group
    host = "127.0.0.1"
    if torchrun:  # under `zephon-titan torchft`: the group is a torchrun job
        args.group, args.groups = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
        args.dp, args.ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        args.lighthouse = os.environ["TORCHFT_LIGHTHOUSE"]
        # Not torchrun's own store for the Manager: a restarted group's rank 1 read the dead Manager's address there
        # (connection refused). Rank 0 serves a fresh one per life of the group (loader/ft_store.py).
        host, args.store_port, served = fresh_group_store(args.dp)
        if served is not None:
            store = served
    if not torchrun or args.dp > 0:
        store = TCPStore(
            host,
            args.store_port,
            is_master=args.dp == 0 and not torchrun,
            wait_for_workers=False,
            timeout=timedelta(seconds=60),
        )
    if args.ranks > 1:  # DP inside the group: its own gloo group, beside torchft's cross-group PG
        dist.init_process_group(
            "gloo", store=PrefixStore("dp", store), rank=args.dp, world_size=args.ranks, timeout=timedelta(seconds=10)
        )
    model = debug_model()
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.SGD(params, lr=0.1)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        load_state_dict=lambda s: (model.load_state_dict(s["model"]), optim.load_state_dict(s["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": optim.state_dict()},
        min_replica_size=1,
        use_async_quorum=False,  # heal before the forward pass: a healed group takes part in that very step
        timeout=timedelta(seconds=5),
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=timedelta(seconds=10),
        rank=args.dp,
        world_size=args.ranks,
        store_addr=host,
        store_port=args.store_port,
        lighthouse_addr=args.lighthouse,
        replica_id=f"group{args.group}",
    )
    spec = job_spec(args.table)
    if args.loader == "zephon":
        from zephon_titan.loader.ft_steps import FtSteps

        source = FtSteps(
            spec,
            global_batch_size=GLOBAL_BATCH,
            local_batch_size=LOCAL_BATCH,
            manager=manager,
            group=args.group,
            dp_rank=args.dp,
            dp_size=args.ranks,
            dp_allreduce=dist.all_reduce if args.ranks > 1 else None,
        )
    else:
        from torchft.data import DistributedSampler

        rows = [row for step in plan(spec, args.steps + 8)[0] for row in step]  # the plan's rows, global order
        sampler = DistributedSampler(
            range(len(rows)),
            replica_rank=args.group,
            num_replica_groups=args.groups,
            group_rank=args.dp,
            num_replicas=args.ranks,
        )
        sampler.shuffle = False  # the plan's order: a step's rows are G consecutive indices
        size = GLOBAL_BATCH // (args.groups * args.ranks)
        batches = torch.utils.data.DataLoader(range(len(rows)), batch_size=size, sampler=sampler)
        batch_iter = iter(batches)
    me = f"group{args.group}" + (f".dp{args.dp}" if args.dp else "")
    out = open(os.path.join(args.out, f"attempts.{me}.jsonl"), "a")
    ledger = open(os.path.join(args.out, f"ledger.{me}.jsonl"), "a")  # every rank's: they must be equal

    def emit(line: dict) -> None:
        line["group"], line["dp"] = args.group, args.dp
        print(json.dumps(line), flush=True)
        out.write(json.dumps(line) + "\n")
        out.flush()

    open(f"{args.barrier}.{args.group}.{args.dp}", "w").close()  # the first quorum waits for every group
    everyone = [f"{args.barrier}.{g}.{d}" for g in range(args.groups) for d in range(args.ranks)]  # (feasibility)
    while not all(map(os.path.exists, everyone)) and not os.path.exists(f"{args.barrier}.go"):
        time.sleep(0.05)
    open(f"{args.barrier}.ready.{args.group}.{os.getpid()}", "w").close()
    if restarts:
        open(f"{args.barrier}.restarted.{args.group}.{args.dp}", "w").close()
    healed = 0
    while manager.current_step() < args.steps and store is not None:  # `store` is the group's server: keep it
        # The harness's pause, not the loader's: once the launcher restarts a group, the survivors wait for it to
        # be up (its imports take seconds here) so that it rejoins before the run ends.
        while os.path.exists(f"{args.barrier}.hold") and not os.path.exists(f"{args.barrier}.rejoined"):
            time.sleep(0.05)
        if args.crash and args.group != args.crash[0] and manager.current_step() + 1 == args.crash[1] + 2:
            # The same pause under torchrun: two steps after the crash, wait for the restarted group.
            back = [f"{args.barrier}.restarted.{args.crash[0]}.{d}" for d in range(args.ranks)]
            waited = time.monotonic()
            while not all(map(os.path.exists, back)):
                if time.monotonic() - waited > 120:
                    raise SystemExit(f"replica group {args.crash[0]} was not back 120 s after its crash")
                time.sleep(0.05)
        optim.zero_grad()
        if args.sit_out and args.sit_out == (args.group, manager.current_step() + 1):
            # Late to the quorum by more than the lighthouse's join timeout (what a busy machine does by chance):
            # the others train the step without this group, which heals past it at its next quorum.
            while not os.path.exists(f"{args.barrier}.committed.{args.sit_out[1]}"):
                time.sleep(0.05)
        began = time.perf_counter()  # the step's data-side costs, against the sampler's (the same quorum inside)
        if args.loader == "zephon":
            attempt = source.begin()
            step, tried = attempt.step, attempt.attempt
            for was, now in source.healed[healed:]:  # steps this group did not train: not in its ledger
                emit({"event": "healed", "from": was, "to": now})
            healed = len(source.healed)
            batch = [row for slot in attempt.microbatches() if slot is not None for row in slot]
        else:
            manager.start_quorum()
            step, tried = manager.current_step() + 1, 0
            batch = [rows[i] for i in next(batch_iter).tolist()]
        begin_s = time.perf_counter() - began
        emit({"event": "start", "step": step})
        if args.crash == (args.group, step) and not restarts:
            os._exit(1)  # a rank failing inside the step (after its quorum): torchrun restarts the group
        # The victim's step --kill-step is long, so that the launcher's SIGKILL surely lands inside it (before its
        # all-reduce) even when this machine is busy; the peers wait for it in their all-reduce (PG timeout 5 s).
        victim_step = args.group == GROUPS - 1 and step == args.kill_step and not os.path.exists(f"{args.barrier}.go")
        victim_step &= args.groups == GROUPS  # (the launcher's kill: 3 groups)
        time.sleep(2.0 if victim_step else args.step_sleep)
        if batch:
            inputs = torch.from_numpy(np.stack([r.inputs for r in batch]).astype(np.int64))
            labels = torch.from_numpy(np.stack([r.labels for r in batch]).astype(np.int64))
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            loss.backward()
        # The gradients as one flat tensor: one all-reduce inside the group, then one across groups (HSDP's order),
        # not one per parameter (the model has ~60).
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
        if args.ranks > 1:
            dist.all_reduce(grads)
        manager.allreduce(grads).wait()
        at = 0
        for p in params:
            p.grad = grads[at : at + p.numel()].view_as(p).clone()
            at += p.numel()
        finished = time.perf_counter()
        if args.loader == "zephon":
            commit = source.finish(attempt)
        else:
            commit = manager.should_commit()
        finish_s = time.perf_counter() - finished
        if commit:
            optim.step()
            if args.loader == "zephon":
                ledger.write(source.entries[-1].to_json() + "\n")
                ledger.flush()
        emit(
            {
                "event": "end",
                "step": step,
                "attempt": tried,
                "participants": manager.num_participants(),
                "rank": manager.participating_rank(),
                "commit": commit,
                "rows": [row_id(r) for r in batch],
                "weight": round(float(params[-1].detach().flatten()[0]), 6),
                "begin_s": round(begin_s, 4),
                "finish_s": round(finish_s, 4),
            }
        )
    manager.shutdown(wait=False)


def lighthouse_main(port_file: str) -> None:
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind="[::]:0", min_replicas=2, join_timeout_ms=1000, quorum_tick_ms=50, heartbeat_timeout_ms=1000
    )
    with open(port_file + ".tmp", "w") as f:
        f.write(server.address())
    os.rename(port_file + ".tmp", port_file)
    while True:
        time.sleep(60)


def launch(args) -> dict:
    """The run (lighthouse, groups, the kill and the restart); returns the comparison with the plan."""
    os.makedirs(args.out, exist_ok=True)
    table = build_job(tempfile.mkdtemp(prefix="ft-run-job-", dir=args.out))
    base = os.path.join(args.out, "lighthouse")
    me = [sys.executable, os.path.abspath(__file__)]
    house = subprocess.Popen([*me, "--role", "lighthouse", "--lighthouse", base], stderr=open(f"{base}.err", "w"))
    while not os.path.exists(base):
        if house.poll() is not None:
            raise SystemExit(f"the lighthouse exited ({house.returncode}); see {base}.err")
        time.sleep(0.1)
    address = open(base).read()

    def start(group: int) -> dict[tuple[int, int], subprocess.Popen]:
        """The group's ranks, one process each, with a fresh store port (a restarted group's too)."""
        cmd = [*me, "--role", "replica", "--group", str(group), "--lighthouse", address, "--steps", str(args.steps)]
        cmd += ["--step-sleep", str(args.step_sleep), "--barrier", base, "--table", table, "--out", args.out]
        cmd += ["--loader", args.loader, "--ranks", str(args.ranks), "--store-port", str(free_port())]
        if args.sit_out:
            cmd += ["--sit-out", ":".join(map(str, args.sit_out))]
        err = open(os.path.join(args.out, f"group{group}.err"), "a")  # torchft's own lines: why a step failed
        return {
            (group, d): subprocess.Popen([*cmd, "--dp", str(d)], stdout=subprocess.PIPE, stderr=err, text=True)
            for d in range(args.ranks)
        }

    procs = {key: p for g in range(GROUPS) for key, p in start(g).items()}
    victim, killed, restarted = GROUPS - 1, False, False
    began = time.monotonic()
    try:
        while any(p.poll() is None for p in procs.values()):
            if time.monotonic() - began > args.timeout:
                raise SystemExit(f"the run took over {args.timeout} s; see {args.out}/group*.err")
            ready, _, _ = select.select([p.stdout for p in procs.values() if p.stdout], [], [], 1.0)
            victims = [procs[victim, d] for d in range(args.ranks)]
            if restarted and all(glob.glob(f"{base}.ready.{victim}.{p.pid}") for p in victims):
                open(f"{base}.rejoined", "w").close()
            for stream in ready:
                text = stream.readline()
                if not text:
                    continue
                event = json.loads(text)
                if event["event"] == "end" and event["commit"]:
                    open(f"{base}.committed.{event['step']}", "w").close()  # for --sit-out
                if (
                    not killed
                    and event["group"] == victim
                    and event["event"] == "start"
                    and event["step"] == args.kill_step
                ):
                    time.sleep(0.3)  # inside the step (2 s long): after its quorum, before its all-reduce
                    for p in victims:  # the whole group: every rank
                        os.kill(p.pid, signal.SIGKILL)
                    killed = True
                elif killed and not restarted and event["event"] == "end" and event["commit"]:
                    if event["step"] >= args.restart_step:
                        for p in victims:
                            p.wait()
                        open(f"{base}.go", "w").close()  # a restarted group joins a running quorum: no barrier
                        open(f"{base}.hold", "w").close()
                        procs |= start(victim)
                        restarted = True
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        house.kill()
    if any(p.returncode for p in procs.values()):
        raise SystemExit(f"a replica group failed; see {args.out}/group*.err")
    return compare(args, job_spec(table))


def compare(args, spec) -> dict:
    """Every group's committed attempts against the plan."""
    plan_rows, plan_entries = plan(spec, args.steps + 8)
    index = {row_id(row): (step + 1, i) for step, rows in enumerate(plan_rows) for i, row in enumerate(rows)}
    attempts = []
    for path in sorted(glob.glob(os.path.join(args.out, "attempts.group*.jsonl"))):
        with open(path) as f:
            attempts += [json.loads(line) for line in f if '"start"' not in line]
    events, attempts = attempts, [a for a in attempts if a["event"] == "end"]
    committed: dict[int, list[dict]] = collections.defaultdict(list)
    for a in attempts:
        if a["commit"]:
            committed[a["step"]].append(a)
    trained = collections.Counter(r for step in committed.values() for a in step for r in a["rows"])
    expected = collections.Counter(row_id(r) for step in sorted(committed) for r in plan_rows[step - 1])
    per_step = {}
    for step in sorted(committed):
        ranks = sorted(committed[step], key=lambda a: (a["rank"] if a["rank"] is not None else 99, a["dp"]))
        got = [r for a in ranks for r in a["rows"]]  # live-rank order: groups in participating order, DP inside
        per_step[step] = {
            "participants": [a["group"] for a in ranks if a["dp"] == 0],
            "ranks": len(ranks),
            "same_rows_as_plan": collections.Counter(got)
            == collections.Counter(row_id(r) for r in plan_rows[step - 1]),
            "in_plan_order": got == [row_id(r) for r in plan_rows[step - 1]],
            "failed_attempts": sum(1 for a in attempts if a["step"] == step and not a["commit"]),
        }
    failed_rows = {
        (a["step"], a["group"], a["dp"]): a["rows"] for a in attempts if not a["commit"] and a["rows"]
    }  # what a failed attempt trained: the retry of its step must train the same rows
    retried_same = all(
        set(rows) <= {r for c in committed[step] for r in c["rows"]} for (step, *_), rows in failed_rows.items()
    )
    result = {
        "loader": args.loader,
        "committed_steps": sorted(committed),
        "steps": per_step,
        "lost_rows": sum((expected - trained).values()),
        "repeated_rows": sum(n - 1 for n in trained.values() if n > 1),
        "rows_not_of_their_step": sum(
            1 for step, c in committed.items() for a in c for r in a["rows"] if index.get(r, (0,))[0] != step
        ),
        "retried_rows_equal_first_attempt": retried_same,
        "failed_attempts": sorted({(a["step"], a["group"]) for a in attempts if not a["commit"]}),
        # After a commit every rank holds the same weights (the gradient summed inside a group, averaged across).
        "weights_agree": all(len({a["weight"] for a in c}) == 1 for c in committed.values()),
        # Per committed attempt, median seconds: begin (quorum, then this rank's rows) and finish (the loader's table
        # through the group and the Manager, then should_commit; the sampler: should_commit alone).
        "median_begin_s": statistics.median(a["begin_s"] for c in committed.values() for a in c),
        "median_finish_s": statistics.median(a["finish_s"] for c in committed.values() for a in c),
    }
    if args.loader == "zephon":
        result |= ledgers(args, plan_entries, events)
    return result


def ledgers(args, plan_entries, events) -> dict:
    """Each group's ledger against the plan and against what the group committed; the run's ledger (their union,
    out/ledger.jsonl) for `verify`. A group's ledger holds exactly the steps it committed: a step it was left out
    of, or healed past, is in the others' (its healed events say which)."""
    from zephon_titan.engine.ledger import read_ledger
    from zephon_titan.loader.ft_steps import union_ledger

    with open(os.path.join(args.out, "plan.jsonl"), "w") as f:
        f.writelines(e.to_json() + "\n" for e in plan_entries[: args.steps])
    matches, mismatches, per_group, every = 0, [], {}, []
    dp_equal = True
    for g in range(GROUPS):
        entries = read_ledger(os.path.join(args.out, f"ledger.group{g}.jsonl"))
        every.append(entries)
        for d in range(1, args.ranks):  # every rank of a group records the same steps, the same entries
            dp_equal &= read_ledger(os.path.join(args.out, f"ledger.group{g}.dp{d}.jsonl")) == entries
        for entry in entries:
            ok = entry.sha256 == plan_entries[entry.step - 1].sha256
            matches += ok
            mismatches += [] if ok else [(g, entry.step)]
        mine = [a for a in events if a["group"] == g and a["dp"] == 0]
        per_group[g] = {
            "ledger_steps": [e.step for e in entries],
            "committed_steps": [a["step"] for a in mine if a["event"] == "end" and a["commit"]],
            "healed_past": sorted(
                {s for a in mine if a["event"] == "healed" for s in range(a["from"] + 1, a["to"] + 1)}
            ),
        }
    with open(os.path.join(args.out, "ledger.jsonl"), "w") as f:
        f.writelines(e.to_json() + "\n" for e in union_ledger(every))
    return {
        "ledger_sha_matches": matches,
        "ledger_sha_mismatches": mismatches,
        "groups": per_group,
        "dp_ledgers_equal": dp_equal,
    }


def group_step(text: str) -> tuple[int, int]:
    group, step = text.split(":")
    return int(group), int(step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", default="launcher", choices=["launcher", "replica", "lighthouse"])
    parser.add_argument("--loader", default="zephon", choices=["zephon", "sampler"])
    parser.add_argument("--group", type=int, default=0)
    parser.add_argument("--ranks", type=int, default=1, help="ranks per replica group (DP inside the group)")
    parser.add_argument(
        "--groups", type=int, default=GROUPS, help="replica groups in the job (a replica role's; the launcher runs 3)"
    )
    parser.add_argument("--dp", type=int, default=0)
    parser.add_argument("--store-port", type=int, default=0)
    parser.add_argument("--lighthouse", default="")
    parser.add_argument("--table", default="")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--kill-step", type=int, default=5)
    parser.add_argument("--restart-step", type=int, default=9)
    parser.add_argument("--step-sleep", type=float, default=0.1)
    parser.add_argument("--barrier", default="")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--crash", type=group_step, default=None, help="GROUP:STEP: under torchrun, a rank of GROUP exits in STEP"
    )
    parser.add_argument("--sit-out", type=group_step, default=None, help="GROUP:STEP: a group late to STEP's quorum")
    args = parser.parse_args()
    if args.role == "replica":
        return replica(args)
    if args.role == "lighthouse":
        return lighthouse_main(args.lighthouse)
    args.out = args.out or tempfile.mkdtemp(prefix=f"ft-run-{args.loader}-")
    print(json.dumps(launch(args), indent=1))


if __name__ == "__main__":
    main()
