"""What a Source does to a block its format read, before lanes share it, in each pipeline era of the run.

Its keep and repeat decided per document from the block's fields (engine/pipeline.py); its texts made from the
records through the source's transforms (engine/transforms.py), or rendered as conversations with their masks
(chat sources, engine/chat.py); each era's where they change by era. A format only reads; this is the same for
every format, so it stands apart from base.py's block numbering and reading (Source, which inherits it).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_titan.engine.chat import ChatSetup
from zephon_titan.engine.pipeline import DROPPED, SourcePipeline
from zephon_titan.engine.sources.block_documents import BlockDocuments, LazyTexts
from zephon_titan.engine.transforms import Transform


class BlockPipeline:
    """The pipeline half of Source (base.py): what it reads of the source, and each block's documents through it."""

    name: str
    text_field: str
    row_unit: str
    era_pipelines: tuple[SourcePipeline | None, ...]
    pipeline_seconds: float
    transforms: tuple[Transform, ...]
    era_transforms: tuple[tuple[Transform, ...], ...]
    chat: ChatSetup | None
    era_chats: tuple[ChatSetup | None, ...]

    @property
    def format_name(self) -> str:
        raise NotImplementedError  # Source's

    def check_size(self, text: str, where: str) -> None:
        raise NotImplementedError  # Source's

    @property
    def reads_records(self) -> bool:
        """Whether a block's records are read for transforms (in some era)."""
        return bool(self.transforms) or any(self.era_transforms) or self.chat is not None

    @property
    def pipeline(self) -> SourcePipeline | None:
        """The config's keep and repeat: the last era's pipeline (None without one)."""
        return self.era_pipelines[-1] if self.era_pipelines else None

    @property
    def pipeline_fields(self) -> list[str]:
        """The top-level columns or fields `_read` gives in BlockDocuments.fields: those the pipelines read, and
        the text's when one uses chars or bytes (empty without a pipeline)."""
        pipelines = [p for p in self.era_pipelines if p is not None]
        text = [self.text_field] if any(p.uses_text for p in pipelines) else []
        return list(dict.fromkeys([*(name for p in pipelines for name in p.fields), *text]))

    def _with_pipeline(self, block: BlockDocuments) -> BlockDocuments:
        """The block with each document's keep and repeat in each era, from the fields its format read."""
        size = len(block.texts)
        table = block.fields if block.fields is not None else pa.table({"_": pa.nulls(size)})
        if table.num_rows != size:
            raise AssertionError(f"{block.file}: {table.num_rows} rows of fields for {size} documents")
        first = block.rows[0] if len(block.rows) else 0
        started = time.process_time()
        eras = []
        for pipeline in self.era_pipelines:
            if pipeline is None or not size:  # none in this era; or a block without a line start (JSONL)
                eras.append(
                    (np.ones(size, dtype=bool), np.ones(size)) if pipeline is None else (np.zeros(0, bool), np.zeros(0))
                )
                continue
            text = table.column(self.text_field).combine_chunks() if pipeline.uses_text else None
            eras.append(pipeline.values(table, text, f"{block.file} {self.row_unit} {first}.."))
        self.pipeline_seconds += time.process_time() - started
        keep, repeat = eras[-1] if self.era_pipelines[-1] is not None else (None, None)
        return dataclasses.replace(block, fields=None, keep=keep, repeat=repeat, eras=tuple(eras))

    def _transformed(self, block: BlockDocuments) -> BlockDocuments:
        """The block whose texts are its records through the source's transforms (DROPPED where one drops it); where
        they change by era, its texts in each era too (`era_texts`, the last the config's)."""
        if self.chat is not None and not self.era_chats:
            return dataclasses.replace(block, texts=self._conversations(block, self.chat))
        if self.era_chats:  # the template changes by era: each era's conversations (the last the config's)
            era_texts = self._era_conversations(block)
            return dataclasses.replace(block, texts=era_texts[-1], era_texts=era_texts)
        chains = self.era_transforms or (self.transforms,)
        made: dict[tuple[str, ...], Sequence[Any]] = {}
        for chain in chains:
            key = tuple(t.describe() for t in chain)
            if key not in made:
                made[key] = self._texts_through(block, chain) if chain else block.texts
        era_texts = tuple(made[tuple(t.describe() for t in chain)] for chain in chains)
        return dataclasses.replace(block, texts=era_texts[-1], era_texts=era_texts if len(made) > 1 else ())

    def _era_conversations(self, block: BlockDocuments) -> tuple[Sequence[Any], ...]:
        """A chat source's conversations in each pipeline era (one object per distinct setup)."""
        made: dict[str, Sequence[Any]] = {}
        out = []
        for setup in self.era_chats:
            assert setup is not None, "a chat source is one in every era"
            key = json.dumps(setup.era_record(), sort_keys=True)
            if key not in made:
                made[key] = self._conversations(block, setup)
            out.append(made[key])
        return tuple(out)

    def _conversations(self, block: BlockDocuments, chat: ChatSetup) -> Sequence[Any]:
        """A chat source's documents: each record's conversation rendered, with its supervised spans."""
        records = block.records
        assert records is not None, f"{self.format_name} gives records for a chat source"

        def conversation(i: int) -> Any:
            where = f"{block.file} {self.row_unit} {block.rows[i]} (source {self.name!r})"
            rendered = chat.conversation(records(i), where)
            self.check_size(rendered, where)
            return rendered

        return LazyTexts(len(block.texts), conversation)

    def _texts_through(self, block: BlockDocuments, chain: tuple[Transform, ...]) -> Sequence[Any]:
        """The block's texts through `chain`, each when it is asked for; with a batched transform, one call over the
        documents some keep lets through (the others, which no lane trains, one by one when a tool asks), the
        results held while the block is."""
        records = block.records
        assert records is not None, f"{self.format_name} gives records when the source has transforms"
        field, unit = self.text_field, self.row_unit

        def where(i: int) -> str:
            return f"{block.file} {unit} {block.rows[i]} (source {self.name!r})"

        def text(i: int) -> Any:
            record = records(i)
            for t in chain:
                out = t.apply(record, field, where(i))
                if out is None:
                    return DROPPED
                record = {**record, field: out}
            result = record[field]
            self.check_size(result, where(i))
            return result

        if not any(t.batched for t in chain):
            return LazyTexts(len(block.texts), text)
        every = range(len(block.texts))
        wanted = set(every if not block.eras else np.flatnonzero(np.any([k for k, _ in block.eras], 0)).tolist())
        done: dict[int, Any] = {}

        def batched(i: int) -> Any:
            if i not in done:
                todo = [j for j in every if j in wanted and j not in done] if i in wanted else [i]
                done.update(zip(todo, self._through(block, chain, todo, where)))
            return done[i]

        return LazyTexts(len(block.texts), batched)

    def _through(
        self, block: BlockDocuments, chain: tuple[Transform, ...], todo: list[int], where: Callable[[int], str]
    ) -> list[Any]:
        """Documents `todo` of a block through the transforms in order, a batched one in one call over those still
        there: each one's text, or DROPPED."""
        assert block.records is not None, "a source with transforms reads records"
        field = self.text_field
        alive = {i: block.records(i) for i in todo}  # the records no transform has dropped, in block order
        span = f"{block.file} {self.row_unit}s {block.rows[todo[0]]}..{block.rows[todo[-1]]} (source {self.name!r})"
        for t in chain:
            ids = list(alive)
            if t.batched:
                texts = t.apply_batch([alive[i] for i in ids], field, [where(i) for i in ids], span)
            else:
                texts = [t.apply(alive[i], field, where(i)) for i in ids]
            for i, new in zip(ids, texts):
                if new is None:
                    del alive[i]
                else:
                    alive[i] = {**alive[i], field: new}
        for i, record in alive.items():
            self.check_size(record[field], where(i))
        return [alive[i][field] if i in alive else DROPPED for i in todo]
