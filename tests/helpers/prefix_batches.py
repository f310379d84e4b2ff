"""Batches of prompt groups with their copies, as the prefix-sharing and vocab-block tests lay them out."""

from __future__ import annotations

import torch


def make_batch(vocab: int, groups: list[tuple[int, int]], P: int, R: int, seed: int = 0, prefix: int = 0):
    """Rows for `groups` of (prompt length, copies): one random prompt per group, left-padded to P,
    each copy with its own random response of 1..R tokens, right-padded to R. `prefix`: every prompt starts
    with the same `prefix` random tokens (counted in its length)."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(3, vocab, (prefix,), generator=g)
    ids, mask = [], []
    for plen, copies in groups:
        prompt = torch.cat([common, torch.randint(3, vocab, (plen - prefix,), generator=g)])
        for _ in range(copies):
            r = int(torch.randint(1, R + 1, (), generator=g))
            row, m = torch.zeros(P + R, dtype=torch.long), torch.zeros(P + R, dtype=torch.long)
            row[P - plen : P], m[P - plen : P] = prompt, 1
            row[P : P + r], m[P : P + r] = torch.randint(3, vocab, (r,), generator=g), 1
            ids.append(row)
            mask.append(m)
    input_ids, attention_mask = torch.stack(ids), torch.stack(mask)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask.clone()
    response_mask[:, :P] = 0
    return input_ids, attention_mask, position_ids, response_mask
