"""The same documents as JSONL, a Megatron indexed dataset and an OLMo token file: one pass over each.

    python benchmarks/token_files.py [--docs 20000] [--repeat 3]

The Python documentation topics (examples/corpus.py), repeated to `--docs` documents, tokenized once with a
byte-level BPE trained on them and written as one JSONL file, one Megatron `.bin` + `.idx` and one OLMo `.npy`
(the test suite's writers, tests/token_files.py). Each pass opens the source (startup: the listing, the
`.idx` header, the first bytes) and reads every block and encodes its documents as the lanes do (JSONL:
tokenize; token files: ids as they are, BOS/EOS added once). CPU seconds of this process
(time.process_time), the formats alternating `--repeat` times so that they meet the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), os.path.join(ROOT, "tests")]

import corpus  # noqa: E402
from token_files import write_megatron, write_olmo  # noqa: E402

from zephon_titan.config import SourceConfig  # noqa: E402
from zephon_titan.engine.sources import open_source  # noqa: E402
from zephon_titan.titan.tokenizer import load_tokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="zephon_token_files_")
    docs = corpus.prose_documents()
    docs = (docs * (args.docs // len(docs) + 1))[: args.docs]
    corpus.train_tokenizer(docs[:2000], f"{root}/tok", vocab_size=2000)
    tokenizer = load_tokenizer(f"{root}/tok", backend="tokenizers")
    ids = [e.ids for e in tokenizer.tokenizer.encode_batch(docs, add_special_tokens=False)]
    with open(f"{root}/d.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in docs)
    write_megatron(f"{root}/d", ids)
    write_olmo(f"{root}/d.npy", ids, tokenizer.eos_id)
    print(f"{len(docs):,} documents, {sum(map(len, ids)):,} tokens, JSONL {os.path.getsize(f'{root}/d.jsonl'):,} bytes")
    configs = {
        "jsonl": SourceConfig(name="s", paths=[f"{root}/d.jsonl"], block_bytes=1 << 20),
        "megatron": SourceConfig(name="s", paths=[f"{root}/d.bin"], block_rows=1024),
        "olmo": SourceConfig(name="s", paths=[f"{root}/d.npy"], eos_token_id=tokenizer.eos_id, block_bytes=1 << 20),
    }
    for rep in range(args.repeat):
        for name, config in configs.items():
            t0 = time.process_time()
            source = open_source(config)
            t1 = time.process_time()
            tokens = 0
            for b in range(source.num_blocks):
                block = source.read_block(b)
                tokens += sum(map(len, tokenizer.encode(block.texts, source.specials_in_tokens)))
            t2 = time.process_time()
            print(
                f"repeat {rep} {name:9s} open {1e3 * (t1 - t0):6.2f} ms CPU, pass {t2 - t1:7.3f} s CPU, "
                f"{source.num_blocks} blocks, {tokens:,} tokens"
            )


if __name__ == "__main__":
    main()
