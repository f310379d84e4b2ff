"""DAPO and PyVision batch filters against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from rlstack.algos.filters import (
    group_filter,
    overlong_penalty,
    rank_groups_by_std,
    select_to_fill,
    trajectory_filter,
    truncation_mask,
)


def close(actual: torch.Tensor, expected: list, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ------------------------------------------------------------------------------------ group_filter


def test_group_filter_drops_all_correct_and_all_wrong_groups():
    # group 0 all right (mean 1), group 1 mixed (mean 0.5), group 2 all wrong (mean 0)
    metric = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert group_filter(metric, groups, low=0.0, high=1.0).tolist() == [
        False,
        False,
        True,
        True,
        False,
        False,
    ]


def test_group_filter_uses_the_group_mean_of_interleaved_rows():
    # group 0 = rows 0, 2, 4 with 1, 1, 0: mean 2/3 -> kept by EasyR1's defaults (0.01, 0.99)
    # group 1 = rows 1, 3 with 1, 1: mean 1 -> dropped
    metric = torch.tensor([1, 1, 1, 1, 0])
    groups = torch.tensor([0, 1, 0, 1, 0])
    assert group_filter(metric, groups, low=0.01, high=0.99).tolist() == [True, False, True, False, True]


def test_group_filter_bounds_are_exclusive():
    metric = torch.tensor([0.25, 0.75, 0.5, 0.5, 0.8, 0.8])  # means 0.5, 0.5, 0.8
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert group_filter(metric, groups, low=0.5, high=0.9).tolist() == [False] * 4 + [True, True]
    assert group_filter(metric, groups, low=0.4, high=0.8).tolist() == [True] * 4 + [False, False]


# -------------------------------------------------------------------------------- overlong_penalty


def test_overlong_penalty_is_zero_then_linear_then_flat():
    # expected length 10 - 4 = 6; penalty -0.5 * (L - 6) / 4, between 0 and -0.5
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    out = overlong_penalty(lengths, max_response_length=10, buffer_length=4, penalty_factor=0.5)
    close(out, [0.0, 0.0, -0.125, -0.25, -0.5, -0.5])
    assert out.dtype == torch.float32


def test_overlong_penalty_rejects_a_bad_buffer():
    for buffer in (0, 11):
        with pytest.raises(ValueError, match="buffer_length"):
            overlong_penalty(
                torch.tensor([1]), max_response_length=10, buffer_length=buffer, penalty_factor=1.0
            )


# -------------------------------------------------------------------------------- truncation_mask


def test_truncation_mask_zeroes_truncated_rows_and_keeps_the_dtype():
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [1, 0, 0, 0]])
    truncated = torch.tensor([False, True, False])
    out = truncation_mask(truncated, mask)
    assert out.tolist() == [[0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
    assert out.dtype == torch.long
    assert truncation_mask(truncated, mask.float()).dtype == torch.float32


# ------------------------------------------------------------------------------ trajectory_filter


def test_trajectory_filter_each_rule_removes_its_row():
    end_reason = ["done", "max_turns", "done", "done", "done"]
    lengths = torch.tensor([5, 5, 9, 10, 3])
    has_image = torch.tensor([True, True, True, True, False])
    keep = trajectory_filter(end_reason, lengths, has_image, {"done"}, max_length=9, require_image=True)
    # row 1: end reason; row 2: length 9 == max is kept; row 3: too long; row 4: no image
    assert keep.tolist() == [True, False, True, False, False]
    keep = trajectory_filter(end_reason, lengths, has_image, {"done"}, max_length=None, require_image=False)
    assert keep.tolist() == [True, False, True, True, True]
    keep = trajectory_filter(
        end_reason, lengths, has_image, {"done", "max_turns"}, max_length=None, require_image=False
    )
    assert keep.tolist() == [True] * 5


def test_trajectory_filter_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="end reasons"):
        trajectory_filter(["done"], torch.tensor([1, 2]), torch.tensor([True, True]), {"done"}, None, False)


# ----------------------------------------------------------------------------- rank_groups_by_std


def test_rank_groups_by_std_descending_with_ties_by_id():
    # g0: 1, 0 -> unbiased std sqrt(0.5) = 0.7071; g1: 1, 1 -> 0; g2: 3, 1, 2 -> sqrt(2 / 2) = 1;
    # g3: a single row -> 0. Order: g2, g0, then the tie g1, g3 by id.
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 3.0, 1.0, 2.0, 5.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3])
    assert rank_groups_by_std(scores, groups).tolist() == [2, 0, 1, 3]


def test_rank_groups_by_std_returns_only_ids_present():
    # ids 0, 2, 3 have no rows (e.g. after select): only 4 (std 0.7071) and 1 (std 0) come back
    scores = torch.tensor([0.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([4, 4, 1, 1])
    assert rank_groups_by_std(scores, groups).tolist() == [4, 1]


# ---------------------------------------------------------------------------------- select_to_fill

KEEP = torch.tensor([True, True, False, False, True, False, True, True])
GROUPS = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])


def test_select_to_fill_takes_groups_in_id_order_and_skips_empty_ones():
    # group 1 has no kept row; the first two groups with one are 0 and 2 (only row 4 of group 2)
    assert select_to_fill(KEEP, GROUPS, 2, None).tolist() == [0, 1, 4]


def test_select_to_fill_follows_the_given_order():
    order = torch.tensor([3, 1, 2, 0])
    assert select_to_fill(KEEP, GROUPS, 2, order).tolist() == [4, 6, 7]
    assert select_to_fill(KEEP, GROUPS, 3, torch.tensor([2])).tolist() == [4]  # groups not in order: never


def test_select_to_fill_returns_what_there_is_and_never_a_dropped_row():
    assert select_to_fill(KEEP, GROUPS, 10, None).tolist() == [0, 1, 4, 6, 7]
    assert select_to_fill(KEEP, GROUPS, 0, None).tolist() == []
    with pytest.raises(ValueError, match="num_groups_needed"):
        select_to_fill(KEEP, GROUPS, -1, None)


def test_dynamic_sampling_with_std_ranking_end_to_end():
    # g0: 1, 1 (dropped); g1: 1, 0 (std 0.7071); g2: 1, 0, 0, 0 (std 0.5); g3: 0, 1, 1 (std 0.5774)
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3])
    keep = group_filter(scores, groups, low=0.0, high=1.0)
    order = rank_groups_by_std(scores, groups)
    assert order.tolist() == [1, 3, 2, 0]
    assert select_to_fill(keep, groups, 2, order).tolist() == [2, 3, 8, 9, 10]
