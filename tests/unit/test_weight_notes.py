"""Weights that do not sum to 1 are normalized, and said so (issue 31): `validate` prints the line and the
loader logs it at start; weights that sum to 1 give no line."""

from helpers import data_table

from zephon_titan.config import config_from_dict
from zephon_titan.engine.spec import weight_notes


def test_weights_that_sum_to_1_say_nothing(corpus_dir, tokenizer_dir):
    assert weight_notes(config_from_dict(data_table(corpus_dir, tokenizer_dir))) == []  # 0.4 + 0.6


def test_the_sources_weights_that_do_not_sum_to_1_are_named_with_their_shares(corpus_dir, tokenizer_dir):
    table = data_table(corpus_dir, tokenizer_dir)
    table["sources"]["code"]["weight"], table["sources"]["prose"]["weight"] = 0.5, 0.7
    assert weight_notes(config_from_dict(table)) == [
        "[dataloader.sources] weights sum to 1.2; normalized to code 0.4167, prose 0.5833"
    ]


def test_each_phase_is_checked_on_its_own(corpus_dir, tokenizer_dir):
    table = data_table(corpus_dir, tokenizer_dir)
    for source in table["sources"].values():
        del source["weight"]  # with phases, the weights come from them
    table["phases"] = [
        {"start_step": 1, "weights": {"code": 0.3, "prose": 0.7}},
        {"start_step": 5, "weights": {"code": 2}},
    ]
    notes = weight_notes(config_from_dict(table))
    assert notes == ["[[dataloader.phases]] start_step 5 weights sum to 2; normalized to code 1"]
