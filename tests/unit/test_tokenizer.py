"""One tokenizer: every entry point gets exactly the ids of TorchTitan's trainer tokenizer.

TorchTitan's HuggingFaceTokenizer adds the special tokens of tokenizer_config.json to the vocabulary
and reads add_bos_token/add_eos_token from it. These tests compare our tokenizer with it document
by document (special-token strings inside the text included), on a fixture tokenizer that carries
special tokens and, when present, on the real tokenizers of ../shared/data/tokenizers.
"""

import functools
import json
import os
import shutil

import pytest
from corpus import BOS, EOS
from helpers import REAL_TOKENIZERS, real_tokenizer, special_token_strings, with_special_tokens
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, processors
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from zephon_titan.engine.tokenize import DocumentTokenizer
from zephon_titan.titan.tokenizer import document_tokenizer, load_tokenizer

EXTRA = ["<|im_start|>", "<|image|>", "<|begin_of_text|>"]


def _documents(specials: list[str]) -> list[str]:
    docs = [
        "",
        "plain text",
        "  leading spaces\tand tabs\n\n",
        "emoji \U0001f600 and \u00e9\u0301 accents",
        "x" * 3000,
        "def f(x):\n    return x  # code\n",
    ]
    for s in specials:
        docs += [s, f"before {s} after", f"{s}{s}glued{s}", f"line\n{s}\n"]
    return docs


@pytest.fixture(scope="module")
def special_dir(tokenizer_dir, tmp_path_factory) -> str:
    """The fixture BPE with three special tokens that only tokenizer_config.json defines."""
    return with_special_tokens(tokenizer_dir, str(tmp_path_factory.mktemp("special")), EXTRA)


@pytest.mark.parametrize("name", ["fixture", *REAL_TOKENIZERS])
def test_ids_equal_the_trainers_tokenizer(name, special_dir):
    directory = special_dir if name == "fixture" else real_tokenizer(name)
    trainer = HuggingFaceTokenizer(HuggingFaceTokenizer.Config(), tokenizer_path=directory)
    ours = load_tokenizer(directory)
    assert ours.digest() == document_tokenizer(trainer).digest()  # the loader's path inside the trainer
    specials = special_token_strings(directory)
    assert specials, "the test needs special-token strings"
    for doc in _documents(specials):
        expected = trainer.encode(doc, add_bos=ours.bos_id is not None, add_eos=ours.eos_id is not None)
        assert ours.encode([doc])[0].tolist() == expected, (name, doc[:80])


def test_special_token_strings_become_their_token(special_dir, tokenizer_dir, tmp_path):
    ours = load_tokenizer(special_dir)
    ids = ours.encode(["a <|im_start|> b"])[0].tolist()
    assert ours.tokenizer.token_to_id("<|im_start|>") in ids
    # Negative control: one special token removed from tokenizer_config.json changes the ids and the digest.
    fewer = load_tokenizer(with_special_tokens(tokenizer_dir, str(tmp_path / "fewer"), EXTRA[1:]))
    assert fewer.encode(["a <|im_start|> b"])[0].tolist() != ids
    assert fewer.digest() != ours.digest()


def _config_variant(source: str, target: str, **settings) -> str:
    shutil.copytree(source, target)
    path = os.path.join(target, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(settings)
    with open(path, "w") as f:
        json.dump(config, f)
    return target


def test_bos_eos_follow_the_tokenizer_config_unless_overridden(tokenizer_dir, tmp_path):
    bos, eos = (Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json")).token_to_id(t) for t in (BOS, EOS))
    default = load_tokenizer(tokenizer_dir)
    assert (default.bos_id, default.eos_id) == (bos, eos) and "no add_bos_token" in default.bos.reason
    no_bos = _config_variant(tokenizer_dir, str(tmp_path / "no_bos"), add_bos_token=False)
    assert (load_tokenizer(no_bos).bos_id, load_tokenizer(no_bos).eos_id) == (None, eos)
    assert "add_bos_token = false" in load_tokenizer(no_bos).bos.reason
    assert load_tokenizer(no_bos, add_bos=True).bos_id == bos  # [dataloader] add_bos overrides
    no_eos = _config_variant(tokenizer_dir, str(tmp_path / "no_eos"), add_eos_token=False)
    assert load_tokenizer(no_eos).eos_id is None and load_tokenizer(tokenizer_dir, add_eos=False).eos_id is None


def test_one_separator_when_bos_and_eos_are_the_same_token(tokenizer_dir, tmp_path):
    # GPT-2/GPT-NeoX style: bos = eos = <|endoftext|>, add_bos_token false: one token between documents.
    same = _config_variant(tokenizer_dir, str(tmp_path / "same"), bos_token=EOS, add_bos_token=False)
    ids = load_tokenizer(same).encode(["a", "b"])
    eos = load_tokenizer(same).eos_id
    assert [t.tolist().count(eos) for t in ids] == [1, 1] and ids[0][-1] == eos


def test_a_post_processor_bos_is_added_once(tokenizer_dir, tmp_path):
    # A tokenizer whose post-processor prepends BOS (Llama-3 style): BOS once, even with add_bos_token false.
    target = _config_variant(tokenizer_dir, str(tmp_path / "post"), add_bos_token=False)
    tokenizer = Tokenizer.from_file(os.path.join(target, "tokenizer.json"))
    bos = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos)])
    tokenizer.save(os.path.join(target, "tokenizer.json"))
    ours = load_tokenizer(target)
    assert ours.bos_id == bos and "post-processor" in ours.bos.reason
    ids = ours.encode(["hello"])[0].tolist()
    assert ids.count(bos) == 1 and ids[0] == bos
    trainer = HuggingFaceTokenizer(HuggingFaceTokenizer.Config(), tokenizer_path=target)
    assert ids == trainer.encode("hello", add_bos=True, add_eos=True)


def test_gpt_neox_documents_are_separated_by_one_endoftext():
    ours = load_tokenizer(real_tokenizer("gpt_neox_20b"))
    endoftext = ours.tokenizer.token_to_id("<|endoftext|>")
    assert ours.bos_id is None and ours.eos_id == endoftext
    assert [t.tolist().count(endoftext) for t in ours.encode(["a", "b"])] == [1, 1]


@functools.cache
def _document_tokenizer(path: str, bos: int | None, eos: int | None, backend: str) -> DocumentTokenizer:
    return DocumentTokenizer(Tokenizer.from_file(os.path.join(path, "tokenizer.json")), bos, eos, backend=backend)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(st.text(max_size=300), min_size=1, max_size=12),
    bos=st.sampled_from([None, 0, 7]),
    eos=st.sampled_from([None, 0, 9]),
    backend=st.sampled_from(["tokenizers", "auto"]),
)
def test_a_batch_gives_each_document_its_own_ids_between_bos_and_eos(tokenizer_dir, texts, bos, eos, backend):
    """encode() lays each document's ids between its BOS and EOS, whatever the documents that share its batch."""
    reference = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    expected = [
        [bos] * (bos is not None) + reference.encode(text, add_special_tokens=False).ids + [eos] * (eos is not None)
        for text in texts
    ]
    got = _document_tokenizer(tokenizer_dir, bos, eos, backend).encode(texts)
    assert [ids.tolist() for ids in got] == expected
    # Control: another EOS choice gives other ids.
    other = _document_tokenizer(tokenizer_dir, bos, 11 if eos is None else None, backend)
    assert [ids.tolist() for ids in other.encode(texts)] != expected


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_special_file_in_the_tokenizer_folder_is_refused_before_it_is_opened(tmp_path, tokenizer_dir, kind):
    """A FIFO as tokenizer_config.json blocked the tokenizer library forever; /dev/zero never ends."""
    from bounded import run_bounded

    from zephon_titan.errors import ConfigError
    from zephon_titan.titan.tokenizer import load_tokenizer

    folder = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, folder)
    load_tokenizer(str(folder))  # the control: the copy loads
    os.remove(folder / "tokenizer_config.json")
    if kind == "fifo":
        os.mkfifo(folder / "tokenizer_config.json")
    else:
        os.symlink("/dev/zero", folder / "tokenizer_config.json")
    _, error = run_bounded(lambda: load_tokenizer(str(folder)), 30)
    assert isinstance(error, ConfigError) and "\n" not in str(error)
    assert "tokenizer_config.json is a" in str(error) and "not a regular file" in str(error), error
