"""Shared prompt passes: rows with the same prompt are prefilled / scored once, with the same results.

`forward_logprobs` runs the prompt columns once per run of identical rows and the response
columns against the expanded KV cache; `sample` prefills each distinct prompt once. Both must
give what one pass over every row gives: the same log-probs, entropies and parameter gradients,
and the same sampled tokens for the same generator seed.
"""

from __future__ import annotations

import pytest
import torch
from prefix_batches import make_batch

import rlstack.rollout.hf_sampling as hf_sampling
from rlstack.models.loading import load_causal_lm
from rlstack.models.logprobs import forward_logprobs, run_starts
from rlstack.models.prefix import SHARED_PREFIX_MIN
from rlstack.rollout.hf import sample


class ForwardCalls:
    """Records the `input_ids` shape of every top-level forward call of a model."""

    def __init__(self, model: torch.nn.Module):
        self.shapes: list[tuple[int, ...]] = []
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        self.shapes.append(tuple(kwargs["input_ids"].shape))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


# ------------------------------------------------------------------------------ forward_logprobs


def plain_logprobs(model, input_ids, attention_mask, position_ids, response_mask, temperature):
    """Reference: one forward pass over every full row, scored from column P on."""
    P = int(response_mask.any(0).nonzero()[0])
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, P - 1 : -1] / temperature
    logp = torch.zeros(input_ids.shape)
    logp[:, P:] = torch.log_softmax(logits, -1).gather(-1, input_ids[:, P:, None]).squeeze(-1)
    ent = torch.zeros(input_ids.shape)
    ent[:, P:] = torch.distributions.Categorical(logits=logits.detach()).entropy()
    return logp, ent


def grads_of_token_mean(model, logp, response_mask) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    mask = response_mask.float()
    ((logp * mask).sum() / mask.sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def assert_same_as_plain(model, batch, temperature=0.7):
    model.train()
    ref_logp, ref_ent = plain_logprobs(model, *batch, temperature=temperature)
    ref_grads = grads_of_token_mean(model, ref_logp, batch[3])
    logp, ent = forward_logprobs(model, *batch, temperature=temperature, with_entropy=True)
    grads = grads_of_token_mean(model, logp, batch[3])
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    assert not ent.requires_grad
    flat, ref_flat = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in ref_grads])
    assert ref_flat.norm() > 0
    assert ((flat - ref_flat).norm() / ref_flat.norm()).item() < 1e-5
    for (name, _), g, ref in zip(model.named_parameters(), grads, ref_grads):
        # per tensor, relative to its own size (the key biases' true gradient is 0: softmax is shift-invariant)
        assert (g - ref).norm().item() <= 1e-5 * ref.norm().item() + 1e-9, (
            name,
            (g - ref).norm(),
            ref.norm(),
        )


def test_run_starts():
    x = torch.tensor([[1, 2], [1, 2], [1, 3], [1, 2], [1, 2], [1, 2]])
    y = torch.tensor([0, 0, 0, 0, 1, 1])
    assert run_starts(x).tolist() == [True, False, True, True, False, False]
    assert run_starts(x, y).tolist() == [True, False, True, True, True, False]
    assert run_starts(x[:0]).tolist() == []


def test_shared_prompt_pass_equals_plain_pass_with_grouped_prompts(model):
    # groups of different sizes and prompt lengths; the last two groups have the same length
    batch = make_batch(model.config.vocab_size, [(5, 3), (9, 1), (2, 4), (9, 2), (7, 2)], P=10, R=6)
    with ForwardCalls(model) as calls:
        forward_logprobs(model, *batch)
    # one pass over the 5 distinct prompts but their last column, one from that column to the last response
    # column but one: every logit from the one pass, in one tensor
    assert calls.shapes == [(5, 9), (12, 6)]
    assert_same_as_plain(model, batch)


def test_plain_pass_without_repeated_prompts(model):
    batch = make_batch(model.config.vocab_size, [(4, 1), (7, 1), (3, 1), (7, 1)], P=8, R=5, seed=1)
    with ForwardCalls(model) as calls:
        forward_logprobs(model, *batch)
    assert calls.shapes == [(4, 13)]
    assert_same_as_plain(model, batch)


def test_shared_prompt_pass_with_one_response_column(model):
    batch = make_batch(model.config.vocab_size, [(3, 3), (6, 2)], P=6, R=1, seed=2)
    with ForwardCalls(model) as calls:
        forward_logprobs(model, *batch)
    assert calls.shapes == [(2, 5), (5, 1)]  # the prompts but their last column, then that column
    assert_same_as_plain(model, batch, temperature=1.0)


def test_rows_differing_only_in_padding_are_not_merged(model):
    """Identical tokens with a different attention mask are different prompts."""
    input_ids, attention_mask, position_ids, response_mask = make_batch(
        model.config.vocab_size, [(4, 4)], P=6, R=4, seed=3
    )
    attention_mask[2:, 1] = 1  # rows 2-3 attend to one pad token more
    assert first_pass_with_mask(model, input_ids, attention_mask, response_mask) == (2, 5)


def first_pass_with_mask(model, input_ids, attention_mask, response_mask) -> tuple[int, ...]:
    """The shape of the first forward pass over a batch with this (edited) mask and positions counted from it,
    after checking its log-probs, entropies and gradients against one plain pass."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    batch = (input_ids, attention_mask, position_ids, response_mask)
    with ForwardCalls(model) as calls:
        forward_logprobs(model, *batch)
    assert_same_as_plain(model, batch)
    return calls.shapes[0]


def test_a_prefix_every_prompt_starts_with_runs_once(model):
    """A system prompt or worked example every prompt starts with: one pass of it, one of each prompt's own
    tokens (right-aligned after it), one of the responses; the same log-probs, entropies and gradients."""
    groups = [(38, 3), (41, 2), (35, 4), (41, 1), (37, 2)]  # 34 shared tokens, then 1-7 of each prompt's own
    batch = make_batch(model.config.vocab_size, groups, P=43, R=6, seed=5, prefix=34)
    with ForwardCalls(model) as calls:
        forward_logprobs(model, *batch)
    # the longest prompt (41) leaves 2 padding columns: each prompt's own tokens right-aligned to column 42,
    # the last one's pass that of the responses
    assert calls.shapes == [(1, 34), (5, 43 - 34 - 1), (12, 6)]
    assert_same_as_plain(model, batch)
    shorter = make_batch(model.config.vocab_size, groups, P=43, R=6, seed=5, prefix=SHARED_PREFIX_MIN - 1)
    with ForwardCalls(model) as calls:
        forward_logprobs(model, *shorter)
    assert calls.shapes == [(5, 42), (12, 6)]  # too short a prefix to pay for its pass
    # one sample per prompt (or shuffled rows): no two neighbours share a prompt, the prefix still runs once
    single = make_batch(model.config.vocab_size, [(38, 1), (41, 1), (35, 1)], P=41, R=5, seed=7, prefix=34)
    with ForwardCalls(model) as calls:
        forward_logprobs(model, *single)
    assert calls.shapes == [(1, 34), (3, 41 - 34 - 1), (3, 5)]
    assert_same_as_plain(model, single)


def windowed_model(model) -> torch.nn.Module:
    """The tiny model's architecture with every layer attending through a 16-column sliding window (eval mode)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **{
            **model.config.to_dict(),
            "use_sliding_window": True,
            "sliding_window": 16,
            "max_window_layers": 0,
            "layer_types": ["sliding_attention"] * model.config.num_hidden_layers,  # every layer slides
        }
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def test_no_prefix_pass_in_the_update_under_a_sliding_window(model):
    """The update's prefix layout has a masked gap, which a sliding window would count: prompts run whole."""
    windowed = windowed_model(model).train()
    batch = make_batch(model.config.vocab_size, [(38, 2), (40, 2)], P=40, R=4, seed=8, prefix=34)
    with ForwardCalls(windowed) as calls:
        forward_logprobs(windowed, *batch)
    assert calls.shapes[0] == (2, 39)
    assert_same_as_plain(windowed, batch)


def test_no_shared_prefix_where_a_prompt_is_not_one_run_from_position_0(model):
    """Prompts with masked columns inside them, or positions not counted from their first token, are run
    as they are (the prefix's cache layout would move their tokens)."""
    input_ids, attention_mask, position_ids, response_mask = make_batch(
        model.config.vocab_size, [(38, 2), (40, 2)], P=40, R=4, seed=6, prefix=34
    )
    attention_mask[:2, 10] = 0  # a hole in the first prompt
    assert first_pass_with_mask(model, input_ids, attention_mask, response_mask) == (2, 39)
    input_ids, attention_mask, position_ids, response_mask = make_batch(
        model.config.vocab_size, [(38, 2), (40, 2)], P=40, R=4, seed=6, prefix=34
    )
    with ForwardCalls(model) as calls:
        forward_logprobs(model, input_ids, attention_mask, position_ids + 3, response_mask)
    assert calls.shapes[0] == (2, 39)


def test_activation_checkpointing_falls_back_to_the_plain_pass(tiny_model_dir):
    m = load_causal_lm(str(tiny_model_dir))
    enable = getattr(m, "activation_checkpointing_enable", None) or m.gradient_checkpointing_enable
    enable()
    batch = make_batch(m.config.vocab_size, [(5, 3), (2, 2)], P=5, R=4, seed=4)
    m.train()
    with ForwardCalls(m) as calls:
        forward_logprobs(m, *batch)
    assert calls.shapes == [(5, 9)]
    assert_same_as_plain(m, batch)


# ------------------------------------------------------------------------------------- sampling

TEXTS = ["1+2=", "12+34=", "123+4567=", "ab"]


def grouped_prompts(tok, n: int) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS for _ in range(n)]


def draw(m, tok, prompts, temperature=1.0, seed=0, max_new=8, **kw):
    return sample(
        m,
        prompts,
        max_new_tokens=max_new,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        temperature=temperature,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )


def every_row_prefilled(m, tok, prompts, monkeypatch, **kw):
    """`sample` with the duplicate detection turned off: every row is prefilled on its own."""
    with monkeypatch.context() as mp:
        mp.setattr(hf_sampling, "run_starts", lambda ids, mask: torch.ones(len(ids), dtype=torch.bool))
        return draw(m, tok, prompts, **kw)


# With temperature 0.7, top-k 5 and top-p 0.9 the EOS-biased model ends at its first token about 95% of
# the time; seed 3 draws rows that go on (the generator's stream changed with the inverse-CDF sampler).
@pytest.mark.parametrize(
    "temperature,seed,top_k,top_p", [(1.0, 0, -1, 1.0), (0.7, 3, 5, 0.9), (1.0, 2, -1, 1.0)]
)
def test_deduplicated_prefill_samples_the_same_tokens(
    eos_model, tok, monkeypatch, temperature, seed, top_k, top_p
):
    prompts = grouped_prompts(tok, 4)
    kw = dict(temperature=temperature, seed=seed, top_k=top_k, top_p=top_p)
    with ForwardCalls(eos_model) as calls:
        out = draw(eos_model, tok, prompts, **kw)
    assert calls.shapes[0] == (len(TEXTS), 9)  # one prefill row per distinct prompt
    ref = every_row_prefilled(eos_model, tok, prompts, monkeypatch, **kw)
    for k in ("input_ids", "attention_mask", "response_mask", "truncated"):
        assert torch.equal(out[k], ref[k]), k
    torch.testing.assert_close(out["rollout_logprobs"], ref["rollout_logprobs"], atol=1e-5, rtol=0)
    # the samples of one prompt still differ from each other
    assert len({tuple(r) for r in out["input_ids"].tolist()}) > len(TEXTS)


def test_deduplicated_prefill_greedy_matches_interleaved_prompts(model, tok):
    """Flag-free: interleaved prompts have no neighbouring duplicates, so every row is prefilled."""
    model.eval()
    grouped = grouped_prompts(tok, 2)  # a a b b c c d d
    order = [0, 2, 4, 6, 1, 3, 5, 7]  # a b c d a b c d
    with ForwardCalls(model) as calls_a:
        a = draw(model, tok, grouped, temperature=0.0)
    with ForwardCalls(model) as calls_b:
        b = draw(model, tok, [grouped[i] for i in order], temperature=0.0)
    assert calls_a.shapes[0] == (4, 9) and calls_b.shapes[0] == (8, 9)
    for k in ("input_ids", "attention_mask", "response_mask"):
        assert torch.equal(a[k][order], b[k]), k
    torch.testing.assert_close(a["rollout_logprobs"][order], b["rollout_logprobs"], atol=1e-5, rtol=0)


def test_rollout_logprobs_agree_with_forward_logprobs(eos_model, tok):
    out = draw(eos_model, tok, grouped_prompts(tok, 4), temperature=0.7, seed=5)
    positions = (out["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logp, _ = forward_logprobs(
            eos_model,
            out["input_ids"],
            out["attention_mask"],
            positions,
            out["response_mask"],
            temperature=0.7,
        )
        ref, _ = plain_logprobs(
            eos_model,
            out["input_ids"],
            out["attention_mask"],
            positions,
            out["response_mask"],
            temperature=0.7,
        )
    mask = out["response_mask"]
    torch.testing.assert_close(out["rollout_logprobs"], logp * mask, atol=1e-4, rtol=0)
    torch.testing.assert_close(out["rollout_logprobs"], ref * mask, atol=1e-4, rtol=0)


# A few-shot prompt: every prompt starts with the same worked example (longer than SHARED_PREFIX_MIN
# tokens with the tiny model's character tokenizer), then its own question, of different lengths.
FEW_SHOT = "Example: 12+34=46, 5+5=10, 7+8=15. Now: "
QUESTIONS = ["1+2=", "12+34=", "123+4567=", "9="]


def few_shot_prompts(tok, n: int) -> list[list[int]]:
    return [tok(FEW_SHOT + q, add_special_tokens=False)["input_ids"] for q in QUESTIONS for _ in range(n)]


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (1.0, 4)])
def test_shared_prefix_is_prefilled_once_and_samples_the_same(model, tok, temperature, seed):
    model.eval()
    prompts = few_shot_prompts(tok, 3)
    prefix = len(tok(FEW_SHOT, add_special_tokens=False)["input_ids"])
    assert prefix >= SHARED_PREFIX_MIN
    longest = max(map(len, prompts))
    with ForwardCalls(model) as calls:
        out = draw(model, tok, prompts, temperature=temperature, seed=seed)
    # the prefix once, then each distinct prompt's own tokens (right-aligned to the longest one)
    assert calls.shapes[:2] == [(1, prefix), (len(QUESTIONS), longest - prefix)]
    with ForwardCalls(model) as calls:
        ref = draw(model, tok, prompts, temperature=temperature, seed=seed, share_prefix=False)
    assert calls.shapes[0] == (len(QUESTIONS), longest)
    for k in ("input_ids", "attention_mask", "response_mask", "truncated"):
        assert torch.equal(out[k], ref[k]), k
    torch.testing.assert_close(out["rollout_logprobs"], ref["rollout_logprobs"], atol=1e-5, rtol=0)
    assert out["response_mask"].sum() > len(prompts)  # rows went on past their first token


def test_shared_prefix_leaves_every_prompt_a_token_and_skips_short_prefixes(model, tok):
    model.eval()
    whole = tok(FEW_SHOT + "1+2=", add_special_tokens=False)["input_ids"]
    prompts = [whole, whole[:-2], whole[:-2]]  # one prompt is the other's beginning
    with ForwardCalls(model) as calls:
        out = draw(model, tok, prompts, temperature=0.0)
    assert calls.shapes[:2] == [(1, len(whole) - 3), (2, 3)]
    ref = draw(model, tok, prompts, temperature=0.0, share_prefix=False)
    assert torch.equal(out["input_ids"], ref["input_ids"])
    short = [tok("ab" + q, add_special_tokens=False)["input_ids"] for q in QUESTIONS]
    with ForwardCalls(model) as calls:
        draw(model, tok, short, temperature=0.0)
    assert calls.shapes[0] == (len(QUESTIONS), max(map(len, short)))  # 2 shared tokens: one plain prefill


def test_shared_prefix_through_the_models_own_forward(model, tok, monkeypatch):
    """Where the lean decoding step does not apply (a GPU, another architecture), decoding runs the model's
    forward over the cache with the masked gap: the same tokens."""
    model.eval()
    prompts = few_shot_prompts(tok, 2)
    ref = draw(model, tok, prompts, temperature=0.0, share_prefix=False)
    monkeypatch.setattr(hf_sampling, "lean_decoder", lambda *a, **k: None)
    with ForwardCalls(model) as calls:
        out = draw(model, tok, prompts, temperature=0.0)
    assert calls.shapes[0][0] == 1 and len(calls.shapes) > 3  # the prefix once, then the model's own steps
    for k in ("input_ids", "attention_mask", "response_mask"):
        assert torch.equal(out[k], ref[k]), k
    torch.testing.assert_close(out["rollout_logprobs"], ref["rollout_logprobs"], atol=1e-5, rtol=0)


def test_no_shared_prefix_under_a_sliding_window(model, tok):
    """A sliding window counts cache columns, so the masked gap would push the prefix out of it: prompts
    are prefilled whole, and sample what they would alone."""
    windowed = windowed_model(model)
    prompts = few_shot_prompts(tok, 1)
    with ForwardCalls(windowed) as calls:
        out = draw(windowed, tok, prompts, temperature=0.0)
    assert calls.shapes[0] == (len(QUESTIONS), max(map(len, prompts)))  # no prefix pass
    P = max(map(len, prompts))
    for i, p in enumerate(prompts):  # each row as if it were sampled alone
        alone = draw(windowed, tok, [p], temperature=0.0)
        n = int(alone["response_mask"].sum())
        assert (
            n > 0
            and out["input_ids"][i, P : P + n].tolist() == alone["input_ids"][0, len(p) : len(p) + n].tolist()
        )


def test_under_fsdp2_every_pass_feeds_the_loss(model):
    """FSDP2 gathers a layer's parameters for its backward when gradients reach the layer's output. A pass
    whose logits are dropped (the prefix pass, a prompt pass that stops before the prompts' last column)
    would leave its last layer's parameters freed for a backward that needs them (its keys and values):
    under FSDP2 the prompts run whole in one pass that gives the first logits, and the gradients are those
    of the plain model."""
    import copy

    from rlstack.workers import distributed

    batch = make_batch(model.config.vocab_size, [(38, 2), (40, 2)], P=40, R=4, seed=8, prefix=34)
    model.train()
    want = plain_logprobs(model, *batch, temperature=1.0)[0]
    want_grads = grads_of_token_mean(model, want, batch[3])
    sharded = copy.deepcopy(model)
    distributed.alone_group("cpu")
    try:
        distributed.shard_model(sharded, "cpu", offload=True)
        with ForwardCalls(sharded) as calls:
            logp, _ = forward_logprobs(sharded, *batch)
        # no prefix pass; the prompts to their end, then the responses
        assert calls.shapes == [(2, 40), (4, 3)]
        got_grads = grads_of_token_mean(sharded, logp, batch[3])
    finally:
        distributed.close_alone_group()
    torch.testing.assert_close(logp, want, atol=1e-5, rtol=0)
    for g, ref in zip(got_grads, want_grads):
        torch.testing.assert_close(distributed.local(g), ref, atol=1e-6, rtol=1e-4)
