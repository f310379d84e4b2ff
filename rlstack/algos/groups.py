"""Rows grouped by prompt: dense group ids and per-group statistics, shared by estimators and filters."""

from __future__ import annotations

import math
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
    """Per group id 0..max: row count, mean and unbiased std (0 for an id with no rows, or one row). A group
    whose values are all equal has exactly that value as its mean and exactly 0 as its std: summed in
    floating point, n equal values divided by n can miss the value by its last bit (0.6 six times: the std
    comes out ~3e-8 and GRPO's advantages ~0.06, a push from rounding alone, as veRL's torch.mean/std give)."""
    num_groups = int(groups.max()) + 1 if groups.numel() else 0
    count = values.new_zeros(num_groups).index_add_(0, groups, torch.ones_like(values))
    mean = values.new_zeros(num_groups).index_add_(0, groups, values) / count.clamp(min=1)
    lo = values.new_full((num_groups,), math.inf).scatter_reduce(0, groups, values, "amin")
    hi = values.new_full((num_groups,), -math.inf).scatter_reduce(0, groups, values, "amax")
    tied = lo == hi  # [G] (False for an id with no rows)
    mean = torch.where(tied, lo, mean)
    sq_dev = (values - mean[groups]) ** 2  # [B]
    var = values.new_zeros(num_groups).index_add_(0, groups, sq_dev) / (count - 1).clamp(min=1)
    return count, mean, torch.where(tied, torch.zeros_like(var), var.sqrt())


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a prompt with `c` correct among `n` samples (Chen et al., 2021, "Evaluating Large
    Language Models Trained on Code"): 1 - C(n-c, k) / C(n, k), the chance that k of the n drawn
    without replacement hold at least one correct."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_means(correct: Sequence[bool], uids: Sequence[str]) -> dict[int, float]:
    """Mean pass@k over prompts (rows grouped by uid; each prompt's n is its own row count), for
    k = 1, 2, 4, ... up to the smallest n, and that n."""
    counts: dict[str, list[bool]] = {}
    for ok, uid in zip(correct, uids, strict=True):
        counts.setdefault(uid, []).append(bool(ok))
    if not counts:
        return {}
    n = min(len(v) for v in counts.values())
    ks = sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})
    return {k: sum(pass_at_k(len(v), sum(v), k) for v in counts.values()) / len(counts) for k in ks}
