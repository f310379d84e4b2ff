"""The small-query attention path on CPU (`rlstack.models.attention`): the same attention as Hugging
Face's SDPA (values and gradients), taken only where it is faster, and what models load with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rlstack.models import attention
from rlstack.models.attention import SMALL_QUERY, small_query_attention
from rlstack.models.loading import load_causal_lm


class Grouped(torch.nn.Module):
    """What an attention function reads from its module: the grouped-query factor."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _inputs(B: int, H: int, KV: int, Q: int, L: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Q, 16, generator=g, requires_grad=True)
    k = torch.randn(B, KV, L, 16, generator=g, requires_grad=True)
    v = torch.randn(B, KV, L, 16, generator=g, requires_grad=True)
    # Causal over the last Q keys, with left padding: row 0 pads 3 keys, row 1 pads all but the queries'.
    mask = torch.ones(Q, L, dtype=torch.bool).tril(L - Q).expand(B, 1, Q, L).clone()
    mask[0, :, :, :3] = False
    mask[1, :, :, : L - Q] = False
    return q, k, v, mask


@pytest.mark.parametrize(
    "B,H,KV,Q,L", [(4, 4, 2, 1, 9), (3, 4, 2, 5, 12), (2, 6, 3, SMALL_QUERY, 20), (2, 4, 4, 3, 7)]
)
def test_small_query_attention_equals_sdpa_in_values_and_gradients(B, H, KV, Q, L):
    module = Grouped(H // KV)
    q, k, v, mask = _inputs(B, H, KV, Q, L)
    grad = torch.randn(B, Q, H, 16, generator=torch.Generator().manual_seed(1))
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    got, _ = small_query_attention(module, q, k, v, mask, scaling=0.3)
    got_grads = torch.autograd.grad(got, (q, k, v), grad)
    assert got.shape == want.shape == (B, Q, H, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_query_that_may_attend_to_nothing_stays_finite():
    """A padding query whose keys are all masked: its output is never read, but NaNs there would reach
    every gradient through the backward pass."""
    module = Grouped(2)
    q, k, v, mask = _inputs(2, 4, 2, 2, 6)
    mask[0] = False
    out, _ = small_query_attention(module, q, k, v, mask)
    (gq, gk, gv) = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(bool(t.isfinite().all()) for t in (out, gq, gk, gv))
    torch.testing.assert_close(out[1], sdpa_attention_forward(module, q, k, v, mask)[0][1])


def test_more_queries_than_the_threshold_take_sdpa_itself(monkeypatch):
    calls = []
    real = attention.sdpa_attention_forward

    def spy(*args, **kwargs):
        calls.append(args[1].shape[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", spy)
    module = Grouped(2)
    for Q in (1, SMALL_QUERY, SMALL_QUERY + 1):
        q, k, v, mask = _inputs(2, 4, 2, Q, Q + 4)
        small_query_attention(module, q, k, v, mask)
    q, k, v, _ = _inputs(2, 4, 2, 3, 3)
    small_query_attention(module, q, k, v, None)  # several queries, no mask: SDPA's causal kernel
    assert calls == [SMALL_QUERY + 1, 3]


def test_models_load_with_it_for_sdpa_and_keep_what_else_is_asked(tiny_model_dir: Path, tool_vlm: Path):
    assert load_causal_lm(str(tiny_model_dir)).config._attn_implementation == attention.NAME
    assert (
        load_causal_lm(str(tiny_model_dir), attn_implementation="eager").config._attn_implementation
        == "eager"
    )
    vlm = load_causal_lm(str(tool_vlm))
    assert vlm.config.text_config._attn_implementation == attention.NAME
    assert vlm.config.vision_config._attn_implementation == "sdpa"  # the vision tower's own attention


def test_decoding_with_it_gives_sdpa_logits(tiny_model_dir: Path):
    """A prefill and three decoding steps with left padding: the logits of the model as loaded match
    the same weights under plain SDPA."""
    ours = load_causal_lm(str(tiny_model_dir)).eval()
    plain = load_causal_lm(str(tiny_model_dir)).eval()
    plain.set_attn_implementation("sdpa")
    ids = torch.randint(3, 30, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    logits = []
    for model in (ours, plain):
        cache = DynamicCache(config=model.config)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            out = [
                model(
                    input_ids=ids[:, :7],
                    attention_mask=mask[:, :7],
                    position_ids=pos[:, :7],
                    past_key_values=cache,
                    use_cache=True,
                ).logits[:, -1]
            ]
            for t in range(7, 10):
                out.append(
                    model(
                        input_ids=ids[:, t : t + 1],
                        attention_mask=mask[:, : t + 1],
                        position_ids=pos[:, t : t + 1],
                        past_key_values=cache,
                        use_cache=True,
                    ).logits[:, -1]
                )
        logits.append(torch.stack(out))
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)
