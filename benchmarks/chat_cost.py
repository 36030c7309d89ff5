"""What chat sources cost: the same question/answer pairs read as conversations (rendered by a chat template,
tokenized with offsets, masked) and as plain text documents of the same characters.

    python benchmarks/chat_cost.py [--pairs 5] [--rows 400] [--gsm8k DIR --tokenizer DIR]

By default the pairs are made from the Python documentation topics (examples/corpus.py: each topic's first
paragraph a question, the next two its answer) with a byte-level BPE trained on them and a ChatML-like template;
`--gsm8k` and `--tokenizer` name GSM8K's JSON Lines folder and a tokenizer whose tokenizer_config.json has a
chat template (TorchTitan's test tokenizer) instead. Each case runs 8 lanes in this process (best_fit, 1,024-token
rows) for `--rows` rows: CPU seconds of this process (time.process_time) and wall seconds, the cases alternating
`--pairs` times; tokens per CPU-second, and the chat case relative to the text case.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples")]

import corpus  # noqa: E402

from zephon_titan.testing import spec_from_table  # noqa: E402

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_data(root: str, gsm8k: str | None, tokenizer: str | None) -> tuple[str, str]:
    """(the pairs' JSON Lines folder, the tokenizer folder): each record has question, answer and text (both)."""
    os.makedirs(f"{root}/data", exist_ok=True)
    if gsm8k:
        records = [json.loads(line) for name in sorted(os.listdir(gsm8k)) for line in open(os.path.join(gsm8k, name))]
    else:
        records = []
        for doc in corpus.prose_documents():
            parts = [p for p in doc.split("\n\n") if p.strip()]
            if len(parts) >= 3:
                records.append({"question": parts[0].strip(), "answer": "\n\n".join(parts[1:3]).strip()})
    records = (records * (4000 // len(records) + 1))[:4000]
    with open(f"{root}/data/pairs.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps({**r, "text": r["question"] + "\n" + r["answer"]}) + "\n")
    if tokenizer is None:
        tokenizer = corpus.train_tokenizer([r["question"] + r["answer"] for r in records[:2000]], f"{root}/tok", 4000)
        with open(f"{tokenizer}/tokenizer_config.json") as f:
            config = json.load(f)
        with open(f"{tokenizer}/tokenizer_config.json", "w") as f:
            json.dump({**config, "chat_template": CHATML}, f)
    return f"{root}/data", tokenizer


def run(data: str, tokenizer: str, chat: bool, rows: int) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, tokens) for `rows` rows of 8 lanes."""
    from zephon_titan.engine import open_lane_group

    source = {"paths": [f"{data}/*.jsonl"], "block_bytes": 65536}
    if chat:
        source.update(chat=True, prompt_field="question", response_field="answer", too_long="truncate")
    table = {"num_lanes": 8, "seed": 1, "tokenizer_path": tokenizer, "packing": "best_fit", "sources": {"qa": source}}
    c0, w0 = time.process_time(), time.perf_counter()
    spec = spec_from_table(table, seq_len=1024)
    tokens = 0
    with open_lane_group(spec, range(8), 1) as group:
        for _ in range(rows // 8):
            for lane in group.next_step():
                for row in lane:
                    tokens += len(row.inputs) - row.padding
    return time.process_time() - c0, time.perf_counter() - w0, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--gsm8k", help="GSM8K's JSON Lines folder (question, answer)")
    parser.add_argument("--tokenizer", help="a tokenizer folder with a chat template (with --gsm8k)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="chat_cost_")
    try:
        data, tokenizer = write_data(root, args.gsm8k, args.tokenizer)
        results: dict[str, list[tuple[float, float, int]]] = {"text": [], "chat": []}
        for _ in range(args.pairs):
            for name in ("text", "chat"):
                results[name].append(run(data, tokenizer, name == "chat", args.rows))
        base_cpu = statistics.median(t / c for c, _, t in results["text"])
        base_wall = statistics.median(t / w for _, w, t in results["text"])
        for name, runs in results.items():
            cpu = statistics.median(t / c for c, _, t in runs)
            wall = statistics.median(t / w for _, w, t in runs)
            print(
                f"{name:5} {cpu / 1e3:8.0f}K tokens/CPU-s ({cpu / base_cpu:.3f} of text), "
                f"{wall / 1e3:8.0f}K tokens/s wall ({wall / base_wall:.3f})"
            )
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
