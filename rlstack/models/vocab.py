"""Log-probabilities of chosen tokens and entropies of next-token distributions over a vocabulary, in blocks
of positions, with a backward pass written out.

The policy update needs, at every scored position, the log-prob of the sampled token and the entropy of the
whole distribution; with SmolLM2's 49,152 tokens a micro-batch of 16 x 128 positions holds 400 MB of logits.
Through autograd (`log_softmax`, `gather`, `exp`, `sum`) each step is a pass over all of them, with a
float32 log-softmax of every position kept for the backward (or, split into blocks of positions and
recomputed there, a second pass); on a CPU those passes are memory-bound and took a tenth of the update
(docs/speed.md). `token_logprobs` goes through the logits a block of positions at a time, each block small
enough to stay in cache while every quantity is taken from it, and keeps for the backward only the logits
and two numbers per position: the backward recomputes each block's
probabilities from them. The values are those of `log_softmax` up to float rounding, and the gradients
those autograd would give (tests/unit/test_vocab_blocks.py).
"""

from __future__ import annotations

import torch

CPU_BLOCK = 1 << 20
"""Most logits one block takes on a CPU (4 MB of float32: a block and its temporaries stay in cache)."""

DEVICE_BLOCK = 1 << 26
"""Most logits one block takes on an accelerator (256 MB of float32: few kernel launches, bounded memory)."""


def block_rows(logits: torch.Tensor) -> int:
    """Positions per block for `logits` ([N, V]): at least one."""
    most = CPU_BLOCK if logits.device.type == "cpu" else DEVICE_BLOCK
    return max(1, most // max(1, logits.shape[-1]))


def token_logprobs(
    logits: torch.Tensor,  # [..., V]
    labels: torch.Tensor,  # [...]
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float32 log-probs of `labels` under `logits / temperature` (`[...]`), and the entropies of those
    distributions when `with_entropy` (carrying a gradient only with `entropy_grad`)."""
    shape = labels.shape
    # a view of contiguous logits (else a copy, kept for the backward)
    flat = logits.reshape(-1, logits.shape[-1])
    logp, ent = _TokenLogprobs.apply(flat, labels.reshape(-1), float(temperature), with_entropy, entropy_grad)
    return logp.view(shape), (ent.view(shape) if with_entropy else None)


def _tempered(logits: torch.Tensor, start: int, rows: int, temperature: float) -> torch.Tensor:
    """Float32 `logits[start:start+rows] / temperature` (a view where nothing changes)."""
    z = logits[start : start + rows].float()
    return z / temperature if temperature != 1.0 else z


class _TokenLogprobs(torch.autograd.Function):
    """`token_logprobs` on `[N, V]` logits and `[N]` labels."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, with_entropy, entropy_grad):
        N = logits.shape[0]
        rows = block_rows(logits)
        shift = logits.new_empty(N, 2, dtype=torch.float32)  # per position: max, log of the sum of exp
        logp = logits.new_empty(N, dtype=torch.float32)
        ent = logits.new_empty(N, dtype=torch.float32) if with_entropy else None
        with torch.no_grad():
            for s in range(0, N, rows):
                z = _tempered(logits, s, rows, temperature)
                top = z.amax(-1, keepdim=True)
                ls = z - top  # then the log-softmax, as `log_softmax` computes it: x - max - log(sum)
                log_sum = ls.exp().sum(-1, keepdim=True).log_()
                ls -= log_sum
                shift[s : s + rows] = torch.cat([top, log_sum], dim=1)
                logp[s : s + rows] = ls.gather(1, labels[s : s + rows, None]).squeeze(1)
                if with_entropy:
                    ent[s : s + rows] = -(ls.exp().mul_(ls)).sum(-1)
        ctx.temperature = temperature
        ctx.save_for_backward(logits, labels, shift, ent if entropy_grad else None)
        if with_entropy and not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, grad_ent):
        logits, labels, shift, ent = ctx.saved_tensors
        temperature = ctx.temperature
        N = logits.shape[0]
        rows = block_rows(logits)
        grad = torch.empty_like(logits)
        with_ent = ent is not None  # saved only where the entropy carries a gradient
        in_place = grad.dtype == torch.float32  # each block's gradient computed where it goes
        for s in range(0, N, rows):
            z = _tempered(logits, s, rows, temperature)
            top, log_sum = shift[s : s + rows].split(1, dim=1)
            ls = torch.sub(z, top, out=grad[s : s + rows]) if in_place else z - top
            ls -= log_sum  # the forward's log-softmax
            g = grad_logp[s : s + rows, None]  # autograd passes zeros for an unused output
            # d log p_y / dz = onehot(y) - p;  d entropy / dz = -p * (log p + entropy)
            coef = -g
            if with_ent:
                coef = (ls + ent[s : s + rows, None]).mul_(-grad_ent[s : s + rows, None]).add_(coef)
            p = ls.exp_()
            p.mul_(coef).scatter_add_(1, labels[s : s + rows, None], g)
            if temperature != 1.0:
                p /= temperature
            if not in_place:
                grad[s : s + rows] = p
        return grad, None, None, None, None
