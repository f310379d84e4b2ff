"""The tokens every prompt of a batch starts with (a system prompt, a worked example, a chat's earlier turns):
run once for the whole batch instead of once per prompt, by sampling's prefill (`rlstack.rollout.hf_sampling`)
and by the update's shared prompt pass (`rlstack.models.logprobs`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

SHARED_PREFIX_MIN = 32
"""Fewest tokens common to every prompt for them to be run once (a shorter prefix saves less than its extra
forward pass costs)."""


@dataclass(frozen=True)
class SharedPrefix:
    """The tokens every prompt starts with, run once and copied to every row.

    A KV cache then holds, for each row, the prefix in columns `0 .. length-1` and the rest of its prompt
    right-aligned after it, with masked columns between them where a prompt is shorter than the longest:
    positions come from the mask, as with left padding, so each row's keys and values, and its logits,
    are those of its own prompt run alone (up to float rounding of the batched matrix products). A
    sliding window counts cache columns, gaps included: models with one shorter than the sequences must
    not use this layout.
    """

    length: int

    @staticmethod
    def of(distinct: list[list[int]]) -> SharedPrefix | None:
        """The prefix of `distinct` (each prompt once), leaving every prompt at least one token of its
        own; None when it is shorter than `SHARED_PREFIX_MIN` or there is one prompt."""
        if len(distinct) < 2:
            return None
        length = min(len(os.path.commonprefix(distinct)), min(len(p) for p in distinct) - 1)
        return SharedPrefix(length) if length >= SHARED_PREFIX_MIN else None

    def layout(
        self, prompts: list[list[int]], device: torch.device, width: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token ids, mask and positions [B, width] of the cache's layout (`width`: by default the longest
        prompt, as with left padding)."""
        L, width = self.length, width or max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        ids[:, :L] = torch.tensor(prompts[0][:L], dtype=torch.long)
        mask[:, :L] = 1
        for i, p in enumerate(prompts):
            ids[i, width - (len(p) - L) :] = torch.tensor(p[L:], dtype=torch.long)
            mask[i, width - (len(p) - L) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def prefill(
        self,
        model: torch.nn.Module,
        cache,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        rows: int,
    ) -> None:
        """Run the prefix (the first `length` columns of the layout's first row) into `cache` once, then copy
        it to `rows` rows (`index_select`: with a gradient, every row's flows back into the one pass)."""
        model(
            input_ids=ids[:1, : self.length],
            attention_mask=mask[:1, : self.length],
            position_ids=positions[:1, : self.length],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.reorder_cache(torch.zeros(rows, dtype=torch.long, device=ids.device))
