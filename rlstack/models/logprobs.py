"""Per-token log-probabilities and entropies of a causal LM over a `[B, T]` batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[labels]. logits [B, T, V], labels [B, T] -> [B, T] (float32)."""
    logits = logits.float()
    return torch.gather(F.log_softmax(logits, dim=-1), -1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim. [B, T, V] -> [B, T]."""
    logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def first_scored_column(response_mask: torch.Tensor) -> int:
    """First column where any row has a sampled token; the model needs logits from the column before it."""
    cols = response_mask.any(dim=0).nonzero()
    return int(cols[0]) if len(cols) else response_mask.shape[1]


def forward_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    position_ids: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of `input_ids[b, t]` given `input_ids[b, <t]`, at `temperature`.

    Returns `[B, T]` tensors, zero at and before the first column of `response_mask` that
    is not needed; only the logits of response columns are materialised (`logits_to_keep`).
    """
    B, T = input_ids.shape
    start = max(first_scored_column(response_mask), 1)
    keep = T - start + 1  # logits at columns start-1 .. T-1 predict tokens start .. T
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        logits_to_keep=keep,
    )
    logits = out.logits[:, :-1, :]  # [B, T-start, V]
    if temperature != 1.0:
        logits = logits / temperature
    logp = logprobs_from_logits(logits, input_ids[:, start:])
    full = logp.new_zeros(B, T)
    full[:, start:] = logp
    ent_full = None
    if with_entropy:
        with torch.no_grad():
            ent = entropy_from_logits(logits)
        ent_full = ent.new_zeros(B, T)
        ent_full[:, start:] = ent
    return full, ent_full
