"""In-process prefetch (`num_workers = 0`): the rank's lanes as a torchdata node behind torchdata's Prefetcher.

A background thread produces the next steps while the trainer runs the current one (measured in
docs/design.md, "torchdata: decision"): the same LaneGroup, in one thread, so the same rows. The
loader's checkpoint state does not come from here: ZephonDataLoader records the lane state that
arrives with each row it hands over, so a prefetched step is never counted as consumed.
"""

from __future__ import annotations

from typing import Any, Protocol

from torchdata.nodes import BaseNode, Prefetcher

from zephon_titan.errors import LaneExhausted, ZephonError


class StepSource(Protocol):
    """What the loader reads steps from: a LaneGroup, the worker-process group, or PrefetchedSteps."""

    def next_step_with_states(self) -> list: ...

    def close(self) -> None: ...


class LaneGroupNode(BaseNode[tuple[str, Any]]):
    """Items: ("step", rows with states per lane), then ("exhausted", None) at the end of a finite run.
    A ZephonError is handed over as ("error", error): torchdata would re-raise it wrapped with the
    thread's traceback, and the user is owed the one line."""

    def __init__(self, group: StepSource):
        super().__init__()
        self.group = group
        self._done = False

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)  # the group already stands where the trainer's checkpoint says

    def next(self) -> tuple[str, Any]:
        if self._done:
            raise StopIteration
        try:
            return "step", self.group.next_step_with_states()
        except LaneExhausted:
            self._done = True
            return "exhausted", None
        except ZephonError as error:
            self._done = True
            return "error", error

    def get_state(self) -> dict[str, Any]:
        return {}  # see the module docstring: the state is kept by the consumer


class PrefetchedSteps:
    """`next_step_with_states()` of a LaneGroup, produced up to `prefetch_factor` steps ahead in a thread."""

    def __init__(self, group: StepSource, prefetch_factor: int):
        self._prefetcher: Prefetcher | None = Prefetcher(LaneGroupNode(group), prefetch_factor=prefetch_factor)
        self._prefetcher.reset()

    def next_step_with_states(self) -> list:
        if self._prefetcher is None:
            raise RuntimeError("the prefetcher was closed")
        kind, value = next(self._prefetcher)
        if kind == "exhausted":
            raise LaneExhausted
        if kind == "error":
            raise value
        return value

    def close(self) -> None:
        # Dropping the prefetcher stops its daemon thread (torchdata shuts it down when collected).
        self._prefetcher = None
