"""Chat sources (engine/chat.py): conversations rendered by a chat template, trained on an exact loss mask.

Parity: on question/answer pairs our documents' (inputs, labels) equal TorchTitan 0.3's ChatDataset's for every
conversation both keep, on fixture-built pairs with the fixture tokenizer and TorchTitan's test template, and on
GSM8K with TorchTitan's test tokenizer where the shared data is present; another mask rule is the negative
control. A hypothesis property over roles, turn counts and loss_on: the supervised targets decode to exactly the
assistant turns' rendered text (or the whole conversation), and a conversation refused is counted, never trained.
Rows are the same for any layout and worker count, and restore exactly.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_titan.engine.document_counts import by_source
from zephon_titan.engine.rows import IGNORE_INDEX
from zephon_titan.engine.stream import LaneStream
from zephon_titan.errors import ConfigError, DataError
from zephon_titan.testing import (
    assert_restores_exactly,
    assert_same_rows_for_any_layout,
    drain,
    epoch_rows,
    spec_from_table,
)

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
# TorchTitan's test tokenizer's template: the role, a newline, the content and EOS per message.
TORCHTITAN_TEMPLATE = (
    "{{ bos_token }}{% for msg in messages %}{{ msg.role }}\n{{ msg.content }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant\n{% endif %}"
)
# A ChatML-like template: every turn between markers, the generation prompt opening an assistant turn.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _with_template(tokenizer_dir: str, target: str, template: str) -> str:
    """A copy of a tokenizer directory whose tokenizer_config.json holds `template` (as TorchTitan reads it)."""
    os.makedirs(target, exist_ok=True)
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), target)
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
        config = json.load(f)
    with open(os.path.join(target, "tokenizer_config.json"), "w") as f:
        json.dump({**config, "chat_template": template}, f)
    return target


def _write(path: str, records: list[dict]) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


def _chat_table(path: str, tokenizer: str, **source) -> dict:
    return {
        "num_lanes": 2,
        "seed": 3,
        "tokenizer_path": tokenizer,
        "packing": "best_fit",
        "exhaustion": "redistribute",
        "shuffle_window_blocks": 2,
        "sources": {"chat": {"paths": [path], "chat": True, "block_bytes": 4096, **source}},
    }


def _documents(spec) -> dict[tuple[str, int], tuple[list[int], list[int]]]:
    """Each trained document's (inputs, labels), from the rows of one pass (a chat document is one piece)."""
    out = {}
    for row in epoch_rows(spec):
        at = 0
        for p in row.pieces:
            assert p.doc_offset == 0 and (p.file, p.row) not in out, "a conversation is trained whole, once"
            out[(p.file, p.row)] = (row.inputs[at : at + p.length].tolist(), row.labels[at : at + p.length].tolist())
            at += p.length
    return out


def _pass_counts(spec) -> dict:
    counted = [0] * len(LaneStream(spec, 0).feed.counted)
    for lane in range(spec.num_lanes):
        stream = LaneStream(spec, lane)
        drain(stream)
        counted = [a + b for a, b in zip(counted, stream.feed.counted)]
    return by_source(counted, spec.source_names)


def _chat_job(path, chat_and_text: dict, seq_len: int, dataloader: str = "", chat: str = "", rest: str = "") -> str:
    """A job TOML at `path` over the chat fixture's conversations (the strings: more [dataloader] lines, more lines of
    the chat source, and tables after it)."""
    path.write_text(
        f'hf_assets_path = "{chat_and_text["tokenizer_path"]}"\n[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n'
        f"[training]\nseq_len = {seq_len}\nglobal_batch_size = 8\nlocal_batch_size = 2\n"
        f'[dataloader]\nnum_lanes = 4\nseed = 5\npacking = "best_fit"\n{dataloader}'
        f'[dataloader.sources.chat]\npaths = ["{chat_and_text["sources"]["chat"]["paths"][0]}"]\nchat = true\n'
        f"block_bytes = 4096\n{chat}{rest}"
    )
    return str(path)


# ---- parity with TorchTitan 0.3's ChatDataset -------------------------------------------------------------


def _torchtitan_samples(tokenizer_dir: str, records: list[dict], seq_len: int) -> list:
    """ChatDataset's (input_ids, label_ids) per record, None where it drops it (its own _tokenize_sample)."""
    from datasets import Dataset
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import ChatDataset

    def messages(sample: dict) -> list[dict]:  # the sft_debugmodel recipe's question/answer mapping
        return [{"role": "user", "content": sample["question"]}, {"role": "assistant", "content": sample["answer"]}]

    dataset = ChatDataset(
        Dataset.from_list(records), HuggingFaceTokenizer(tokenizer_path=tokenizer_dir), messages, seq_len
    )
    return [dataset._tokenize_sample(r) for r in records]


def _assert_parity(tmp_path, tokenizer_dir: str, records: list[dict], seq_len: int) -> None:
    path = _write(str(tmp_path / "qa.jsonl"), records)
    table = _chat_table(path, tokenizer_dir, prompt_field="question", response_field="answer")
    ours = _documents(spec_from_table(table, seq_len=seq_len))
    offsets = [0]
    for r in records[:-1]:
        offsets.append(offsets[-1] + len((json.dumps(r) + "\n").encode()))
    theirs = _torchtitan_samples(tokenizer_dir, records, seq_len)
    both = 0
    for offset, sample in zip(offsets, theirs):
        mine = ours.get((path, offset))
        if sample is None:
            assert mine is None, f"byte {offset}: ChatDataset drops it (too long), the loader trains it"
            continue
        assert mine is not None, f"byte {offset}: ChatDataset trains it, the loader does not"
        assert mine == (list(sample[0]), list(sample[1])), f"byte {offset}: other inputs or labels"
        both += 1
    assert both >= len(records) // 2
    # The negative control: another mask rule gives other labels.
    every = _documents(
        spec_from_table({**table, "sources": {"chat": {**table["sources"]["chat"], "loss_on": "all"}}}, seq_len=seq_len)
    )
    assert any(every[k][1] != ours[k][1] for k in ours)


def test_question_answer_pairs_equal_torchtitans_chat_dataset(tmp_path, tokenizer_dir, prose_docs):
    tokenizer = _with_template(tokenizer_dir, str(tmp_path / "tok"), TORCHTITAN_TEMPLATE)
    docs = [d for d in prose_docs if len(d) > 200][:60]
    records = [{"question": d[:120].strip(), "answer": d[120:400].strip()} for d in docs]
    _assert_parity(tmp_path, tokenizer, records, seq_len=256)


def test_gsm8k_equals_torchtitans_chat_dataset(tmp_path):
    tokenizer = os.path.join(SHARED, "tokenizers", "torchtitan_test")
    data = os.path.join(SHARED, "sft", "gsm8k_test", "part-00000.jsonl")
    if not (os.path.isdir(tokenizer) and os.path.isfile(data)):
        pytest.skip("../shared/data (GSM8K, TorchTitan's test tokenizer) is absent; the fixture pairs test the same")
    with open(data) as f:
        records = [json.loads(line) for line in f][:300]
    _assert_parity(tmp_path, tokenizer, records, seq_len=512)


# ---- the mask, for any template, roles and turns ------------------------------------------------------------

ROLE_LISTS = st.lists(st.sampled_from(["system", "user", "assistant", "tool"]), min_size=1, max_size=6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    conversations=st.lists(ROLE_LISTS, min_size=3, max_size=8),
    loss_on=st.sampled_from(["assistant", "last_assistant", "all"]),
    template=st.sampled_from(["chatml", "torchtitan"]),
    start=st.integers(0, 200),
)
def test_the_supervised_targets_are_exactly_the_assistant_turns(
    tmp_path_factory, tokenizer_dir, prose_docs, conversations, loss_on, template, start
):
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("chat")
    text = TORCHTITAN_TEMPLATE if template == "torchtitan" else CHATML
    tokenizer = _with_template(tokenizer_dir, str(root / "tok"), text)
    words = " ".join(prose_docs).split()
    records, expected = [], {}
    for k, roles in enumerate(conversations):
        roles = [*roles, "assistant"] if "assistant" not in roles else roles
        turns = [
            {"role": r, "content": " ".join(words[start + 7 * k + i : start + 7 * k + i + 5])}
            for i, r in enumerate(roles)
        ]
        records.append({"messages": turns})
    path = _write(str(root / "c.jsonl"), records)
    spec = spec_from_table(_chat_table(path, tokenizer, loss_on=loss_on), seq_len=512)
    decode = Tokenizer.from_file(os.path.join(tokenizer, "tokenizer.json")).decode
    trained = _documents(spec)
    offset = 0
    for record in records:
        expected[offset] = _expected_spans(text, record["messages"], loss_on, spec)
        offset += len((json.dumps(record) + "\n").encode())
    for (_, row), (_, labels) in trained.items():
        runs, run = [], []
        for label in labels:
            if label == IGNORE_INDEX:
                runs, run = (runs + [run] if run else runs), []
            else:
                run.append(label)
        runs = runs + [run] if run else runs
        eos = spec.tokenizer.eos_id
        got = [decode([t for t in r if t != eos], skip_special_tokens=False) for r in runs]
        assert got == [span for span in expected[row] if span], (loss_on, template)
    counts = _pass_counts(spec)["chat"]
    assert counts["read"] == len(records)
    assert len(trained) == len(records) - counts["dropped_by_mask"] - counts["dropped_too_long"]


def _expected_spans(template: str, messages: list[dict], loss_on: str, spec) -> list[str]:
    """The text the mask trains, worked out from the template's shape by hand (not by rendering prefixes)."""

    def turn(m: dict) -> str:
        if template == TORCHTITAN_TEMPLATE:
            return f"{m['role']}\n{m['content']}"  # bos_token and eos_token render empty, as in TorchTitan
        return f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"

    whole = "".join(turn(m) for m in messages).rstrip("\n")
    if loss_on == "all":
        return [whole]
    heads = len("assistant\n") if template == TORCHTITAN_TEMPLATE else len("<|im_start|>assistant\n")
    spans = [turn(m)[heads:] for m in messages if m["role"] == "assistant"]
    spans = spans[-1:] if loss_on == "last_assistant" else spans
    if messages[-1]["role"] == "assistant":  # the last span ends the conversation: stripped with it
        spans[-1] = spans[-1].rstrip("\n")
    return spans


# ---- mixed with text, any layout, workers, restores ----------------------------------------------------------


@pytest.fixture(scope="module")
def chat_and_text(tmp_path_factory, tokenizer_dir, prose_docs, corpus_dir) -> dict:
    """A chat source of multi-turn conversations beside the fixture corpus's prose, the ChatML template."""
    root = tmp_path_factory.mktemp("mixed")
    tokenizer = _with_template(tokenizer_dir, str(root / "tok"), CHATML)
    words = " ".join(prose_docs).split()
    records = []
    for k in range(80):
        n = 2 + k % 4
        roles = ["system", *(["user", "assistant"] * n)][: 1 + 2 * n - k % 2]
        turns = [
            {"role": r, "content": " ".join(words[11 * k + 3 * i : 11 * k + 3 * i + 3 + k % 7])}
            for i, r in enumerate(roles)
        ]
        records.append(
            {"messages": turns if turns[-1]["role"] != "system" else turns + [{"role": "assistant", "content": "ok"}]}
        )
    path = _write(str(root / "chat.jsonl"), records)
    return {
        "num_lanes": 4,
        "seed": 5,
        "tokenizer_path": tokenizer,
        "packing": "best_fit",
        "best_fit_window_docs": 24,
        "shuffle_window_blocks": 2,
        "sources": {
            "chat": {"paths": [path], "chat": True, "block_bytes": 4096, "weight": 0.5},
            "prose": {"paths": [f"{corpus_dir}/prose/*.jsonl"], "weight": 0.5},
        },
    }


def test_chat_and_text_give_the_same_rows_for_any_layout_and_restore_exactly(chat_and_text):
    spec = spec_from_table(chat_and_text, seq_len=128)
    assert_same_rows_for_any_layout(spec, steps=6)
    for lane in (0, 3):
        assert_restores_exactly(spec, lane, [0, 1, 4, 9, 13], rows=4)
    rows = [row for lane in range(4) for row in LaneStream(spec, lane).take(6)]
    masked = [int((r.labels == IGNORE_INDEX).sum()) - r.padding for r in rows if any(p.source == 0 for p in r.pieces)]
    assert masked and all(m > 0 for m in masked)  # chat rows hold untrained targets (their prompts)
    text_only = [r for r in rows if all(p.source == 1 for p in r.pieces)]
    assert all(int((r.labels == IGNORE_INDEX).sum()) == r.padding for r in text_only)  # text: every target trained


def test_workers_give_the_same_chat_rows(chat_and_text):
    from zephon_titan.engine import LaneGroup, open_lane_group

    spec = spec_from_table(chat_and_text, seq_len=128)
    group = LaneGroup(spec, range(4), 2)
    expected = [row.to_bytes() for _ in range(4) for lane in group.next_step() for row in lane]
    with open_lane_group(spec, range(4), 2, num_workers=2) as workers:
        assert [row.to_bytes() for _ in range(4) for lane in workers.next_step() for row in lane] == expected


def test_the_template_is_in_the_fingerprint(chat_and_text, tmp_path):
    from zephon_titan.engine import fingerprint

    fp = fingerprint(spec_from_table(chat_and_text, seq_len=128))
    assert fp["chat.chat"].startswith("template sha256 ") and "loss on assistant" in fp["chat.chat"]
    other = str(tmp_path / "t.jinja")
    with open(other, "w") as f:
        f.write(CHATML.replace("\n{{ m.content }}", ": {{ m.content }}"))
    sources = {**chat_and_text["sources"], "chat": {**chat_and_text["sources"]["chat"], "chat_template": other}}
    assert (
        fingerprint(spec_from_table({**chat_and_text, "sources": sources}, seq_len=128))["chat.chat"] != fp["chat.chat"]
    )


# ---- too long, and what is refused --------------------------------------------------------------------------


@pytest.mark.parametrize("too_long", ["drop", "truncate"])
def test_a_conversation_longer_than_a_row_is_dropped_or_truncated_and_counted(chat_and_text, too_long):
    sources = {"chat": {**chat_and_text["sources"]["chat"], "too_long": too_long, "weight": 1.0}}
    spec = spec_from_table({**chat_and_text, "sources": sources, "exhaustion": "redistribute"}, seq_len=48)
    counts = _pass_counts(spec)["chat"]
    trained = _documents(spec)
    if too_long == "drop":
        assert counts["dropped_too_long"] > 0 and counts["truncated"] == 0
        assert len(trained) == counts["read"] - counts["dropped_too_long"] - counts["dropped_by_mask"]
        assert all(len(inputs) <= 48 for inputs, _ in trained.values())
    else:
        assert counts["truncated"] > 0 and counts["dropped_too_long"] == 0
        assert len(trained) == counts["read"] - counts["dropped_by_mask"]
        assert max(len(inputs) for inputs, _ in trained.values()) == 48  # cut to the row, mask with it


def test_too_long_error_names_the_conversation(chat_and_text):
    sources = {"chat": {**chat_and_text["sources"]["chat"], "too_long": "error", "weight": 1.0}}
    spec = spec_from_table({**chat_and_text, "sources": sources, "exhaustion": "redistribute"}, seq_len=48)
    with pytest.raises(
        DataError,
        match=r"chat\.jsonl byte offset \d+ \(source 'chat'\): the conversation is [\d,]+ tokens, longer than a row of 48; set too_long",
    ) as e:
        epoch_rows(spec)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "messages, template, message",
    [
        ([{"role": "user", "content": "hi"}], None, "the conversation has no assistant message"),
        (
            [{"role": "robot", "content": "hi"}],
            None,
            "message 0 has role 'robot' is not one of system, user, assistant, tool",
        ),
        (
            [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}],
            None,
            "message 0 has no string content",
        ),
        ("not json", None, "field 'messages' is a string that is not JSON"),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            "{{ raise_exception('only one turn') }}",
            "fails: TemplateError: only one turn",
        ),
        (  # the sandbox: no Python object's internals are reachable from a template
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            "{{ messages.__class__.__mro__[1].__subclasses__() }}",
            "fails: SecurityError: access to attribute '__class__'",
        ),
    ],
)
def test_a_bad_conversation_or_template_is_one_line_naming_the_row(
    tmp_path, tokenizer_dir, messages, template, message
):
    tokenizer = _with_template(tokenizer_dir, str(tmp_path / "tok"), template or CHATML)
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path = _write(str(tmp_path / "c.jsonl"), [good, {"messages": messages}])
    spec = spec_from_table(_chat_table(path, tokenizer), seq_len=64)
    with pytest.raises(DataError, match=r"c\.jsonl byte offset \d+ \(source 'chat'\): ") as e:
        epoch_rows(spec)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "table_change, message",
    [
        ({"packing": "wrap"}, "packing = 'wrap' with chat source chat: a conversation is trained whole"),
        ({"labels": "stream"}, "labels = 'stream' with chat source chat"),
        ({"mix_chunk_tokens": 16}, "mix_chunk_tokens = 16 with chat source chat: the mixer would cut a conversation"),
        ({"source": {"loss_on": "all", "chat": False}}, "loss_on is for chat sources; set chat = true"),
        ({"source": {"prompt_field": "q"}}, "prompt_field and response_field go together"),
        ({"source": {"loss_on": "everything"}}, "loss_on"),
        (
            {"tokenizer": "plain"},
            "has no chat template (chat_template.jinja, or chat_template in tokenizer_config.json)",
        ),
        ({"source": {"chat_template": "missing.jinja"}}, "chat_template 'missing.jinja' cannot be read"),
    ],
)
def test_a_chat_setting_that_cannot_work_is_one_line(tmp_path, tokenizer_dir, table_change, message):
    tokenizer = (
        tokenizer_dir if table_change.get("tokenizer") else _with_template(tokenizer_dir, str(tmp_path / "tok"), CHATML)
    )
    path = _write(
        str(tmp_path / "c.jsonl"),
        [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}],
    )
    table = _chat_table(path, tokenizer, **table_change.get("source", {}))
    table.update({k: v for k, v in table_change.items() if k in ("packing", "labels", "mix_chunk_tokens")})
    with pytest.raises(ConfigError) as e:
        spec_from_table(table, seq_len=64)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_ids_carry_the_mask_bit_only_inside_the_engine(chat_and_text):
    """The MASKED bit never reaches a row: inputs are real ids below the vocabulary."""
    spec = spec_from_table(chat_and_text, seq_len=128)
    rows = [row for lane in range(4) for row in LaneStream(spec, lane).take(4)]
    vocab = spec.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    assert all(int(np.max(r.inputs)) < vocab and int(np.max(r.labels)) < vocab for r in rows)


# ---- provable masks: the trained targets in the ledger ------------------------------------------------------


def test_the_ledger_counts_each_sources_trained_targets_and_verify_compares_them(chat_and_text, tmp_path, capsys):
    from zephon_titan.cli import main
    from zephon_titan.engine import LaneGroup

    spec = spec_from_table(chat_and_text, seq_len=128)
    group = LaneGroup(spec, range(4), 2)
    by_hand = []
    for _ in range(3):  # each source's labels other than -100, read off the rows (not from the packer's counts)
        counts = [0, 0]
        for row in (row for lane in group.next_step() for row in lane):
            at = 0
            for p in row.pieces:
                counts[p.source] += int((row.labels[at : at + p.length] != IGNORE_INDEX).sum())
                at += p.length
        by_hand.append(counts)
    sources = chat_and_text["sources"]
    job = tmp_path / "job.toml"
    prose = f"[dataloader.sources.prose]\npaths = {json.dumps(sources['prose']['paths'])}\nweight = 0.5\n"
    _chat_job(
        job, chat_and_text, 128, "best_fit_window_docs = 24\nshuffle_window_blocks = 2\n", "weight = 0.5\n", prose
    )
    assert main(["plan", str(job), "--steps", "3", "--output", str(tmp_path / "a.jsonl")]) == 0
    lines = [json.loads(line) for line in open(tmp_path / "a.jsonl")]
    assert [[line["targets"]["chat"], line["targets"]["prose"]] for line in lines] == by_hand
    assert all(line["targets"]["chat"] < line["tokens"]["chat"] for line in lines)  # prompts are not trained
    assert all(line["targets"]["prose"] == line["tokens"]["prose"] for line in lines)
    lines[1]["targets"]["chat"] += 1  # a mask lost or shifted by one target
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 1
    assert "first difference at step 2 (targets)" in capsys.readouterr().out


def test_a_parquet_source_of_message_lists_trains_what_its_json_lines_twin_does(chat_and_text, tmp_path):
    """Conversations as a list-of-structs column (Parquet) and as JSON lists (JSON Lines): the same documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = chat_and_text["sources"]["chat"]["paths"][0]
    with open(path) as f:
        records = [json.loads(line) for line in f]
    pq.write_table(pa.Table.from_pylist(records), str(tmp_path / "c.parquet"), row_group_size=10)
    tokenizer = chat_and_text["tokenizer_path"]
    jsonl = _documents(spec_from_table(_chat_table(path, tokenizer), seq_len=512))
    parquet = _documents(spec_from_table(_chat_table(str(tmp_path / "c.parquet"), tokenizer), seq_len=512))
    assert len(parquet) > 40
    assert sorted(jsonl.values()) == sorted(parquet.values())


def test_validate_says_what_each_chat_source_trains_and_leaves_out(chat_and_text, tmp_path, capsys):
    from zephon_titan.cli import main

    sources = chat_and_text["sources"]
    job = tmp_path / "job.toml"
    _chat_job(job, chat_and_text, 64)
    assert main(["validate", str(job), "--world-sizes", "2"]) == 0
    out = capsys.readouterr().out
    spec = spec_from_table(
        {**chat_and_text, "sources": {"chat": {**sources["chat"], "weight": 1.0}}, "exhaustion": "redistribute"},
        seq_len=64,
    )
    counts = _pass_counts(spec)["chat"]  # what a pass of the lanes counts: the same as validate's reading
    line = next(line for line in out.splitlines() if "conversations:" in line)
    assert f"{counts['read']} conversations: {counts['dropped_by_mask']} refused" in line
    assert f"{counts['dropped_too_long']} longer than a row (dropped)" in line
    trained = sum(sum(label != IGNORE_INDEX for label in labels) for _, labels in _documents(spec).values())
    assert f"train {trained:,} of their" in line
    assert "chat: template sha256 " in out and "loss on assistant" in out


def test_inspect_marks_the_trained_targets(chat_and_text, tmp_path, capsys):
    from zephon_titan.cli import main

    job = tmp_path / "job.toml"
    _chat_job(job, chat_and_text, 128, "best_fit_window_docs = 24\n")
    assert main(["inspect", str(job), "--step", "1", "--lane", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    pieces = [p for row in report for p in row["pieces"]]
    assert pieces and all(0 < p["trained_targets"] < p["row_tokens"][1] - p["row_tokens"][0] for p in pieces)
    for p in pieces:  # every trained span is an assistant turn's: it follows the assistant header
        spans = p["text"].split("⟦")[1:]
        assert len(spans) >= 1 and all("⟧" in span for span in spans)
        heads = [part.rsplit("<|im_start|>", 1)[-1] for part in p["text"].split("⟦")[:-1]]
        assert all(head == "assistant\n" for head in heads), heads


def test_the_worked_gsm8k_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/chat.md's GSM8K job, run by `validate` from the shared data folder: the lines the page shows."""
    from zephon_titan.cli import main

    if not os.path.isdir(os.path.join(SHARED, "sft", "gsm8k_test")):
        pytest.skip("../shared/data (GSM8K, TorchTitan's test tokenizer) is absent; the fixture pairs test the same")
    page = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "chat.md")).read()
    section = page.split("## A worked example: GSM8K", 1)[1].split("\n## ", 1)[0]
    job, shown = section.split("```toml\n", 1)[1].split("```", 1)
    shown = shown.split("```\n", 1)[1].split("```", 1)[0]
    (tmp_path / "gsm8k.toml").write_text(job)
    monkeypatch.chdir(SHARED)
    assert main(["validate", str(tmp_path / "gsm8k.toml"), "--world-sizes", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    for line in shown.splitlines():
        assert line in out, line


def test_a_held_out_chat_set_counts_only_the_targets_its_masks_train(chat_and_text, tmp_path):
    """eval_fraction on a chat source: the eval set's targets of that source are the held-out conversations'
    trained targets, counted here from their masks alone (chat.encode), not from rows."""
    from zephon_titan.engine import chat
    from zephon_titan.engine.split import held_out
    from zephon_titan.plan import plan_eval_set

    sources = chat_and_text["sources"]
    path = sources["chat"]["paths"][0]
    job = tmp_path / "job.toml"
    _chat_job(job, chat_and_text, 512, chat="eval_fraction = 0.3\n", rest="[validator]\nenable = true\n")
    report = plan_eval_set(str(job))
    spec = spec_from_table(_chat_table(path, chat_and_text["tokenizer_path"]), seq_len=512)
    source = spec.sources[0]
    expected = 0
    for b in range(source.num_blocks):
        block = source.read_block(b)
        out = held_out(spec.config.split_seed, block.file, block.rows, 0.3)
        conversations = [block.texts[i] for i in range(len(block.texts)) if out[i]]
        for ids in chat.encode(spec.tokenizer.tokenizer, conversations, spec.tokenizer.bos_id, spec.tokenizer.eos_id):
            if ids is not chat.REFUSED and len(ids) - 1 <= 512:
                expected += int(np.count_nonzero((ids[1:] & chat.MASKED) == 0))
    assert report["tokens"]["chat"] == expected > 0


def test_homogeneous_rows_keep_conversations_and_text_apart(chat_and_text):
    spec = spec_from_table({**chat_and_text, "homogeneous_rows": True}, seq_len=512)
    rows = [row for lane in range(4) for row in LaneStream(spec, lane).take(40)]
    kinds = [{p.source for p in row.pieces} for row in rows]
    assert {0} in kinds and {1} in kinds and all(len(k) == 1 for k in kinds if k)
    assert_same_rows_for_any_layout(spec, steps=4)
    assert_restores_exactly(spec, 1, [0, 2, 7], rows=4)
    mixed = spec_from_table(chat_and_text, seq_len=512)  # the control: without it, rows hold both
    both = [len({p.source for p in row.pieces}) == 2 for lane in range(4) for row in LaneStream(mixed, lane).take(40)]
    assert any(both)


def test_mix_by_targets_gives_chat_its_weight_in_trained_targets(chat_and_text):
    """Weights 0.5 / 0.5: by targets, the chat source's trained targets are half of all trained targets; by tokens
    (the control) its tokens are half, and its targets, prompts left out, well under half."""
    from zephon_titan.engine import LaneGroup
    from zephon_titan.engine.rows import count_targets, tally

    def shares(mix_by: str) -> tuple[float, float]:
        spec = spec_from_table({**chat_and_text, "mix_by": mix_by}, seq_len=512)
        group = LaneGroup(spec, range(4), 2)
        rows = [row for _ in range(30) for lane in group.next_step() for row in lane]
        targets, tokens = count_targets(rows, 2), tally(rows, 2)[:2]
        return targets[0] / sum(targets), tokens[0] / sum(tokens)

    by_targets, by_tokens = shares("targets"), shares("tokens")
    assert abs(by_targets[0] - 0.5) < 0.03 and abs(by_tokens[1] - 0.5) < 0.03
    assert by_tokens[0] < 0.4 and by_targets[1] > 0.6


@pytest.mark.parametrize("shape", ["messages", "pairs", "parquet messages"])
def test_init_recognizes_conversations(chat_and_text, tmp_path, monkeypatch, capsys, shape):
    """Message lists (JSON Lines, Parquet) and question/answer pairs become chat sources; the job init writes
    resolves as the trainer reads it, and plans."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon_titan.cli import main

    with open(chat_and_text["sources"]["chat"]["paths"][0]) as f:
        records = [json.loads(line) for line in f]
    os.makedirs(tmp_path / "sft")
    if shape == "pairs":
        records = [{"question": r["messages"][-2]["content"], "answer": r["messages"][-1]["content"]} for r in records]
    if shape == "parquet messages":
        pq.write_table(pa.Table.from_pylist(records), str(tmp_path / "sft" / "part-0.parquet"), row_group_size=20)
    else:
        _write(str(tmp_path / "sft" / "part-0.jsonl"), records)
    monkeypatch.chdir(tmp_path)
    tokenizer = chat_and_text["tokenizer_path"]
    assert main(["init", "sft", "--tokenizer", tokenizer, "--gpus", "1,2", "--seq-len", "256", "-o", "job.toml"]) == 0
    written = (tmp_path / "job.toml").read_text()
    assert "chat = true" in written and 'packing = "best_fit"' in written
    expected = 'prompt_field = "question"' if shape == "pairs" else 'messages_field = "messages"'
    assert expected in written and "text_field" not in written
    capsys.readouterr()
    assert main(["plan", "job.toml", "--steps", "2", "--output", "ledger.jsonl"]) == 0
    assert all(json.loads(line)["targets"]["sft"] > 0 for line in open(tmp_path / "ledger.jsonl"))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lane=st.integers(0, 3),
    cuts=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    loss_on=st.sampled_from(["assistant", "last_assistant", "all"]),
    too_long=st.sampled_from(["drop", "truncate"]),
)
def test_chat_rows_restore_exactly_at_random_cut_points(chat_and_text, lane, cuts, loss_on, too_long):
    sources = {
        **chat_and_text["sources"],
        "chat": {**chat_and_text["sources"]["chat"], "loss_on": loss_on, "too_long": too_long},
    }
    spec = spec_from_table({**chat_and_text, "sources": sources}, seq_len=256)
    assert_restores_exactly(spec, lane, cuts, rows=3)


def test_a_chat_source_whose_conversations_are_all_too_long_is_one_line_not_a_hang(chat_and_text):
    sources = {"chat": {**chat_and_text["sources"]["chat"], "weight": 1.0}}
    spec = spec_from_table({**chat_and_text, "sources": sources}, seq_len=8)
    with pytest.raises(
        DataError, match=r"source 'chat': lane 0 met all \d+ of its blocks .* a conversation longer than a row"
    ):
        LaneStream(spec, 0).next_row()


# ---- a template changed from a step on --------------------------------------------------------------------------

CHANGE_AT = 3  # the checkpoint's step; the new template from the next


def test_a_template_changed_from_the_step_after_the_checkpoint(chat_and_text, tmp_path):
    """Saved after step 3 with the ChatML template, resumed with another one from step 4: steps 1-3 are the first
    run's, steps 4.. equal an uninterrupted run of both eras (in process and in workers); the old template file must
    still hold what the checkpoint recorded, and a change at the checkpoint's step is refused."""
    from helpers import engine_checkpoint

    from zephon_titan.engine import LaneGroup, fingerprint, open_lane_group
    from zephon_titan.engine.resume import read_state
    from zephon_titan.errors import ResumeError
    from zephon_titan.loader.state import Decoded

    old_file, new_file = tmp_path / "old.jinja", tmp_path / "new.jinja"
    old_file.write_text(CHATML)
    new_file.write_text(
        "{% for m in messages %}[{{ m.role }}]\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]\n{% endif %}"
    )

    def table(template, **overrides):
        sources = {
            **chat_and_text["sources"],
            "chat": {**chat_and_text["sources"]["chat"], "chat_template": str(template)},
        }
        return {**chat_and_text, "sources": sources, **overrides}

    old = spec_from_table(table(old_file), seq_len=256)
    saved = engine_checkpoint(old, CHANGE_AT)

    def resumed(from_step):
        new = spec_from_table(table(new_file, pipeline_from_step=from_step), seq_len=256)
        restored = read_state(Decoded(saved), range(4), fingerprint(new))
        return restored, restored.spec(new)

    restored, spec = resumed(CHANGE_AT + 1)
    assert restored.mixture_change == f"the pipelines of chat change from step {CHANGE_AT + 1}"

    def steps(s, n, states=None, first=0):
        group = LaneGroup(s, range(4), 2, states, first)
        return [[row.to_bytes() for lane in group.next_step() for row in lane] for _ in range(n)]

    group = LaneGroup(old, range(4), 2)
    for _ in range(CHANGE_AT):
        group.next_step()
    whole = steps(spec, CHANGE_AT + 12)
    assert whole[:CHANGE_AT] == steps(old, CHANGE_AT)
    after = steps(spec, 12, group.state(), CHANGE_AT)
    assert after == whole[CHANGE_AT:]
    assert after != steps(old, CHANGE_AT + 12)[CHANGE_AT:]  # the control: the new template's rows differ
    with open_lane_group(spec, range(4), 2, num_workers=2, states=group.state(), first_step=CHANGE_AT) as workers:
        assert [[row.to_bytes() for lane in workers.next_step() for row in lane] for _ in range(12)] == after
    with pytest.raises(ResumeError, match=r"chat template of source chat changed, .* pipeline_from_step = 4"):
        resumed(CHANGE_AT)
    old_file.write_text(CHATML.replace("\n{% endfor %}", "{% endfor %}"))  # the old template edited since
    with pytest.raises(ResumeError, match=r"made with the chat template .*old\.jinja \(sha256 \w+\), which now holds"):
        resumed(CHANGE_AT + 1)
    old_file.unlink()
    os.mkfifo(old_file)  # a path the checkpoint names is read as a bounded regular file: never a hang
    with pytest.raises(ResumeError, match=r"old\.jinja \(sha256 \w+\), which is gone \(or is no regular file\)"):
        resumed(CHANGE_AT + 1)


def test_a_tool_call_without_content_is_rendered_as_the_template_writes_it(tmp_path, tokenizer_dir):
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }}({{ c.function.arguments }})</call>"
        "{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer = _with_template(tokenizer_dir, str(tmp_path / "tok"), template)
    call = {"type": "function", "function": {"name": "lookup", "arguments": '{"q": "zip"}'}}
    messages = [
        {"role": "user", "content": "what does zip do"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "zip pairs items"},
        {"role": "assistant", "content": "It pairs items of iterables."},
    ]
    path = _write(str(tmp_path / "c.jsonl"), [{"messages": messages}])
    spec = spec_from_table(_chat_table(path, tokenizer), seq_len=256)
    ((inputs, labels),) = _documents(spec).values()
    decode = spec.tokenizer.decode
    trained = decode([t for t in labels if t != IGNORE_INDEX and t != spec.tokenizer.eos_id])
    assert trained == '<call>lookup({"q": "zip"})</call><|im_end|>\nIt pairs items of iterables.<|im_end|>'
    messages[1] = {"role": "assistant", "content": None}  # no content and no tool call: one line
    path = _write(str(tmp_path / "d.jsonl"), [{"messages": messages}])
    with pytest.raises(DataError, match="message 1 has no string content"):
        epoch_rows(spec_from_table(_chat_table(path, tokenizer), seq_len=256))
