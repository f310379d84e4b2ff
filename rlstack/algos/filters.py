"""Batch filters: which rollouts, and which of their tokens, a step trains on.

DAPO (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476) contributes three of them:

- Dynamic sampling: a prompt whose responses all get the same accuracy has zero GRPO advantage,
  so the group is dropped and more prompts are sampled until the batch is full. `group_filter`
  keeps a group when the mean of its metric lies strictly between `low` and `high`, the test of
  EasyR1's `online_filtering` (`filter_low < mean(filter_key) < filter_high`, defaults 0.01 and
  0.99). With a 0/1 accuracy, `low=0, high=1` is DAPO's `0 < #correct < G`.
- Soft overlong punishment (`overlong_penalty`), added to the reward: 0 up to
  `max_response_length - buffer_length` tokens, then linear down to `-penalty_factor` at
  `max_response_length` (EasyR1 `overlong_buffer_length`, `overlong_penalty_factor`).
- Overlong filtering (`truncation_mask`): truncated responses keep no tokens in the loss.

PyVision-RL (agents-x-project/PyVision-RL, "partial dynamic filtering") computes advantages on
whole groups first, then drops single trajectories (`trajectory_filter`: end reason not allowed,
too long, no image), so a group may enter the batch in part; with `std_sort_enable` the oversampled
pool is cut to the batch size by the reward std of each trajectory's group.

Departures:
- PyVision's own group test keeps a group whose reward std is positive (and every singleton);
  `group_filter` bounds the mean as EasyR1 does, which for 0/1 rewards is the same test.
- PyVision sorts trajectories by group std with a non-stable argsort and cuts at a trajectory
  count, which can split a group. Here `rank_groups_by_std` ranks groups (ties by group id) and
  `select_to_fill` takes whole groups. The std is the unbiased sample std, as in the GRPO
  advantages; a single-row group has std 0 (PyVision sets 1).
- DAPO gives -1 beyond the maximum length; `overlong_penalty` scales that by `penalty_factor`,
  so the penalty is continuous and never below `-penalty_factor`.
"""

from __future__ import annotations

import torch

from rlstack.algos.groups import group_stats


def group_filter(
    metric: torch.Tensor,  # [B]
    groups: torch.Tensor,  # [B] long, dense group ids
    low: float,
    high: float,
) -> torch.Tensor:  # [B] bool
    """Keep every row of a group whose mean metric is strictly inside (low, high)."""
    _, mean, _ = group_stats(metric.to(torch.float64), groups)  # [G]
    row_mean = mean[groups]  # [B]
    return (row_mean > low) & (row_mean < high)


def overlong_penalty(
    response_lengths: torch.Tensor,  # [B]
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float,
) -> torch.Tensor:  # [B] float, in [-penalty_factor, 0]
    """DAPO's soft overlong punishment, to be added to the reward."""
    if not 0 < buffer_length <= max_response_length:
        raise ValueError(
            f"buffer_length must be in (0, max_response_length={max_response_length}], got {buffer_length}"
        )
    expected = max_response_length - buffer_length
    excess = (response_lengths.to(torch.get_default_dtype()) - expected) / buffer_length  # [B]
    return -penalty_factor * excess.clamp(min=0.0, max=1.0)


def truncation_mask(
    truncated: torch.Tensor,  # [B] bool, the response hit the length limit
    response_mask: torch.Tensor,  # [B, T]
) -> torch.Tensor:  # [B, T], dtype of response_mask
    """The response mask with every token of a truncated response set to zero."""
    return response_mask * (~truncated.bool())[:, None].to(response_mask.dtype)


def trajectory_filter(
    end_reason: list[str],  # [B]
    response_lengths: torch.Tensor,  # [B]
    has_image: torch.Tensor,  # [B] bool
    allowed_end_reasons: set[str],
    max_length: int | None,
    require_image: bool,
) -> torch.Tensor:  # [B] bool
    """Keep a trajectory that ended for an allowed reason, is at most `max_length` tokens long
    (no limit when None) and, when `require_image`, holds an image. Judges rows one by one."""
    if len(end_reason) != len(response_lengths):
        raise ValueError(f"{len(end_reason)} end reasons for {len(response_lengths)} trajectories")
    keep = torch.tensor([r in allowed_end_reasons for r in end_reason], dtype=torch.bool)
    keep = keep.to(response_lengths.device)
    if max_length is not None:
        keep &= response_lengths <= max_length
    if require_image:
        keep &= has_image.bool()
    return keep


def rank_groups_by_std(
    scores: torch.Tensor,  # [B]
    groups: torch.Tensor,  # [B] long group ids
) -> torch.Tensor:  # [G'] long: the ids present in `groups`, by descending std
    """Group ids ordered by the unbiased std of their scores, highest first; ties by lower id."""
    count, _, std = group_stats(scores.to(torch.float64), groups)  # [G] each
    present = (count > 0).nonzero().flatten()  # [G']
    order = torch.sort(std[present], descending=True, stable=True).indices
    return present[order]


def select_to_fill(
    keep: torch.Tensor,  # [B] bool
    groups: torch.Tensor,  # [B] long group ids
    num_groups_needed: int,
    order: torch.Tensor | None,  # [G'] long group ids, e.g. from rank_groups_by_std
) -> torch.Tensor:  # [N] long row indices, ascending
    """Rows to train on: the kept rows of the first `num_groups_needed` groups that have a kept row,
    taking groups in `order` (default: by id, i.e. order of first appearance). Groups missing from
    `order` are never taken. Returns fewer groups when fewer qualify; the caller checks the count."""
    if num_groups_needed < 0:
        raise ValueError(f"num_groups_needed must be >= 0, got {num_groups_needed}")
    num_groups = int(groups.max()) + 1 if groups.numel() else 0
    has_kept = torch.zeros(num_groups, dtype=torch.bool, device=groups.device)
    has_kept[groups[keep.bool()]] = True  # [G]
    if order is None:
        order = torch.arange(num_groups, device=groups.device)
    chosen = order[has_kept[order]][:num_groups_needed]
    selected = torch.zeros(num_groups, dtype=torch.bool, device=groups.device)
    selected[chosen] = True
    return (keep.bool() & selected[groups]).nonzero().flatten()
