"""The deterministic lane engine. Imports neither torch nor torchtitan."""

from zephon_titan.engine.digest import batch_digest, lane_digest
from zephon_titan.engine.fingerprint import check_fingerprint, check_mixture, fingerprint
from zephon_titan.engine.lanes import (
    LaneGroup,
    LayoutError,
    RankRows,
    lanes_of_rank,
    open_lane_group,
    rank_rows,
    rows_per_lane,
    valid_world_sizes,
    validate_batch_layout,
)
from zephon_titan.engine.rows import IGNORE_INDEX, Row, tally
from zephon_titan.engine.spec import EngineSpec, build_engine
from zephon_titan.engine.state import LaneState, SourceCursor
from zephon_titan.engine.stream import LaneStream
from zephon_titan.engine.tokenize import DocumentTokenizer, SpecialTokenChoice
from zephon_titan.errors import ConfigError, DataError, LaneExhausted, ResumeError, ZephonError

__all__ = [
    "ConfigError",
    "DataError",
    "DocumentTokenizer",
    "EngineSpec",
    "IGNORE_INDEX",
    "LaneExhausted",
    "LaneGroup",
    "LaneState",
    "LaneStream",
    "ResumeError",
    "Row",
    "SourceCursor",
    "ZephonError",
    "batch_digest",
    "build_engine",
    "check_fingerprint",
    "check_mixture",
    "fingerprint",
    "lane_digest",
    "lanes_of_rank",
    "RankRows",
    "rank_rows",
    "SpecialTokenChoice",
    "open_lane_group",
    "rows_per_lane",
    "tally",
    "valid_world_sizes",
    "validate_batch_layout",
    "LayoutError",
]
