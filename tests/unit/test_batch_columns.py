"""The declared table of Batch columns (`rlstack.batch.COLUMNS`): the lists the worker calls are sent come
from it, and every column rlstack's code sets during a test session must be in it (tests/conftest.py
records them; the session fails on one that is not)."""

from __future__ import annotations

import conftest
import torch

from rlstack.batch import COLUMNS, Batch, columns_read_by
from rlstack.rewards.manager import REWARD_COLUMNS
from rlstack.workers.group import MODEL_INPUTS
from rlstack.workers.policy import UPDATE_READS

CALLS = {"model", "update", "critic", "reward"}


def test_every_column_is_described_and_read_only_by_known_calls():
    for name, spec in COLUMNS.items():
        assert spec.form and spec.written_by and spec.doc, name
        assert set(spec.read_by) <= CALLS, (name, spec.read_by)


def test_the_worker_calls_are_sent_what_the_table_says():
    assert MODEL_INPUTS == ("input_ids", "attention_mask", "response_mask", "pixel_values", "image_grid_thw")
    assert set(UPDATE_READS) == set(MODEL_INPUTS) | {
        "advantages",
        "old_logprobs",
        "rollout_logprobs",
        "perception_mask",
        "ref_logprobs",
    }
    assert set(columns_read_by("critic")) == {"values", "returns"}
    assert {"response_text", "ground_truth", "prompt", "extra", "turns", "tool_calls"} <= set(REWARD_COLUMNS)
    assert "advantages" not in REWARD_COLUMNS and "scores" not in REWARD_COLUMNS  # what scoring writes


def test_a_column_set_by_the_package_is_recorded_and_one_set_by_a_test_is_not():
    batch = Batch({"input_ids": torch.zeros(2, 3)})
    batch["a_tests_own_column"] = torch.zeros(2)
    assert "a_tests_own_column" not in conftest.COLUMNS_SET
    code = compile("batch['a_made_up_column'] = torch.zeros(2)", str(conftest.PACKAGE / "made_up.py"), "exec")
    exec(code, {"batch": batch, "torch": torch})
    try:
        assert "a_made_up_column" in conftest.COLUMNS_SET
    finally:
        conftest.COLUMNS_SET.pop("a_made_up_column", None)  # the session's own check must not see it
