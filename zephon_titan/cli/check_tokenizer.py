"""`validate --check-tokenizer`: the fast tokenizer backend (fastokens) against tokenizers on every document
of every source, naming the first whose ids differ, so that a user can see on their own data whether the faster
backend gives the same tokens."""

from __future__ import annotations

from zephon_titan.errors import ZephonError


def check_tokenizer(spec, fast_json: str | None = None) -> int:
    """fastokens against tokenizers, document by document over every source; 1 at the first difference.
    `fast_json` (tests) loads fastokens from another tokenizer.json."""
    from zephon_titan import progress
    from zephon_titan.engine.tokenize import DocumentProblem, check_encodable
    from zephon_titan.engine.tokenizer_backends import FastBackend, ReferenceBackend, fast_eligibility, first_difference

    reference = ReferenceBackend(spec.tokenizer.tokenizer)
    try:
        fast = FastBackend(fast_json if fast_json is not None else spec.tokenizer.tokenizer.to_str())
    except ImportError:
        raise ZephonError("--check-tokenizer needs fastokens: pip install 'zephon-titan[fast]'") from None
    except Exception as e:
        print(f"fastokens cannot load this tokenizer: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return 1
    why_not = fast_eligibility(spec.tokenizer.tokenizer.to_str())
    print(
        "  fastokens is verified for this tokenizer's configuration"
        if why_not is None
        else f"  fastokens is not verified for this tokenizer ({why_not}): the run uses tokenizers whatever this finds"
    )
    documents = 0
    for source in spec.sources:
        progress.doing(f"comparing the backends on {source.name}", source.num_blocks, "block")
        for block in range(source.num_blocks):
            progress.advance(1)
            docs = source.read_block(block)
            texts = [t for t in docs.texts if isinstance(t, str)]  # pre-tokenized rows need no tokenizer
            rows = [r for t, r in zip(docs.texts, docs.rows) if isinstance(t, str)]
            try:
                bad = first_difference(reference, fast, texts)
            except Exception as e:  # it cannot encode some document: name the first
                try:
                    check_encodable(texts)  # no tokenizer can, if it is no Unicode text: the data's fault
                except DocumentProblem as problem:
                    raise problem.at(docs.file, source.row_unit, rows[problem.index], source.name) from None
                print(f"fastokens fails on {docs.file} {source.row_unit} {rows[_first_failing(fast, texts)]}: {e}")
                return 1
            if bad is not None:
                print(
                    f"first difference: {docs.file} {source.row_unit} {rows[bad]} (source {source.name}): "
                    f"{texts[bad][:80]!r}"
                )
                return 1
            documents += len(texts)
    print(f"fastokens and tokenizers give the same ids for all {documents:,} documents")
    return 0


def _first_failing(fast, texts: list[str]) -> int:
    """The first of `texts` that fastokens cannot encode (0 if it encodes them all one by one)."""
    for i, text in enumerate(texts):
        try:
            fast.encode_flat([text])
        except Exception:
            return i
    return 0
