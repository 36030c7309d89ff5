"""scripts/step_hashes.py: the per-step digests used to compare machines do not depend on the worker count,
and do depend on the data (a changed seed is a negative control)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _hashes(tmp_path, corpus_dir, tokenizer_dir, workers: int, seed: int) -> list[str]:
    job = tmp_path / f"job_{seed}.toml"
    job.write_text(
        f'[dataloader]\ntokenizer_path = "{tokenizer_dir}"\nnum_lanes = 4\nseed = {seed}\n'
        f'[dataloader.sources.prose]\npaths = ["{corpus_dir}/prose/*.jsonl"]\nweight = 0.5\n'
        f'[dataloader.sources.code]\npaths = ["{corpus_dir}/code/*.parquet"]\nweight = 0.5\n'
    )
    script = os.path.join(REPO, "scripts", "step_hashes.py")
    args = [str(job), "--steps", "4", "--workers", str(workers), "--seq-len", "64", "--rows-per-lane", "2"]
    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")[:-1]
    assert [line.split()[0] for line in lines] == ["1", "2", "3", "4"]
    return lines


def test_step_hashes_do_not_depend_on_workers_and_do_on_the_data(tmp_path, corpus_dir, tokenizer_dir):
    in_process = _hashes(tmp_path, corpus_dir, tokenizer_dir, workers=0, seed=7)
    assert _hashes(tmp_path, corpus_dir, tokenizer_dir, workers=2, seed=7) == in_process
    other_seed = _hashes(tmp_path, corpus_dir, tokenizer_dir, workers=0, seed=8)
    assert all(a != b for a, b in zip(in_process, other_seed))
