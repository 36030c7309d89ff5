"""The benchmark script keeps working (tiny sizes; the figures themselves live in docs/performance.md)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_benchmark_script_runs(corpus_dir, tokenizer_dir):
    prose = sorted(os.listdir(os.path.join(corpus_dir, "prose")))
    args = [
        sys.executable,
        os.path.join(REPO, "benchmarks", "loaders.py"),
        "--tokenizer",
        tokenizer_dir,
        "--source",
        f"a={os.path.join(corpus_dir, 'prose', prose[0])}:0.5",
        "--source",
        f"b={os.path.join(corpus_dir, 'prose', prose[1])}:0.5",
        "--seq-len",
        "64",
        "--lanes",
        "4",
        "--rows",
        "64",
        "--only",
        "raw,raw_fast,zephon_titan_1w,zephon_titan_fast_2w",
        "--sweep-files",
        "3",
    ]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("zephon_titan_1w", "zephon_titan_fast_2w"):
        assert results[name]["tokens_per_s"] > 0 and results[name]["state_bytes_per_lane"] < 1024
    assert "backend fastokens" in results["zephon_titan_fast_2w"]["notes"]
    assert results["raw_fast"]["tokens_per_s"] > 0
    assert results["files:3"]["files"] == 3
    assert "| zephon_titan_fast_2w |" in out.stdout
