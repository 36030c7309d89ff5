"""Chat sources: conversations rendered by a chat template, tokenized with an exact loss mask.

    [dataloader.sources.sft]
    paths = ["data/sft/*.jsonl"]
    chat = true
    messages_field = "messages"   # a list of {role, content}; or prompt_field and response_field (one turn each)
    loss_on = "assistant"         # "last_assistant", "all"
    too_long = "drop"             # "truncate", "error"

The template is data: the tokenizer's, found as TorchTitan's tokenizer finds it (`chat_template.jinja` beside
tokenizer.json, else `chat_template` in tokenizer_config.json), or a file named by `chat_template`. It is rendered
in Jinja's immutable sandbox (no Python reachable from a template) with what TorchTitan 0.3 passes: `messages` and
`add_generation_prompt`, and no clock (`strftime_now` is not defined, so a template falls back to its own date).

The mask, by rendering prefixes. Assistant message i's supervised text runs from the end of the conversation up
to it rendered with the generation prompt (`render(messages[:i], add_generation_prompt=True)`) to the end of the
conversation up to and including it (`render(messages[:i + 1])`); both must be prefixes of the whole rendering, or
the template does not render conversations turn by turn and the conversation is refused. The whole rendering, its
trailing newlines stripped (as TorchTitan does), is tokenized once with character offsets: a token is supervised
when its characters lie inside a supervised span, and a token that crosses a span's edge (a BPE merge across the
turn boundary) refuses the conversation rather than shift its mask by a token. Refused conversations are counted
(document_counts.py: dropped_by_mask), never trained with a guessed mask.

Tokens: the loader's BOS first (as for text documents), then the rendering's ids, then EOS if they do not end with
it (TorchTitan's rule); the appended EOS is supervised when the conversation ends inside a supervised span. A token
whose prediction is not trained carries the MASKED bit in the document's id array; rows.py turns it into the
label -100 and strips it from the inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_titan.errors import ConfigError, DataError

ROLES = ("system", "user", "assistant", "tool")
MASKED = 1 << 30
"""Set on a chat document's token whose prediction is not trained (vocabularies stay far below it)."""
TEMPLATE_FILE = "chat_template.jinja"
MAX_TEMPLATE_FILE_BYTES = 64 << 20  # a tokenizer_config.json holding a template, read whole

REFUSED = np.empty(0, dtype=np.int32)
"""A conversation whose mask cannot be exact (its template does not render it turn by turn, or a token crosses a
turn's edge): never trained, counted as dropped_by_mask."""
REFUSED.flags.writeable = False


@dataclass(frozen=True)
class ChatTemplate:
    text: str
    origin: str
    """Where it was found (said by validate and in errors)."""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        return str(_compiled(self.text).render(messages=messages, add_generation_prompt=add_generation_prompt))


_templates: dict[str, Any] = {}


def _compiled(text: str) -> Any:
    """The template compiled once per process, in Jinja's immutable sandbox (TorchTitan's and Hugging Face's
    settings: trim_blocks, lstrip_blocks, loop controls, raise_exception, tojson)."""
    if text not in _templates:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = tojson
        _templates[text] = env.from_string(text)
    return _templates[text]


def load_template(path: str, tokenizer_dir: str, where: str) -> ChatTemplate:
    """The template a chat source renders with: the file at `path`, else the tokenizer's (ConfigError in one line
    when there is none or it does not compile)."""
    if path:
        template = ChatTemplate(_template_text(path, where), path)
    else:
        folder = tokenizer_dir if os.path.isdir(tokenizer_dir) else os.path.dirname(tokenizer_dir)
        jinja, config = os.path.join(folder, TEMPLATE_FILE), os.path.join(folder, "tokenizer_config.json")
        text: Any = None
        if os.path.isfile(jinja):
            text, origin = _template_text(jinja, where), jinja
        elif os.path.isfile(config):
            settings = json.loads(_template_text(config, where))  # TorchTitan's tokenizer read it as JSON already
            text, origin = settings.get("chat_template") if isinstance(settings, dict) else None, config
        if not isinstance(text, str):
            raise ConfigError(
                f"{where} is a chat source, but the tokenizer in {folder} has no chat template ({TEMPLATE_FILE}, or "
                "chat_template in tokenizer_config.json); name a template file with chat_template"
            )
        template = ChatTemplate(text, origin)
    try:
        _compiled(template.text)
    except Exception as e:  # jinja2's TemplateSyntaxError, said with its line
        raise ConfigError(f"{where} chat template {template.origin}: {type(e).__name__}: {e}") from None
    return template


def _template_text(path: str, where: str) -> str:
    """A template file's text, read as data: a regular file (a FIFO would never end, /dev/zero never stop), within
    MAX_TEMPLATE_FILE_BYTES, UTF-8 (ConfigError in one line naming it otherwise)."""
    from zephon_titan.engine.sources.guards import open_bounded
    from zephon_titan.errors import ZephonError

    try:
        with open_bounded(path, MAX_TEMPLATE_FILE_BYTES, "the chat template", fix="name a template file") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{where} chat_template {path!r} cannot be read ({e.strerror})") from None
    except ZephonError as e:  # not a regular file, or too big: said by the guard
        raise ConfigError(f"{where} chat template: {e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{where} chat template {path} is not UTF-8 text (byte {e.start:,}); save it as UTF-8"
        ) from None


@dataclass(frozen=True)
class ChatFields:
    """Where a record holds its conversation."""

    messages_field: str = "messages"
    prompt_field: str = ""
    response_field: str = ""

    def messages(self, record: dict[str, Any], where: str) -> list[dict[str, Any]]:
        """The record's conversation as a list of {role, content}; DataError naming `where` when it is not one."""
        if self.prompt_field:
            prompt, response = record.get(self.prompt_field), record.get(self.response_field)
            for name, value in ((self.prompt_field, prompt), (self.response_field, response)):
                if not isinstance(value, str):
                    raise DataError(f"{where}: field {name!r} is {_kind(value)}, not a string")
            return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        messages = record.get(self.messages_field)
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except (ValueError, RecursionError):  # RecursionError: arrays nested deeper than json's parser goes
                raise DataError(f"{where}: field {self.messages_field!r} is a string that is not JSON") from None
        if not isinstance(messages, list) or not messages:
            raise DataError(
                f"{where}: field {self.messages_field!r} is {_kind(messages)}; a chat source's documents are a list of "
                "{role, content} messages"
            )
        out = []
        for i, m in enumerate(messages):
            role = m.get("role") if isinstance(m, dict) else None
            # A message's content is text, or none where it calls tools (OpenAI's and Hugging Face's tool calls).
            content = m.get("content") if isinstance(m, dict) else None
            if role not in ROLES or not (isinstance(content, str) or content is None and m.get("tool_calls")):
                what = f"role {role!r} is not one of {', '.join(ROLES)}" if role not in ROLES else "no string content"
                raise DataError(f"{where}: message {i} has {what} (nor tool_calls)")
            out.append({k: v for k, v in m.items() if v is not None})
        if not any(m["role"] == "assistant" for m in out):
            raise DataError(f"{where}: the conversation has no assistant message; nothing in it would be trained")
        return out


def _kind(value: Any) -> str:
    return "missing" if value is None else "an empty list" if value == [] else type(value).__name__


class Conversation(str):
    """A rendered conversation: its text, and the character spans whose tokens are trained (`spans`); no spans:
    the template does not render it turn by turn (REFUSED when encoded)."""

    spans: tuple[tuple[int, int], ...]


def _has_text(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and bool(content.strip())


def render(template: ChatTemplate, messages: list[dict[str, Any]], loss_on: str, where: str) -> Conversation:
    """The conversation's text and supervised spans (module docstring); DataError when the template fails."""
    turns: list[int] = []  # the assistant messages trained (loss_on = "all": the whole, spans[0])
    try:
        full = template.render(messages)
        if loss_on == "all":
            spans = [(0, len(full))]
        else:
            turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            if loss_on == "last_assistant":
                turns = turns[-1:]
            spans = []
            for i in turns:
                start = template.render(messages[:i], add_generation_prompt=True)
                end = full if i == len(messages) - 1 else template.render(messages[: i + 1])  # the whole: rendered
                if not (full.startswith(start) and full.startswith(end) and len(start) <= len(end)):
                    spans = []
                    break
                spans.append((len(start), len(end)))
    except Exception as e:  # the template's own raise_exception, or an error inside it
        first = str(e).splitlines()[0] if str(e) else ""
        raise DataError(f"{where}: the chat template {template.origin} fails: {type(e).__name__}: {first}") from None
    for i, (start_at, end_at) in zip(turns, spans):
        if start_at == end_at and _has_text(messages[i]):
            raise DataError(
                f"{where}: the chat template {template.origin} renders assistant message {i} as no text, so none of "
                "its content would be trained; fix the template (it must write each message's content)"
            )
    text = full.rstrip("\n")
    if not text.strip() and any(_has_text(m) for m in messages):
        raise DataError(
            f"{where}: the chat template {template.origin} renders the conversation as no text; fix the template "
            "(it must write each message's content)"
        )
    out = Conversation(text)
    out.spans = tuple((a, min(b, len(text))) for a, b in spans if a < min(b, len(text)))
    if spans and not out.spans:
        out.spans = ((len(text), len(text)),)  # spans that the stripping emptied: kept, nothing in them trained
    return out


def encode(
    tokenizer: Any, conversations: Sequence[Conversation], bos_id: int | None, eos_id: int | None
) -> list[np.ndarray]:
    """Each conversation's ids (int32), MASKED set on the tokens whose prediction is not trained; REFUSED where the
    mask cannot be exact. `tokenizer`: a `tokenizers.Tokenizer` (character offsets are needed)."""
    encodings = tokenizer.encode_batch(list(conversations), add_special_tokens=False) if conversations else []
    out = []
    for conversation, encoding in zip(conversations, encodings):
        ids = np.array(encoding.ids, dtype=np.int32)
        first = int(bos_id is not None)
        bounds = [_token_at(encoding, pos, len(conversation), len(ids)) for span in conversation.spans for pos in span]
        if not conversation.spans or None in bounds:
            out.append(REFUSED)  # not rendered turn by turn, or a token across a span's edge
            continue
        eos = eos_id is not None and (len(ids) == 0 or ids[-1] != eos_id)
        tokens = np.empty(first + len(ids) + eos, dtype=np.int32)
        tokens[first : first + len(ids)] = ids
        if bos_id is not None:
            tokens[0] = bos_id
        if eos_id is not None and eos:
            tokens[-1] = eos_id
        trained = np.zeros(len(tokens), dtype=bool)
        for a, b in zip(bounds[::2], bounds[1::2]):
            assert a is not None and b is not None  # None refused the conversation above
            trained[first + a : first + b] = True
        if eos:  # the appended EOS ends the last span when the conversation does
            trained[-1] = conversation.spans[-1][1] == len(conversation)
        tokens[~trained] |= MASKED
        out.append(tokens)
    return out


def _token_at(encoding: Any, pos: int, chars: int, tokens: int) -> int | None:
    """The index of the token that starts at character `pos` (`tokens` at the end of the text); None when a token
    covers `pos` without starting there (a merge across a span's edge) or no token holds it."""
    if pos >= chars:
        return tokens
    t = encoding.char_to_token(pos)
    if t is None or encoding.token_to_chars(t)[0] != pos:
        return None
    return int(t)


@dataclass(frozen=True)
class ChatSetup:
    """A chat source's settings (SourceConfig's chat keys) with its template loaded."""

    template: ChatTemplate
    fields: ChatFields
    loss_on: str
    too_long: str

    def describe(self) -> str:
        """The fingerprint's `chat.<source>`: what its rows depend on (the template by its SHA-256, not its path)."""
        f = self.fields
        where = (
            f"prompt {f.prompt_field}, response {f.response_field}"
            if f.prompt_field
            else f"messages {f.messages_field}"
        )
        return f"template sha256 {self.template.digest}; {where}; loss on {self.loss_on}; too long: {self.too_long}"

    def conversation(self, record: dict[str, Any], where: str) -> Conversation:
        return render(self.template, self.fields.messages(record, where), self.loss_on, where)

    def era_record(self) -> dict[str, str]:
        """What a checkpoint's pipeline eras keep of it (pipeline.PipelineEra.chats): enough to set it up again at a
        resume, its template found where it was and checked by its SHA-256 (chat_of_record)."""
        f = self.fields
        return {
            "template": self.template.origin,
            "sha256": self.template.digest,
            "messages_field": f.messages_field,
            "prompt_field": f.prompt_field,
            "response_field": f.response_field,
            "loss_on": self.loss_on,
            "too_long": self.too_long,
        }


def chat_of_record(record: dict[str, str], name: str, start: int) -> ChatSetup:
    """The chat setup of an earlier pipeline era, its template read again from where it was found: ResumeError when
    that file is gone or holds another template (the conversations drawn before the change are drawn again by it
    at a resume)."""
    from zephon_titan.engine.sources.guards import open_bounded
    from zephon_titan.errors import ResumeError, ZephonError

    origin = record["template"]  # a path the checkpoint names: read as data (a regular file, bounded), never run
    try:
        with open_bounded(origin, MAX_TEMPLATE_FILE_BYTES, "chat template", ResumeError) as f:
            data = f.read().decode("utf-8")
        text = json.loads(data).get("chat_template") if origin.endswith(".json") else data
    except (OSError, ValueError, AttributeError, ZephonError):
        text = None
    template = ChatTemplate(text if isinstance(text, str) else "", origin)
    if not isinstance(text, str) or template.digest != record["sha256"]:
        found = "is gone (or is no regular file)" if text is None else f"now holds sha256 {template.digest}"
        raise ResumeError(
            f"source {name!r}: the run's steps from {start} were made with the chat template {origin} (sha256 "
            f"{record['sha256']}), which {found}; a conversation drawn before the template changed is drawn again by "
            "it at a resume: keep that file as it was (name the new template by chat_template) or resume from a "
            "checkpoint of this template"
        )
    fields = ChatFields(record["messages_field"], record["prompt_field"], record["response_field"])
    return ChatSetup(template, fields, record["loss_on"], record["too_long"])


def era_chats(source: Any, eras: Sequence[Any]) -> tuple[ChatSetup | None, ...]:
    """A source's chat setup in each pipeline era: the config's where an era records it, an earlier era's set up
    again (chat_of_record)."""
    current = source.chat.era_record() if source.chat is not None else None
    out: list[ChatSetup | None] = []
    for era in eras:
        record = era.chats.get(source.name)
        out.append(
            source.chat if record == current else chat_of_record(record, source.name, era.start) if record else None
        )
    return tuple(out)


def chat_setup(source: Any, tokenizer_dir: str) -> ChatSetup:
    """The ChatSetup of a SourceConfig with chat = true; `tokenizer_dir`: where the tokenizer's template is."""
    where = f"[dataloader.sources.{source.name}]"
    fields = ChatFields(source.messages_field, source.prompt_field, source.response_field)
    return ChatSetup(load_template(source.chat_template, tokenizer_dir, where), fields, source.loss_on, source.too_long)
