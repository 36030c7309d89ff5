"""torchdata.nodes prototype beside the current lane-group path, in one run (not part of the package).

    python benchmarks/torchdata_nodes.py --quick            # fixture corpus, under 2 minutes on 2 cores
    python benchmarks/torchdata_nodes.py --data DIR --tokenizer DIR --steps 12 --reps 5

One rank owning 8 lanes (lanes 0..7 of 8) is read five ways:
  inprocess       open_lane_group in process (num_workers = 0; `workers = 1` before the knob rename)
  procs_1         open_lane_group with 1 worker process (ProcessLaneGroup: spawn, pipe, bounded prefetch)
  procs_2         open_lane_group with 2 worker processes
  node            LaneGroupNode: the LaneGroup as a torchdata.nodes.BaseNode, one item = one step's rows
                  with each lane's state right after them; next() / reset(initial_state) / get_state()
  node_prefetch   Prefetcher(LaneGroupNode, prefetch_factor) : the same, produced by a background thread
ParallelMapper does not apply (a lane is a stateful stream, not a map over independent items) and PinMemory
needs an accelerator, so neither is composed here.

Checks (exit status 1 if any fails): every path gives byte-identical rows over N steps (SHA-256 of the
concatenated row bytes); after k steps the consumed state (the item's lane states, as ZephonDataLoader
keeps them) and torchdata's own Prefetcher.state_dict() both restore to the same following rows, also
split across two ranks of 4 lanes (per-lane state stays elastic).

Throughput: interleaved repetitions (the order rotates each repetition); packed input tokens/s of the steps
after the first, as a ratio to inprocess within the same repetition (median and range over repetitions), and,
for the in-process paths, this process's CPU seconds per million tokens (all threads; steadier than wall
time on a shared machine). Two consumer models: `free` (the consumer only takes rows) and `trainer` (the
consumer sleeps, GIL released, as long as inprocess takes to produce a step, standing in for a GPU step).
The last line of stdout is JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))  # helpers.make_spec: the engine as the tests build it
sys.path.insert(0, os.path.join(REPO, "examples"))  # corpus: the fixture corpus and tokenizer

from torchdata.nodes import BaseNode, Prefetcher  # noqa: E402

from zephon_titan.engine import LaneGroup, LaneState, open_lane_group  # noqa: E402
from zephon_titan.errors import LaneExhausted  # noqa: E402

Step = list  # one step: per lane, a list of (Row, LaneState right after that row)


class LaneGroupNode(BaseNode[Step]):
    """The lanes one rank owns as a torchdata node: each item is one step (R rows per lane, lane order),
    each row paired with its lane's state right after it. State: one JSON-able entry per lane."""

    def __init__(self, spec, lane_ids, rows_per_step: int, states: dict[int, LaneState] | None = None):
        super().__init__()
        self.spec, self.lane_ids, self.rows_per_step = spec, list(lane_ids), rows_per_step
        self._start = states
        self._group: LaneGroup | None = None

    def reset(self, initial_state: dict | None = None):
        super().reset(initial_state)
        if initial_state is not None:
            states = {int(k): LaneState.from_dict(v) for k, v in initial_state["lanes"].items()}
        else:
            states = self._start
        self._group = LaneGroup(self.spec, self.lane_ids, self.rows_per_step, states)

    def next(self) -> Step:
        assert self._group is not None
        try:
            return self._group.next_step_with_states()
        except LaneExhausted:
            raise StopIteration from None

    def get_state(self) -> dict[str, Any]:
        assert self._group is not None
        return {"lanes": {str(lane): state.to_dict() for lane, state in self._group.state().items()}}


class _Path:
    """One way of reading the rank's steps, with the consumed state kept as ZephonDataLoader keeps it."""

    def __init__(self, name: str, spec_factory, lane_ids, rows_per_step: int, prefetch: int, states=None):
        self.name = name
        self.consumed: dict[int, LaneState] = {}
        if name == "inprocess" or name.startswith("procs_"):
            processes = 0 if name == "inprocess" else int(name[len("procs_") :])
            self.source = open_lane_group(
                spec_factory(), lane_ids, rows_per_step, _workers(processes), prefetch, states
            )
            self._next = self.source.next_step_with_states
        else:
            node: BaseNode = LaneGroupNode(spec_factory(), lane_ids, rows_per_step, states)
            if name == "node_prefetch":
                node = Prefetcher(node, prefetch_factor=prefetch)
            self.source = node
            self._next = lambda: next(node)

    def step(self) -> Step:
        step = self._next()
        for rows in step:
            row_state = rows[-1][1]
            self.consumed[row_state.lane_id] = row_state
        return step

    def close(self) -> None:
        if hasattr(self.source, "close"):
            self.source.close()
        elif isinstance(self.source, Prefetcher) and self.source._it is not None:
            self.source._it._shutdown()


PATHS = ("inprocess", "procs_1", "procs_2", "node", "node_prefetch")
BASE = "inprocess"


def _workers(processes: int) -> int:
    """open_lane_group's 4th argument for `processes` worker processes, before (`workers`, 1 = in process)
    and after (`num_workers`, 0 = in process) the knob rename."""
    if "num_workers" in inspect.signature(open_lane_group).parameters:
        return processes
    if processes == 1:
        raise SystemExit("procs_1 needs open_lane_group(num_workers=...); this tree has `workers` (1 = in process)")
    return max(1, processes)


def digest(steps) -> str:
    h = hashlib.sha256()
    for step in steps:
        for rows in step:
            for row, _ in rows:
                h.update(row.to_bytes())
    return h.hexdigest()


def check_rows_and_state(spec_factory, lanes: int, rows_per_step: int, steps: int, cut: int, prefetch: int) -> dict:
    lane_ids = range(lanes)
    digests, after_cut, consumed_at_cut, prefetcher_state, ran_ahead = {}, {}, {}, None, False
    for name in PATHS:
        path = _Path(name, spec_factory, lane_ids, rows_per_step, prefetch)
        try:
            taken = [path.step() for _ in range(steps)]
            # State after `cut` steps: recorded when step `cut` was consumed, while the prefetcher ran ahead.
            path_cut = _Path(name, spec_factory, lane_ids, rows_per_step, prefetch)
            try:
                for _ in range(cut):
                    path_cut.step()
                time.sleep(0.2)  # let any prefetcher run ahead before the state is read
                consumed_at_cut[name] = {lane: s.to_dict() for lane, s in path_cut.consumed.items()}
                if name == "node_prefetch":
                    prefetcher_state = json.loads(json.dumps(path_cut.source.state_dict()))
                    produced = path_cut.source.source.get_state()["lanes"]  # the producer's own position
                    ran_ahead = all(produced[str(lane)]["rows"] > s.rows for lane, s in path_cut.consumed.items())
            finally:
                path_cut.close()
        finally:
            path.close()
        digests[name] = digest(taken)
        after_cut[name] = digest(taken[cut:])
    reference = digests[BASE]
    expected_after = after_cut[BASE]
    checks: dict[str, bool] = {f"rows_equal:{name}": d == reference for name, d in digests.items()}
    states = [json.dumps(v, sort_keys=True) for v in consumed_at_cut.values()]
    checks["prefetcher_ran_ahead_of_consumer"] = ran_ahead  # so the state checks below can fail
    checks["consumed_state_equal_across_paths"] = len(set(states)) == 1

    def restored(name: str, state: dict[int, dict], owned) -> str:
        path = _Path(
            name,
            spec_factory,
            owned,
            rows_per_step,
            prefetch,
            {lane: LaneState.from_dict(state[lane]) for lane in owned},
        )
        try:
            return digest([path.step() for _ in range(steps - cut)])
        finally:
            path.close()

    state = consumed_at_cut["node_prefetch"]
    for name in PATHS:
        checks[f"restore_consumed_state:{name}"] = restored(name, state, lane_ids) == expected_after
    # torchdata's own state: the source snapshot at the last consumed item (snapshot_frequency=1).
    assert prefetcher_state is not None
    checks["prefetcher_snapshot_is_consumed_state"] = prefetcher_state["steps_since_snapshot"] == 0 and {
        int(k): v for k, v in prefetcher_state["snapshot"]["lanes"].items()
    } == {int(k): v for k, v in state.items()}
    fresh = Prefetcher(LaneGroupNode(spec_factory(), lane_ids, rows_per_step), prefetch_factor=prefetch)
    fresh.reset(prefetcher_state)
    try:
        checks["restore_prefetcher_state_dict"] = digest([next(fresh) for _ in range(steps - cut)]) == expected_after
    finally:
        assert fresh._it is not None
        fresh._it._shutdown()
    # Elastic: the same per-lane entries, read by two ranks of lanes/2 lanes each; rank order = canonical order.
    half = lanes // 2
    ranks: list[_Path] = []
    for owned in (range(0, half), range(half, lanes)):
        owned_states = {lane: LaneState.from_dict(state[lane]) for lane in owned}
        ranks.append(_Path("node_prefetch", spec_factory, owned, rows_per_step, prefetch, owned_states))
    try:
        merged = [sum((rank.step() for rank in ranks), []) for _ in range(steps - cut)]
    finally:
        for rank in ranks:
            rank.close()
    checks["restore_split_across_2_ranks"] = digest(merged) == expected_after
    return {"digest": reference, "checks": checks}


def measure(spec_factory, lanes: int, rows_per_step: int, steps: int, reps: int, prefetch: int, seq_len: int):
    """Interleaved repetitions; per repetition and path, packed tokens/s of steps 2..steps."""
    tokens = (steps - 1) * lanes * rows_per_step * seq_len
    results: dict[str, dict[str, list[float]]] = {"free": {p: [] for p in PATHS}, "trainer": {p: [] for p in PATHS}}
    cpu: dict[str, list[float]] = {
        p: [] for p in PATHS if not p.startswith("procs_")
    }  # this process's CPU s per M tokens
    step_s = None
    for rep in range(reps):
        order = PATHS[rep % len(PATHS) :] + PATHS[: rep % len(PATHS)]
        for mode in ("free", "trainer"):
            for name in order:
                path = _Path(name, spec_factory, range(lanes), rows_per_step, prefetch)
                try:
                    path.step()  # first batch (worker start-up, first blocks) excluded
                    if mode == "trainer":
                        time.sleep(step_s)
                    started, cpu_started = time.perf_counter(), time.process_time()
                    for _ in range(steps - 1):
                        path.step()
                        if mode == "trainer":
                            time.sleep(step_s)  # a GPU step: the GIL is free, cores are not busy
                    results[mode][name].append(tokens / (time.perf_counter() - started))
                    if mode == "free" and name in cpu:
                        cpu[name].append((time.process_time() - cpu_started) / tokens * 1e6)
                finally:
                    path.close()
            if mode == "free" and step_s is None:
                step_s = tokens / results["free"][BASE][0] / (steps - 1)
    summary: dict[str, Any] = {
        "simulated_step_s": step_s,
        "cpu_s_per_m_tokens_median": {name: statistics.median(v) for name, v in cpu.items()},
    }
    for mode, by_path in results.items():
        summary[mode] = {}
        for name, values in by_path.items():
            base = by_path[BASE]
            ratios = [v / b for v, b in zip(values, base)]
            summary[mode][name] = {
                "tokens_per_s_median": statistics.median(values),
                "ratio_to_inprocess_median": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
            }
    return summary


def build_fixture(root: str) -> tuple[str, str]:
    """The tests' corpus (prose JSONL + code Parquet) and BPE tokenizer, as tests/conftest.py builds them."""
    import corpus

    prose, code = corpus.prose_documents(), corpus.code_documents(max_files=40)
    tokenizer = corpus.train_tokenizer(prose + code, os.path.join(root, "tokenizer"), vocab_size=2000)
    corpus.write_jsonl(prose, os.path.join(root, "corpus", "prose"), num_files=3)
    corpus.write_parquet(code, os.path.join(root, "corpus", "code"), num_files=3, row_group_size=4)
    return os.path.join(root, "corpus"), tokenizer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a corpus laid out as the test fixture (prose/*.jsonl, code/*.parquet)")
    p.add_argument("--tokenizer", help="directory with tokenizer.json (built with --data absent)")
    p.add_argument("--quick", action="store_true", help="small defaults for a 2-core machine (~1 minute)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--rows-per-lane", type=int, default=None, help="rows per lane per step (R)")
    p.add_argument("--steps", type=int, default=None, help="steps per throughput measurement")
    p.add_argument("--check-steps", type=int, default=6, help="steps compared by the row and state checks")
    p.add_argument("--reps", type=int, default=None, help="interleaved repetitions")
    p.add_argument("--prefetch", type=int, default=2, help="prefetch_steps / prefetch_factor")
    p.add_argument("--no-throughput", action="store_true", help="row and state checks only")
    args = p.parse_args(argv)
    rows_per_step = args.rows_per_lane or 4
    steps = args.steps or (20 if args.quick else 100)
    reps = args.reps or (4 if args.quick else 7)

    from helpers import make_spec

    with tempfile.TemporaryDirectory(prefix="zephon_torchdata_") as scratch:
        data, tokenizer = (args.data, args.tokenizer) if args.data else build_fixture(scratch)

        def spec_factory():
            return make_spec(data, tokenizer, seq_len=args.seq_len, num_lanes=args.lanes)

        started = time.perf_counter()
        checked = check_rows_and_state(
            spec_factory, args.lanes, rows_per_step, args.check_steps, args.check_steps // 2, args.prefetch
        )
        out: dict[str, Any] = {
            "settings": {
                "seq_len": args.seq_len,
                "lanes": args.lanes,
                "rows_per_lane_per_step": rows_per_step,
                "steps": steps,
                "check_steps": args.check_steps,
                "reps": reps,
                "prefetch": args.prefetch,
                "cpus": os.cpu_count(),
            },
            **checked,
        }
        if not args.no_throughput:
            out["throughput"] = measure(
                spec_factory, args.lanes, rows_per_step, steps, reps, args.prefetch, args.seq_len
            )
        out["wall_s"] = time.perf_counter() - started

    for name, ok in out["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if "throughput" in out:
        t = out["throughput"]
        print(f"\nsimulated trainer step: {t['simulated_step_s'] * 1000:.0f} ms (inprocess's time per step)")
        print("| path | free: tokens/s | free: vs inprocess | trainer: tokens/s | trainer: vs inprocess |")
        print("|---|---|---|---|---|")
        for name in PATHS:
            f, r = t["free"][name], t["trainer"][name]
            print(
                f"| {name} | {f['tokens_per_s_median'] / 1e3:.0f} k | {f['ratio_to_inprocess_median']:.2f} "
                f"({f['ratio_range'][0]:.2f}-{f['ratio_range'][1]:.2f}) | {r['tokens_per_s_median'] / 1e3:.0f} k | "
                f"{r['ratio_to_inprocess_median']:.2f} ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}) |"
            )
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in t["cpu_s_per_m_tokens_median"].items())
        print(f"\nCPU seconds per million tokens, this process (all threads), free mode: {cpu}")
    print(json.dumps(out))
    return 0 if all(out["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
