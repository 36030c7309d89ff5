"""From pretraining into SFT through the real TorchTitan trainer (CPU, gloo, the debug model): text sources for
steps 1-2, then mostly a chat source from step 3 (`[[dataloader.phases]]`), trained on 2 ranks, resumed from
step 2 on 3 ranks across the switch. Every step's ledger entry, the trained targets per source included, equals
`plan`'s and the uninterrupted run's; the losses are finite; the chat source's loss is computed over exactly the
targets its mask trains (the trainer's count per step equals the ledger's `targets`, below its tokens)."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
from conftest import CPU_CONFIG, check, copy_checkpoint, losses, torchrun

from zephon_titan.engine.ledger import read_ledger

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 4
SWITCH = 3  # the first SFT step
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_TARGETS = re.compile(r"zephon loss per source: .*\(targets: chat (\d+), code (\d+), prose (\d+)\)")


def _job(workdir: str) -> str:
    """The CPU debug job with a chat source of multi-turn conversations and a schedule into it."""
    with open(
        os.path.join(workdir, "demo_out", "prose", sorted(os.listdir(os.path.join(workdir, "demo_out", "prose")))[0])
    ) as f:
        words = " ".join(json.loads(line)["text"] for line in f).split()
    os.makedirs(os.path.join(workdir, "chat"), exist_ok=True)
    with open(os.path.join(workdir, "chat", "part-0.jsonl"), "w") as f:
        for k in range(300):
            turns = []
            for i in range(1 + k % 3):
                at = 13 * k + 9 * i
                turns += [{"role": "user", "content": " ".join(words[at : at + 4 + k % 5])},
                          {"role": "assistant", "content": " ".join(words[at + 4 : at + 12])}]  # fmt: skip
            f.write(json.dumps({"messages": turns}) + "\n")
    with open(os.path.join(workdir, "chat", "chat.jinja"), "w") as f:
        f.write(CHATML)
    with open(CPU_CONFIG) as f:
        text = f.read()
    text = text.replace("global_batch_size = 16", "global_batch_size = 24").replace("num_lanes = 8", "num_lanes = 6")
    text = text.replace("weight = 0.3\n", "").replace("weight = 0.7\n", "")
    text = text.replace("seed = 2026\n", 'seed = 2026\npacking = "best_fit"\nbest_fit_window_docs = 32\n')
    text += (
        '\n[dataloader.sources.chat]\npaths = ["chat/*.jsonl"]\nchat = true\nchat_template = "chat/chat.jinja"\n'
        "block_bytes = 16384\n"
        "\n[[dataloader.phases]]\nstart_step = 1\nweights = { code = 0.3, prose = 0.7 }\n"
        f"\n[[dataloader.phases]]\nstart_step = {SWITCH}\nramp_steps = 0\nweights = {{ chat = 0.8, prose = 0.2 }}\n"
    )
    path = os.path.join(workdir, "sft.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def _train(workdir: str, config: str, run: str, nproc: int) -> tuple[dict, str]:
    args = ["--job.config_file", config, "--dump_folder", run, "--training.steps", str(STEPS),
            "--training.local_batch_size", "4", "--metrics.disable_color_printing"]  # fmt: skip
    done = check(torchrun(workdir, "zephon_titan.train_cpu", nproc, args))
    entries = {e.step: e for e in read_ledger(os.path.join(workdir, run, "checkpoint", "ledger.jsonl"))}
    return entries, done.stdout + done.stderr


def test_pretraining_into_sft_resumed_on_another_number_of_ranks_across_the_switch(workdir, monkeypatch):
    from zephon_titan.plan import plan_ledger

    monkeypatch.chdir(workdir)
    config = _job(workdir)
    uninterrupted, output = _train(workdir, config, "runs/sft_w2", 2)
    planned = {e.step: e for e in plan_ledger(config, STEPS)}
    assert uninterrupted == planned  # every field: sha256, tokens, targets, documents, weights
    copy_checkpoint(workdir, "runs/sft_w2", 2, "runs/sft_w2_to_w3")
    resumed, resumed_output = _train(workdir, config, "runs/sft_w2_to_w3", 3)
    assert {s: resumed[s] for s in range(3, STEPS + 1)} == {s: planned[s] for s in range(3, STEPS + 1)}

    before, after = planned[SWITCH - 1], planned[SWITCH]
    assert before.tokens["chat"] == 0 and after.tokens["chat"] > 0  # the switch
    assert 0 < after.targets["chat"] < after.tokens["chat"]  # the prompts are not trained
    assert after.targets["prose"] == after.tokens["prose"]  # text: every target
    trained = losses(output)
    assert sorted(trained) == list(range(1, STEPS + 1)) and all(math.isfinite(v) for v in trained.values())
    # The loss per source counts the targets the mask trains: the trainer's count per step is the ledger's.
    counted = [tuple(map(int, m.groups())) for m in _TARGETS.finditer(output)]
    assert len(counted) == STEPS
    for step, (chat, code, prose) in enumerate(counted, start=1):
        assert (chat, code, prose) == (
            planned[step].targets["chat"],
            planned[step].targets["code"],
            planned[step].targets["prose"],
        )
    assert [tuple(map(int, m.groups())) for m in _TARGETS.finditer(resumed_output)] == counted[SWITCH - 1 :]
