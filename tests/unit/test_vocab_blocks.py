"""Log-probs and entropies over a large vocabulary go through it in blocks of positions: the same values
and gradients as one pass, without keeping a float32 log-softmax of every position for the backward."""

from __future__ import annotations

import pytest
import torch

from rlstack.models import logprobs as lp
from rlstack.models.logprobs import ResponseLogits, forward_logprobs


def scored(layout: str, dtype=torch.float32) -> ResponseLogits:
    g = torch.Generator().manual_seed(0)
    B, T, V = 3, 7, 50
    if layout == "padded":  # [B, T-start, V], the columns from `start` scored
        logits = (torch.randn(B, T - 2, V, generator=g) * 3).to(dtype).requires_grad_()
        labels = torch.randint(0, V, (B, T - 2), generator=g)
        return ResponseLogits(logits, labels, 2, None, (B, T))
    N = 11  # padding-free: one row per response token
    index = (torch.randint(0, B, (N,), generator=g), torch.arange(N) % T)
    logits = (torch.randn(N, V, generator=g) * 3).to(dtype).requires_grad_()
    return ResponseLogits(logits, torch.randint(0, V, (N,), generator=g), None, index, (B, T))


def values_and_grads(s: ResponseLogits, entropy_grad: bool):
    s.logits.grad = None
    logp, ent = s.logprobs(with_entropy=True, entropy_grad=entropy_grad)
    (logp.sum() + 0.3 * ent.sum()).backward()
    return logp.detach(), ent.detach(), s.logits.grad.clone()


@pytest.mark.parametrize("layout", ["padded", "padding-free"])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_blocks_give_the_one_pass_values_and_gradients(monkeypatch, layout: str, entropy_grad: bool):
    s = scored(layout)
    whole = values_and_grads(s, entropy_grad)
    monkeypatch.setattr(lp, "VOCAB_BLOCK", 120)  # 1 column (3 x 50) / 2 rows (2 x 50) per block
    assert len(lp._vocab_blocks(s.logits)) == (5 if layout == "padded" else 6)
    blocked = values_and_grads(s, entropy_grad)
    for a, b in zip(whole, blocked):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert whole[2].abs().sum() > 0


def saved_bytes_beyond(s: ResponseLogits, fn) -> int:
    """Bytes autograd keeps for the backward of `fn()`, not counting the logits and labels themselves."""
    total = 0
    inputs = {s.logits.untyped_storage().data_ptr(), s.labels.untyped_storage().data_ptr()}

    def pack(t):
        nonlocal total
        if t.untyped_storage().data_ptr() not in inputs:
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out


def test_blocks_keep_no_float32_log_softmax_for_the_backward(monkeypatch):
    s = scored("padded", torch.bfloat16)
    full = s.logits.numel() * 4  # the float32 log-softmax of every position

    def run():
        logp, ent = s.logprobs(with_entropy=True, entropy_grad=True)
        return logp.sum() + ent.sum()

    one_pass, _ = saved_bytes_beyond(s, run)
    monkeypatch.setattr(lp, "VOCAB_BLOCK", 120)
    blocked, loss = saved_bytes_beyond(s, run)
    assert one_pass >= full  # what the measurement sees without blocks
    assert blocked < full / 10
    loss.backward()  # the blocks are recomputed for it
    assert s.logits.grad.abs().sum() > 0


def test_a_model_pass_in_blocks_equals_the_one_pass(monkeypatch, model, tok):
    from prefix_batches import make_batch

    inputs = make_batch(len(tok), [(5, 3), (4, 2)], P=6, R=6)
    for padding_free in (False, True):
        monkeypatch.setattr(lp, "VOCAB_BLOCK", 1 << 26)
        whole = forward_logprobs(
            model, *inputs, with_entropy=True, temperature=0.7, padding_free=padding_free
        )
        monkeypatch.setattr(lp, "VOCAB_BLOCK", 2 * 5 * len(tok))  # 2 columns of 5 rows / 10 rows per block
        blocked = forward_logprobs(
            model, *inputs, with_entropy=True, temperature=0.7, padding_free=padding_free
        )
        for a, b in zip(whole, blocked):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
