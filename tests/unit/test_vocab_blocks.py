"""Log-probs and entropies over a large vocabulary go through it in blocks of positions with a backward written
out (`rlstack.models.vocab`): the values and gradients of autograd's one pass through `log_softmax`, without
keeping a float32 log-softmax of every position for the backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlstack.models import vocab
from rlstack.models.logprobs import ResponseLogits, forward_logprobs
from rlstack.models.vocab import token_logprobs


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


def autograd_one_pass(s: ResponseLogits, entropy_grad: bool):
    """The reference: `log_softmax` over every position at once, and autograd's gradients of it."""
    s.logits.grad = None
    ls = F.log_softmax(s.logits.float() / s.temperature, dim=-1)
    logp = s.to_full(ls.gather(-1, s.labels.unsqueeze(-1)).squeeze(-1))
    lse = ls if entropy_grad else ls.detach()
    ent = s.to_full(-(lse.exp() * lse).sum(-1))
    (logp.sum() + 0.3 * ent.sum()).backward()
    return logp.detach(), ent.detach(), s.logits.grad.clone()


@pytest.mark.parametrize("layout", ["padded", "padding-free"])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_blocks_give_autograds_values_and_gradients(
    monkeypatch, layout: str, entropy_grad: bool, temperature
):
    s = scored(layout).scaled(temperature)
    want = autograd_one_pass(s, entropy_grad)
    for block in (
        1 << 20,
        120,
        50,
    ):  # one block; 2 positions a block, the last one short; one position a block
        monkeypatch.setattr(vocab, "CPU_BLOCK", block)
        got = values_and_grads(s, entropy_grad)
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a, rtol=0, atol=2e-6)
    assert want[2].abs().sum() > 0
    assert vocab.block_rows(s.logits.reshape(-1, 50)) == 1


def test_bfloat16_logits_get_float32_values_and_bfloat16_gradients():
    s = scored("padded", torch.bfloat16)
    want = autograd_one_pass(s, entropy_grad=True)
    got = values_and_grads(s, entropy_grad=True)
    assert got[0].dtype == torch.float32 and got[2].dtype == torch.bfloat16
    for a, b in zip(want, got):
        torch.testing.assert_close(b.float(), a.float(), rtol=0, atol=1e-2)


def test_only_what_is_used_carries_a_gradient():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 40, generator=g).requires_grad_()
    labels = torch.randint(0, 40, (6,), generator=g)
    logp, ent = token_logprobs(logits, labels, with_entropy=True)
    assert logp.requires_grad and not ent.requires_grad  # no entropy bonus: the entropy is a metric
    _, ent = token_logprobs(logits, labels, with_entropy=True, entropy_grad=True)
    ent.sum().backward()  # the log-probs unused: their gradient is none, not an error
    ls = F.log_softmax(logits, -1)
    want = torch.autograd.grad(-(ls.exp() * ls).sum(), logits)[0]
    torch.testing.assert_close(logits.grad, want, rtol=0, atol=1e-6)
    assert token_logprobs(logits, labels)[1] is None


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

    def reference():
        ls = F.log_softmax(s.logits.float(), dim=-1)
        return ls.gather(-1, s.labels.unsqueeze(-1)).sum() - (ls.exp() * ls).sum()

    one_pass, _ = saved_bytes_beyond(s, reference)
    monkeypatch.setattr(vocab, "CPU_BLOCK", 120)
    blocked, loss = saved_bytes_beyond(s, run)
    assert one_pass >= full  # what the measurement sees for autograd's pass
    assert blocked < full / 10
    loss.backward()  # the blocks are recomputed for it
    assert s.logits.grad.abs().sum() > 0


def test_a_model_pass_in_blocks_equals_the_one_pass(monkeypatch, model, tok):
    from prefix_batches import make_batch

    inputs = make_batch(len(tok), [(5, 3), (4, 2)], P=6, R=6)
    for padding_free in (False, True):
        monkeypatch.setattr(vocab, "CPU_BLOCK", 1 << 26)
        whole = forward_logprobs(
            model, *inputs, with_entropy=True, temperature=0.7, padding_free=padding_free
        )
        monkeypatch.setattr(vocab, "CPU_BLOCK", 2 * len(tok))  # 2 positions a block
        blocked = forward_logprobs(
            model, *inputs, with_entropy=True, temperature=0.7, padding_free=padding_free
        )
        for a, b in zip(whole, blocked):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
