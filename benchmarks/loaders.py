"""Side-by-side loader benchmark: the same text, tokenizer, cores and row shape, in one run.

    python benchmarks/loaders.py                      # the demo corpus and tokenizer, built here
    python benchmarks/loaders.py --tokenizer path/to/tokenizer_dir \
        --source c4=path/to/c4.jsonl:0.6 --source wiki=path/to/wiki.jsonl:0.4 \
        --seq-len 2048 --lanes 8 --rows 480 [--sweep-files 1,100,1000]

Each loader runs in its own child process (so peak memory is its own), producing rows
of seq_len input tokens from both sources:
  raw          Hugging Face tokenizers' encode_batch over all documents on all cores: the old bound
  raw_fast     fastokens' encode_batch_flat over the same documents (same ids)
  zephon_titan with 1 worker (in process) and 2 worker processes; 8 lanes, one rank; with the
               tokenizers backend, and (`_fast`) with the fastokens backend
  zephon-0.2   DatologyAI's Zephon 0.2.0 from PyPI, the equivalent pipeline (benchmarks/peer_zephon.py)
  titan        TorchTitan 0.3.0's HuggingFaceTextDataLoader over the same files (no mixing, no shuffle)
It reports packed tokens/s (input tokens of produced rows after the first batch; zephon_titan's over
the second half of its steps, at steady state), time to first batch, peak RSS,
checkpoint state bytes (per lane where the loader has lanes) and restore time to the first batch.
`--sweep-files` also times zephon_titan's first batch for one lane with the text split into N files.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _peak_mb() -> dict:
    return {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def _rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) // 1024


def _documents(args) -> list[str]:
    texts = []
    for _, path, _ in args.sources:
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f if line.strip())
    return texts


def _other_text() -> list[str]:
    """Text that is not the benchmark's, to warm a tokenizer with before its bound is timed (a long run's
    tokenizer is loaded and warm: timing its first, cold call would understate the bound)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    import corpus

    return corpus.prose_documents()


def _bound(encode, texts: list[str]) -> dict:
    encode(_other_text())  # warmed on other text
    started, cpu = time.perf_counter(), time.process_time()
    tokens = encode(texts)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "tokens_per_s": tokens / wall,
        "notes": f"{len(texts)} documents, one batch after a warm-up on other text; "
        f"{tokens / cpu / 1e6:.2f} M tokens per CPU-second",
    }


def run_raw(args) -> dict:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))

    def encode(texts: list[str]) -> int:  # + EOS
        return sum(len(e.ids) + 1 for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False))

    return _bound(encode, _documents(args))


def run_raw_fast(args) -> dict:
    import fastokens

    with open(os.path.join(args.tokenizer, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer = fastokens.Tokenizer.from_json_str(f.read())

    def encode(texts: list[str]) -> int:
        ids, _ = tokenizer.encode_batch_flat(texts, add_special_tokens=False)
        return len(ids) // 4 + len(texts)  # uint32 ids, + EOS

    return _bound(encode, _documents(args))


def _zephon_titan_spec(args, sources=None, lanes=None, backend="tokenizers"):
    from zephon_titan.config import DataConfig, SourceConfig
    from zephon_titan.engine import build_engine
    from zephon_titan.titan.tokenizer import load_tokenizer

    sources = sources or [SourceConfig(name=n, paths=[p], weight=w, block_bytes=1 << 20) for n, p, w in args.sources]
    config = DataConfig(
        sources=sorted(sources, key=lambda s: s.name),
        num_lanes=lanes or args.lanes,
        tokenizer_path=args.tokenizer,
        add_bos=False,
        tokenizer_backend=backend,
    )  # EOS only, like the peers' GPT-2 setup
    return build_engine(config, args.seq_len, load_tokenizer(args.tokenizer, add_bos=False, backend=backend))


def run_zephon_titan(args, workers: int, backend: str = "tokenizers") -> dict:
    """`workers` processes producing rows; 1 = inside this process (num_workers = 0)."""
    import torchtitan.components.tokenizer  # noqa: F401  (the trainer has imported torch before its loader starts)

    from zephon_titan.engine import LaneState, open_lane_group

    started = time.perf_counter()
    spec = _zephon_titan_spec(args, backend=backend)
    per_lane = 8
    steps = max(2, args.rows // (per_lane * args.lanes))
    with open_lane_group(
        spec, range(args.lanes), per_lane, num_workers=0 if workers == 1 else workers, prefetch_factor=2
    ) as group:
        group.next_step()
        first = time.perf_counter()
        # Throughput at steady state: the second half of the steps (in process, the first steps are
        # tokenized by `tokenizers` while the fast backend loads in the background).
        measured = steps - 1 - (steps - 1) // 2
        worker_rss = 0
        for i in range(steps - 1):
            if i == steps - 1 - measured:
                steady = time.perf_counter()
            group.next_step()
            for proc in getattr(group, "_procs", []):  # worker processes: their own RSS, sampled per step
                worker_rss = max(worker_rss, _rss_mb(proc.pid))
        elapsed = time.perf_counter() - steady
        saved = {lane: state.to_dict() for lane, state in group.state().items()}
    state_bytes = len(json.dumps(saved).encode())
    restart = time.perf_counter()
    states = {lane: LaneState.from_dict(s) for lane, s in json.loads(json.dumps(saved)).items()}
    with open_lane_group(
        _zephon_titan_spec(args, backend=backend),
        range(args.lanes),
        per_lane,
        num_workers=0 if workers == 1 else workers,
        states={int(k): v for k, v in states.items()},
    ) as group:
        group.next_step()
        restore = time.perf_counter() - restart
    warm = None
    if workers > 1:
        # As under the trainer: the loader (and its workers) is built, the model is built and the
        # checkpoint loaded (WARM_UP_S here), then the first batch is asked for; timed from that request.
        with open_lane_group(
            _zephon_titan_spec(args, backend=backend), range(args.lanes), per_lane, workers, deferred=True
        ) as group:
            time.sleep(WARM_UP_S)
            asked = time.perf_counter()
            group.start({int(k): v for k, v in states.items()})
            group.next_step()
            warm = time.perf_counter() - asked
    rows = measured * per_lane * args.lanes
    return {
        "tokens_per_s": rows * args.seq_len / elapsed,
        "time_to_first_batch_s": first - started,
        "state_bytes_per_lane": state_bytes / args.lanes,
        "restore_to_first_batch_s": restore,
        "restore_warm_s": warm,
        "peak_worker_rss_mb": worker_rss or None,
        "notes": f"{args.lanes} lanes on one rank, {per_lane} rows per lane per step, {workers} worker(s), "
        f"backend {spec.tokenizer.select_backend()}",
    }


# Seconds between building the loader and asking for its first batch in the `restore_warm_s` case: a
# trainer builds its model and loads its checkpoint meanwhile (a 1B model takes far longer).
WARM_UP_S = 2.0


def run_zephon_peer(args, integration: bool = False) -> dict:
    """Zephon 0.2.0 by its defaults (threads, the engine in process), or (`integration`) as its TorchTitan and
    Megatron integrations configure it: runner="process", mtp_mode=True."""
    sys.path.insert(0, HERE)
    from peer_zephon import run_zephon

    out = run_zephon(
        {n: p for n, p, _ in args.sources},
        {n: w for n, _, w in args.sources},
        os.path.join(args.tokenizer, "tokenizer.json"),
        args.seq_len,
        args.lanes,
        args.rows,
        integration=integration,
    )
    per_input = args.seq_len / (args.seq_len + 1)  # it counts seq_len + 1 tokens per row
    return {
        "tokens_per_s": out["tokens_per_s"] * per_input,
        "time_to_first_batch_s": out["time_to_first_row_s"],
        "state_bytes_per_lane": out["state_bytes_per_lane"],
        "restore_to_first_batch_s": out["restore_to_first_row_s"],
        "notes": out.get("notes", "")[:200],
    }


def run_titan(args) -> dict:
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    scratch = tempfile.mkdtemp(prefix="titan_bench_")
    os.environ["HF_DATASETS_CACHE"] = os.path.join(scratch, "cache")  # a cold start, like the other loaders
    data = os.path.join(scratch, "data")
    os.makedirs(data)
    for name, path, _ in args.sources:
        os.symlink(os.path.abspath(path), os.path.join(data, f"{name}.jsonl"))
    import pickle

    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    def build():
        tokenizer = HuggingFaceTokenizer(HuggingFaceTokenizer.Config(), tokenizer_path=args.tokenizer)
        config = HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=data, infinite=True)
        return config.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=args.seq_len, local_batch_size=8)

    started = time.perf_counter()
    loader = build()
    batches = iter(loader)
    next(batches)
    first = time.perf_counter()
    steps = max(2, args.rows // 8)
    for _ in range(steps - 1):
        next(batches)
    elapsed = time.perf_counter() - first
    state = loader.state_dict()
    restart = time.perf_counter()
    again = build()
    again.load_state_dict(state)
    next(iter(again))
    restore = time.perf_counter() - restart
    return {
        "tokens_per_s": (steps - 1) * 8 * args.seq_len / elapsed,
        "time_to_first_batch_s": first - started,
        "state_bytes_per_lane": len(pickle.dumps(state)),
        "restore_to_first_batch_s": restore,
        "notes": "both files as one dataset, file order, BOS+EOS; state is per rank (pickled)",
    }


CHILDREN = {
    "raw": run_raw,
    "raw_fast": run_raw_fast,
    "zephon_titan_1w": lambda a: run_zephon_titan(a, 1),
    "zephon_titan_2w": lambda a: run_zephon_titan(a, 2),
    "zephon_titan_fast_1w": lambda a: run_zephon_titan(a, 1, "fastokens"),
    "zephon_titan_fast_2w": lambda a: run_zephon_titan(a, 2, "fastokens"),
    "zephon-0.2": run_zephon_peer,
    "zephon-0.2-process-mtp": lambda a: run_zephon_peer(a, integration=True),
    "titan": run_titan,
}


def run_files_sweep(args, num_files: int) -> dict:
    """zephon_titan's first batch for lane 0 of 8 with the text split into `num_files` JSONL files."""
    from zephon_titan.config import SourceConfig

    scratch = tempfile.mkdtemp(prefix="files_sweep_")
    lines = []
    for _, path, _ in args.sources:
        with open(path, encoding="utf-8") as f:
            lines.extend(line for line in f if line.strip())
    per_file = -(-len(lines) // num_files)
    for i in range(num_files):
        with open(os.path.join(scratch, f"part-{i:05d}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(lines[i * per_file : (i + 1) * per_file])
    from zephon_titan.engine import LaneStream

    started = time.perf_counter()
    spec = _zephon_titan_spec(
        args, [SourceConfig(name="all", paths=[os.path.join(scratch, "*.jsonl")], block_bytes=1 << 16)]
    )
    LaneStream(spec, 0).take(8)
    return {
        "files": num_files,
        "time_to_first_batch_s": time.perf_counter() - started,
        "blocks": spec.sources[0].num_blocks,
    }


def child_main(name: str, args) -> None:
    if name.startswith("files:"):
        result = run_files_sweep(args, int(name.split(":")[1]))
    else:
        result = CHILDREN[name](args)
    print(json.dumps({**result, **_peak_mb()}))


DEMO_BENCH = os.path.join(tempfile.gettempdir(), "zephon_titan_bench_demo")


def _demo_sources() -> list[str]:
    """The demo corpus (built by the project, examples/demo.py) as one JSONL file per source."""
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import demo
    import pyarrow.parquet as pq

    config = demo.build_corpus(DEMO_BENCH)
    out = []
    for source in config.sources:
        target = os.path.join(DEMO_BENCH, f"{source.name}.jsonl")
        if not os.path.exists(target):
            with open(target + ".partial", "w", encoding="utf-8") as f:
                for path in sorted(glob.glob(source.paths[0])):
                    if path.endswith(".parquet"):
                        texts = pq.read_table(path).column("text").to_pylist()
                    else:
                        with open(path, encoding="utf-8") as lines:
                            texts = [json.loads(line)["text"] for line in lines if line.strip()]
                    f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
            os.replace(target + ".partial", target)
        out.append(f"{source.name}={target}:{source.weight}")
    return out


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", help="directory with tokenizer.json (default: the demo's)")
    p.add_argument("--source", action="append", help="name=file.jsonl:weight (default: the demo corpus)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--rows", type=int, default=480)
    p.add_argument("--only", help="comma-separated subset of " + ",".join(CHILDREN))
    p.add_argument("--sweep-files", default="", help="e.g. 1,100,1000")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.source:
        args.source = _demo_sources()
    args.tokenizer = args.tokenizer or os.path.join(DEMO_BENCH, "tokenizer")
    args.sources = []
    for spec in args.source:
        name, rest = spec.split("=", 1)
        path, _, weight = (
            rest.rpartition(":") if rest.rsplit(":", 1)[-1].replace(".", "").isdigit() else (rest, "", "1")
        )
        args.sources.append((name, path, float(weight)))
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.child:
        child_main(args.child, args)
        return 0
    argv = sys.argv[1:] if argv is None else argv
    names = args.only.split(",") if args.only else list(CHILDREN)
    results = {}
    for name in names + [f"files:{n}" for n in args.sweep_files.split(",") if n]:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *argv, "--child", name], capture_output=True, text=True
        )
        if out.returncode != 0:
            results[name] = {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
            print(out.stderr[-3000:], file=sys.stderr)
            continue
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    raw = results.get("raw", {}).get("tokens_per_s")
    print(
        "\n| loader | packed tokens/s | vs raw tokenizer | time to first batch | peak RSS (main / worker) | state per lane | restore to first batch | restore, workers started with the loader |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        r = results[name]
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | | | | |")
            continue
        tps = r["tokens_per_s"]

        def fmt(v, unit="", d=2):
            return "—" if v is None else f"{v:,.{d}f}{unit}"

        print(
            f"| {name} | {tps / 1e6:.3f} M | {f'{tps / raw:.0%}' if raw else '—'} | {fmt(r.get('time_to_first_batch_s'), ' s')} | "
            f"{r['peak_rss_mb']} / {r.get('peak_worker_rss_mb') or '—'} MB | {fmt(r.get('state_bytes_per_lane'), ' B', 0)} | "
            f"{fmt(r.get('restore_to_first_batch_s'), ' s')} | {fmt(r.get('restore_warm_s'), ' s')} |"
        )
    sweep = [results[k] for k in results if k.startswith("files:") and "error" not in results[k]]
    if sweep:
        print("\n| files | blocks | zephon_titan time to first batch (one lane of 8) |\n|---|---|---|")
        for r in sweep:
            print(f"| {r['files']} | {r['blocks']} | {r['time_to_first_batch_s']:.3f} s |")
    print("\n" + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
