"""Rows grouped by prompt: dense group ids and per-group statistics, shared by estimators and filters."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_index(uids: Sequence[str]) -> torch.Tensor:
    """Map each row's uid to a dense group id, in order of first appearance. -> [B] long."""
    ids: dict[str, int] = {}
    return torch.tensor([ids.setdefault(u, len(ids)) for u in uids], dtype=torch.long)


def group_stats(
    values: torch.Tensor,  # [B]
    groups: torch.Tensor,  # [B] long group ids
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [G] row count, mean, unbiased std
    """Per group id 0..max: row count, mean and unbiased std (0 for an id with no rows, or one row)."""
    num_groups = int(groups.max()) + 1 if groups.numel() else 0
    count = values.new_zeros(num_groups).index_add_(0, groups, torch.ones_like(values))
    mean = values.new_zeros(num_groups).index_add_(0, groups, values) / count.clamp(min=1)
    sq_dev = (values - mean[groups]) ** 2  # [B]
    var = values.new_zeros(num_groups).index_add_(0, groups, sq_dev) / (count - 1).clamp(min=1)
    return count, mean, var.sqrt()
