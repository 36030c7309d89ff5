"""Peer benchmark: DatologyAI's Zephon 0.2.0 running the pipeline equivalent to ours.

Two JSONL sources -> byte-level BPE tokenization with EOS appended -> document
shuffle -> token-weighted mixture -> wrap packing into rows of seq_len + 1
tokens, built only from Zephon's public API (``Pipeline``, ``Dataset``,
``StaticMixtureWorkSource``, ``TokenEstimation``). ``run_zephon`` measures
throughput, time to the first row, checkpoint size and restore latency; peak
memory is the driver's job.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

EOS_TOKEN = "<|endoftext|>"


class _TokenizersAdapter:
    """The slice of a Hugging Face ``PreTrainedTokenizerFast`` that Zephon calls.

    Zephon's tokenize op expects a transformers tokenizer (or loads one with
    ``AutoTokenizer``), but transformers is not installed here and our pipeline
    uses a bare ``tokenizers`` tokenizer.json. Zephon calls the tokenizer as
    ``tok(texts, add_special_tokens=False, padding=False, truncation=False)``
    and splices EOS itself, so all this needs is batch encoding plus the EOS
    attributes. Only the path is pickled, so spawned workers reload the file
    instead of receiving a Rust object.
    """

    def __init__(self, path: str) -> None:
        self.name_or_path = path
        self._tok: Any = None
        # GPT-2 has no pad token; packing with wrap never pads anyway.
        self.pad_token = None
        self.eos_token = EOS_TOKEN
        self.eos_token_id = self._load().token_to_id(EOS_TOKEN)
        self.bos_token_id = None
        if self.eos_token_id is None:
            raise ValueError(f"{path} has no {EOS_TOKEN} token")

    def _load(self) -> Any:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(self.name_or_path)
        return self._tok

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tok": None}

    def decode(self, ids: Any) -> str:
        return self._load().decode([int(i) for i in ids], skip_special_tokens=False)

    def __call__(self, texts: Any, **kwargs: Any) -> dict[str, Any]:
        # Zephon owns specials, padding and truncation in the mode used here;
        # refuse anything else rather than silently ignoring it.
        if kwargs.get("padding") or kwargs.get("truncation"):
            raise NotImplementedError("adapter supports no padding/truncation")
        add_special = bool(kwargs.get("add_special_tokens", False))
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        encodings = self._load().encode_batch(batch, add_special_tokens=add_special)
        ids = [enc.ids for enc in encodings]
        return {"input_ids": ids[0] if single else ids}


def _as_dataset_dir(pattern: str, scratch: Path, name: str) -> str:
    """Return a directory holding exactly the files ``pattern`` names.

    ``Dataset.from_path`` takes a directory of shards (each ``*.jsonl`` file is
    one shard), while our sources are a file or a glob; a directory of
    symlinks gives Zephon the same file set without copying data.
    """
    if os.path.isdir(pattern):
        return pattern
    files = sorted(glob.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no files match {pattern!r}")
    out = scratch / "sources" / name
    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(files):
        link = out / f"{i:05d}-{Path(f).name}"
        if not link.exists():
            link.symlink_to(os.path.abspath(f))
    return str(out)


@contextmanager
def _catalog_dir(path: Path) -> Iterator[None]:
    """Point Zephon's node-local shard catalog and calibration cache at ``path``.

    Both otherwise persist in /tmp across processes, so a second benchmark run
    would skip discovery and token-ratio calibration and report a warm-cache
    time to first row. A fresh directory per call keeps runs comparable.
    """
    old = os.environ.get("ZEPHON_CATALOG_DIR")
    os.environ["ZEPHON_CATALOG_DIR"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ZEPHON_CATALOG_DIR", None)
        else:
            os.environ["ZEPHON_CATALOG_DIR"] = old


def _build_pipeline(
    dirs: dict[str, str],
    weights: dict[str, float],
    tokenizer: _TokenizersAdapter,
    seq_len: int,
    num_lanes: int,
    seed: int,
    integration: bool = False,
) -> Any:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon.work import TokenEstimation

    datasets = [Dataset.from_path(name, d) for name, d in dirs.items()]
    ws = StaticMixtureWorkSource(
        datasets=datasets,
        mixture=weights,
        seed=seed,
        # A chunk is the unit of documents dealt to one lane. Zephon's default
        # (16384 pointers) is sized for large corpora: a repeating source must
        # hold two chunks' worth of its share, and our test sources have
        # ~1000 documents. 256 documents (~0.5 MB of text) is close to our
        # loader's 1 MiB JSONL blocks.
        chunk_size=256,
        # Shuffle documents: shard (file) order, order inside each file, and a
        # cross-file block shuffle over 8 files' worth of documents ("auto"),
        # a bounded window like our loader's shuffle window of 4 blocks. It
        # shuffles pointers only, so it reads no data.
        shuffle_shards=True,
        shuffle_within_shard=True,
        shuffle_block_size="auto",
        # Our loader repeats every source with a fresh shuffle per epoch.
        exhausted_policy="repeat",
        reshuffle_on_repeat=True,
        # Selecting TokenEstimation makes the weights token weights: the work
        # source rations pointers by estimated tokens (calibrated by
        # tokenizing a sample of each source at startup) and ensure_mixture
        # below corrects the residual on the real token counts.
        token_estimation=TokenEstimation(),
    )
    return (
        Pipeline(ws)
        .options(
            world_size=1,
            global_rank=0,
            canonical_replicas=num_lanes,
            # Zephon's default, stated because it is what we compare against:
            # output independent of thread timing (no latency flushes).
            deterministic=True,
            # How Zephon's own TorchTitan and Megatron integrations run it: stages in worker processes and the
            # engine in a subprocess of its own (MTP mode), so the trainer's thread only dequeues rows.
            **({"runner": "process", "mtp_mode": True} if integration else {}),
        )
        .tokenize(
            tokenizer,
            field="text",
            # OLMo/GPT-2 style: no BOS, EOS appended to every document.
            special_tokens="eos",
            add_attention_mask=False,
            return_tensors="np",
        )
        .ensure_mixture()
        # Uncapped wrap emits only full rows: documents are concatenated and
        # split across rows, no padding. Positions (restart at each document)
        # are kept because our loader emits them too.
        .pack_flat(seq_len + 1, algorithm="wrap", emit_positions=True)
    )


def _row_tokens(item: Any) -> np.ndarray:
    return np.asarray(item.payload["input_ids"])


def run_zephon(
    paths: dict[str, str],
    weights: dict[str, float],
    tokenizer_path: str,
    seq_len: int,
    num_lanes: int,
    rows: int,
    seed: int = 0,
    integration: bool = False,
) -> dict:
    """Run Zephon for ``rows`` packed rows and measure it (see module docstring)."""
    if set(paths) != set(weights):
        raise ValueError("paths and weights must name the same sources")
    row_len = seq_len + 1
    with tempfile.TemporaryDirectory(prefix="peer_zephon_") as tmp, _catalog_dir(Path(tmp) / "catalog"):
        scratch = Path(tmp)
        t_build = time.perf_counter()
        dirs = {name: _as_dataset_dir(p, scratch, name) for name, p in paths.items()}
        tokenizer = _TokenizersAdapter(tokenizer_path)
        pipe = _build_pipeline(dirs, weights, tokenizer, seq_len, num_lanes, seed, integration)

        it = iter(pipe)
        try:
            produced = [next(it)]
            t_first = time.perf_counter()
            while len(produced) < rows:
                produced.append(next(it))
            t_last = time.perf_counter()

            # Take the checkpoint while the engine is live, as a trainer would
            # between steps. The row after it is kept to check the restore.
            state = pipe.checkpoint()
            expected_next = _row_tokens(next(it))
        finally:
            it.close()  # stops the engine's threads

        for item in produced:
            n = len(_row_tokens(item))
            if n != row_len:
                raise AssertionError(f"row of {n} tokens, expected {row_len}")

        # The state is a plain dict of ints/strings/lists; JSON is the format
        # our loader uses, so its JSON size is the like-for-like number.
        # (Zephon's TorchTitan integration pickles it inside DCP.)
        state_json = json.dumps(state).encode()
        state_pickle = pickle.dumps(state)

        # Restore: a fresh pipeline (new Dataset discovery, new engine) fed
        # the state, up to its next row.
        t_restore = time.perf_counter()
        pipe2 = _build_pipeline(dirs, weights, tokenizer, seq_len, num_lanes, seed, integration)
        pipe2.restore(json.loads(state_json))
        it2 = iter(pipe2)
        try:
            resumed = next(it2)
            t_resumed = time.perf_counter()
        finally:
            it2.close()
        restore_ok = bool(np.array_equal(_row_tokens(resumed), expected_next))

    tokens = (len(produced) - 1) * row_len
    # Realized token mixture, from Zephon's own per-row source accounting
    # (component id = position of the source in ``paths``).
    per_source = dict.fromkeys(dirs, 0)
    names = list(dirs)
    for item in produced:
        for cid, n in item.meta.component_token_counts.items():
            per_source[names[cid]] += n
    total = sum(per_source.values())
    return {
        # Rows after the first over the time between first and last row.
        "tokens_per_s": tokens / (t_last - t_first) if t_last > t_first else None,
        # Zephon tokenizes ahead while the first row is being assembled
        # (op queues, final prefetch), so part of these rows' work lands
        # before t_first; this rate charges it all, startup included.
        "tokens_per_s_from_build": len(produced) * row_len / (t_last - t_build),
        "time_to_first_row_s": t_first - t_build,
        "state_bytes": len(state_json),
        "state_format": f"json (Pipeline.checkpoint() dict; pickle is {len(state_pickle)} bytes)",
        "state_bytes_per_lane": len(state_json) / num_lanes,
        "restore_to_first_row_s": t_resumed - t_restore,
        "rows": len(produced),
        "restore_matches_uninterrupted": restore_ok,
        "token_shares": {k: round(v / total, 4) for k, v in per_source.items()},
        "notes": (
            f"zephon StaticMixtureWorkSource(token_estimation=TokenEstimation(), "
            f"shuffle_shards/within_shard, shuffle_block_size='auto', repeat) "
            f"-> tokenize(tokenizers.json adapter, special_tokens='eos') "
            f"-> ensure_mixture() -> pack_flat({row_len}, algorithm='wrap'); "
            f"options world_size=1, canonical_replicas={num_lanes}, chunk_size=256; "
            + (
                "runner='process', mtp_mode=True (its TorchTitan/Megatron integrations' setting): stages in "
                "worker processes, the engine in a subprocess"
                if integration
                else "Engine in-process (mtp_mode off), Zephon's default plan: one thread stage (fetch x4, "
                "tokenize x4 threads)"
            )
            + "; token-ratio calibration runs in a spawned process pool before the first row"
        ),
        # Lets a reader see the rows are real text, EOS between documents.
        "first_row_preview": tokenizer.decode(_row_tokens(produced[0])[:48]),
    }


if __name__ == "__main__":
    # python benchmarks/peer_zephon.py TOKENIZER_JSON NAME=FILE.jsonl:WEIGHT ...  (one-off run of the peer)
    tokenizer_json, *pairs = sys.argv[1:]
    sources = {p.split("=", 1)[0]: p.split("=", 1)[1].rsplit(":", 1) for p in pairs}
    result = run_zephon(
        paths={name: path for name, (path, _) in sources.items()},
        weights={name: float(weight) for name, (_, weight) in sources.items()},
        tokenizer_path=tokenizer_json,
        seq_len=2048,
        num_lanes=8,
        rows=200,
    )
    print(json.dumps(result, indent=2))
