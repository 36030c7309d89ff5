"""What the files of `zephon-titan init`'s sources hold, asked of each format's `init` hook: a text format's
files are sampled (a few documents from a few files spread over the list) to pick the text column and estimate
documents and tokens with the job's own tokenizer; a token format counts its ids itself."""

from __future__ import annotations

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import open_source
from zephon_titan.engine.sources.base import Source
from zephon_titan.engine.sources.init_sample import SAMPLE_FILES
from zephon_titan.engine.sources.storage import FileStat
from zephon_titan.errors import ConfigError
from zephon_titan.init_job.estimate import Count, count_file, file_budget
from zephon_titan.init_job.listing import SourcePlan, plan_sources


def spread(files: list[FileStat], count: int = SAMPLE_FILES) -> list[FileStat]:
    """Up to `count` files evenly spread over the list (first and last included)."""
    if len(files) <= count:
        return files
    return [files[round(i * (len(files) - 1) / (count - 1))] for i in range(count)]


# Field names that make a source a chat source (docs/chat.md) where the files have no `text`: a list of messages,
# or a prompt and a response.
MESSAGE_FIELDS = ("messages", "conversations", "conversation", "chat")
PAIRS = (("question", "answer"), ("prompt", "response"), ("instruction", "output"), ("prompt", "completion"))


def choose_chat_fields(plan: SourcePlan) -> bool:
    """Whether the samples hold conversations (and no `text` column): a list field of messages, or a prompt and a
    response field in every sampled document; then the source's chat keys are set (plan.chat)."""
    samples = [s for s in plan.samples if s.documents]
    common = set.intersection(*(set(s.texts) for s in samples))
    if "text" in common:
        return False
    for name in MESSAGE_FIELDS:
        kinds = {s.other_fields.get(name, "") for s in samples}
        if all(k == "list" or k.startswith(("list<", "large_list<")) for k in kinds):
            plan.chat = {"chat": True, "messages_field": name}
            plan.why_field = f"field {name!r} holds lists (conversations: docs/chat.md)"
            return True
    for prompt, response in PAIRS:
        if prompt in common and response in common:
            plan.chat = {"chat": True, "prompt_field": prompt, "response_field": response}
            plan.why_field = f"no text field; {prompt!r} and {response!r}: one user turn and its answer (docs/chat.md)"
            return True
    return False


NO_TEXT = 'no "text" column; '
MEAN_PLACEHOLDER = "{mean}"


def choose_text_field(plan: SourcePlan) -> None:
    """`text` if every sampled file has it as a string, else the string field with the longest average values."""
    samples = [s for s in plan.samples if s.documents]  # an empty file has no say
    common = set.intersection(*(set(s.texts) for s in samples))
    if not common:
        found = ", ".join(f"{k} ({t})" for k, t in samples[0].other_fields.items()) or "none"
        raise ConfigError(
            f"{plan.files[0].path}: no string column in every sampled document of source {plan.name!r} (columns: "
            f"{found}); init needs a column of text (pre-tokenized ids: set token_field by hand, docs/configuration.md)"
        )
    mean = {
        k: sum(len(t) for s in samples for t in s.texts[k]) / max(1, sum(len(s.texts[k]) for s in samples))
        for k in common
    }
    ranked = sorted(common, key=lambda k: (-mean[k], k))
    if "text" in common:
        plan.text_field, plan.why_field = "text", ""
        return
    plan.text_field = ranked[0]
    others = ", ".join(f"{k} {mean[k]:,.0f}" for k in ranked[1:4])
    plan.why_field = (  # its mean over the whole file once estimate() has read it (MEAN_PLACEHOLDER)
        f"{NO_TEXT}{ranked[0]!r} has the longest texts in the first documents (file mean {MEAN_PLACEHOLDER} "
        + (f"characters; others there: {others})" if others else "characters)")
    )


def estimate(plan: SourcePlan, tokenizer) -> None:
    """A text source's documents and tokens from documents spread over each sampled file (estimate.py; a small
    file counted whole), scaled from the sampled files' bytes to the source's. A chat source: from its samples."""
    if plan.chat:
        estimate_chat(plan, tokenizer)
        return
    sampled = spread(plan.files)
    budget = file_budget(len(sampled))
    found = Count()
    for f in sampled:
        found.add(count_file(f, plan.name, plan.format, plan.text_field, tokenizer, budget))
    scale = plan.bytes / max(1, sum(f.size for f in sampled))
    plan.documents, plan.tokens = found.documents * scale, found.tokens * scale
    plan.tokenized = found.tokenized
    plan.exact = found.exact and len(sampled) == len(plan.files)
    plan.mean_characters = found.characters / max(1.0, found.documents)
    if plan.why_field.startswith(NO_TEXT):
        plan.why_field = plan.why_field.replace(MEAN_PLACEHOLDER, f"{plan.mean_characters:,.0f}")


def estimate_chat(plan: SourcePlan, tokenizer) -> None:
    """Documents from the sampled files' counts scaled by bytes; tokens from the sampled conversations."""
    read = sum(s.file_documents for s in plan.samples)
    plan.documents = read * plan.bytes / max(1, sum(f.size for f in spread(plan.files)))
    fields = [plan.chat["prompt_field"], plan.chat["response_field"]] if "prompt_field" in plan.chat else []
    texts = ["\n".join(x) for s in plan.samples for x in zip(*(s.texts.get(f, []) for f in fields))]
    plan.tokenized = len(texts)
    if not texts:  # message lists are not sampled as text: about 4 bytes a token
        plan.tokens = plan.bytes / 4
        return
    ids = tokenizer.encode(texts)
    plan.tokens = plan.documents * (sum(len(i) for i in ids) / len(ids))


def count_token_files(plan: SourcePlan, tokenizer) -> None:
    """A token source's documents and tokens, as its format counts them (with the keys it needs to read the
    ids), plus the BOS/EOS the job adds to each document."""

    def open_with(settings: dict) -> Source:
        return open_source(SourceConfig(name=plan.name, paths=plan.paths, format=plan.format, **settings))

    count_tokens = plan.sampling.count_tokens
    assert count_tokens is not None
    specials = (tokenizer.bos_id is not None) + (tokenizer.eos_id is not None)
    counted = count_tokens(", ".join(plan.paths), tokenizer, open_with)
    plan.token_settings, plan.documents = counted.settings, counted.documents
    plan.tokens = counted.tokens + plan.documents * specials  # a document's own BOS/EOS not doubled: a bound
    plan.why_field = "token ids: no tokenization"


def inspect_sources(arguments: list[str], tokenizer) -> list[SourcePlan]:
    plans = plan_sources(arguments)
    for plan in plans:
        sample_file = plan.sampling.sample_file
        if sample_file is None:
            count_token_files(plan, tokenizer)
            continue
        plan.samples = [sample_file(f) for f in spread(plan.files)]
        if not any(s.documents for s in plan.samples):
            raise ConfigError(f"{', '.join(plan.paths)}: the sampled files hold no document; check the files")
        if not choose_chat_fields(plan):
            choose_text_field(plan)
        estimate(plan, tokenizer)
    return plans
