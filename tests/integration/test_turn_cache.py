"""A multi-turn trajectory's KV cache kept between the HF engine's calls: the next turn prefills only its new
tokens (the last sampled token and the tool's reply) and samples what a whole prefill would."""

from __future__ import annotations

import pytest
import torch
from test_prefix_sharing import FEW_SHOT, QUESTIONS, ForwardCalls

import rlstack.rollout.hf_sampling as hf_sampling
from rlstack.rollout.engine import Request, SamplingSettings, mix_seed
from rlstack.rollout.hf import HFEngine, sample

REPLIES = ["=7\n", "ok", "the value is 12345\n", "!"]
"""Observations of different lengths, so that rows continue with different numbers of new tokens."""


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def first_turn(tok) -> list[list[int]]:
    """Two samples of each few-shot question (the second turn's rows then differ in their first responses)."""
    return [ids(tok, FEW_SHOT + q) for q in QUESTIONS for _ in range(2)]


def draw(model, tok, prompts, seeds, **kw):
    return sample(
        model,
        prompts,
        max_new_tokens=6,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        temperature=1.0,
        seeds=torch.tensor(seeds),
        **kw,
    )


def responses(out, prompts) -> list[list[int]]:
    P = max(map(len, prompts))
    return [row[P:][:n] for row, n in zip(out["input_ids"].tolist(), out["response_mask"].sum(-1).tolist())]


def second_turn(tok, prompts, out) -> list[list[int]]:
    return [
        p + r + ids(tok, REPLIES[i % len(REPLIES)])
        for i, (p, r) in enumerate(zip(prompts, responses(out, prompts)))
    ]


@pytest.mark.parametrize("lean", [True, False])
def test_a_continued_turn_prefills_only_its_new_tokens_and_samples_what_a_whole_prefill_does(
    model, tok, monkeypatch, lean
):
    model.eval()
    if not lean:  # decoding through the model's own forward (a GPU, another architecture)
        monkeypatch.setattr(hf_sampling, "lean_decoder", lambda *a, **k: None)
    prompts = first_turn(tok)
    seeds = [mix_seed(1, i) for i in range(len(prompts))]
    one = draw(model, tok, prompts, seeds, keep=[True] * len(prompts))
    kept = one["kept"]
    assert all(
        len(k.token_ids) == len(p) + len(r) - 1 for k, p, r in zip(kept, prompts, responses(one, prompts))
    )
    nexts = second_turn(tok, prompts, one)
    new = [len(p) - len(k.token_ids) for p, k in zip(nexts, kept)]
    assert len(set(new)) > 1  # rows continue with different numbers of new tokens

    seeds2 = [mix_seed(2, i) for i in range(len(prompts))]
    with ForwardCalls(model) as calls:
        continued = draw(model, tok, nexts, seeds2, kept=kept, keep=[True] * len(prompts))
    assert calls.shapes[0] == (
        len(prompts),
        max(new),
    )  # each row's new tokens, right-aligned: no whole prompt
    assert int(continued["prefilled"]) == sum(new)
    assert int(continued["reused"]) == sum(len(p) - n for p, n in zip(nexts, new))
    whole = draw(model, tok, nexts, seeds2, share_prefix=False)
    for k in ("input_ids", "attention_mask", "response_mask", "truncated"):
        assert torch.equal(continued[k], whole[k]), k
    torch.testing.assert_close(continued["rollout_logprobs"], whole["rollout_logprobs"], atol=1e-5, rtol=0)
    assert continued["response_mask"].sum() > len(prompts)  # rows went on past their first token

    # A third turn continues the second's kept caches (which were built from the first's) just as well.
    thirds = second_turn(tok, nexts, continued)
    seeds3 = [mix_seed(3, i) for i in range(len(prompts))]
    third = draw(model, tok, thirds, seeds3, kept=continued["kept"])
    ref = draw(model, tok, thirds, seeds3, share_prefix=False)
    assert torch.equal(third["input_ids"], ref["input_ids"])
    torch.testing.assert_close(third["rollout_logprobs"], ref["rollout_logprobs"], atol=1e-5, rtol=0)


def test_a_kept_cache_is_used_once_and_only_by_a_prompt_that_continues_it(model, tok):
    model.eval()
    prompts = first_turn(tok)[:2]
    seeds = [11, 12]
    kept = draw(model, tok, prompts, seeds, keep=[True, False])["kept"]
    assert kept[1] is None  # not asked for
    nexts = second_turn(tok, prompts, draw(model, tok, prompts, seeds))
    other = ids(tok, FEW_SHOT + "5+5=")  # does not start with the kept tokens
    out = draw(model, tok, [nexts[0], other], [1, 2], kept=[kept[0], kept[0]])
    assert int(out["reused"]) == len(kept[0].token_ids)  # row 0 only
    assert all(k is None for k in kept[0].keys)  # emptied as it was copied: its memory went back
    again = draw(model, tok, [nexts[0]], [1], kept=[kept[0]])
    assert int(again["reused"]) == 0 and int(again["prefilled"]) == len(nexts[0])

    # One kept cache handed to two rows that both continue it: the first reads it, the second is prefilled.
    kept = draw(model, tok, prompts[:1], seeds[:1], keep=[True])["kept"]
    twice = draw(model, tok, [nexts[0], nexts[0]], [1, 1], kept=[kept[0], kept[0]])
    assert int(twice["reused"]) == len(kept[0].token_ids)
    assert torch.equal(twice["input_ids"][0], twice["input_ids"][1])  # the same seed: the same tokens
    torch.testing.assert_close(twice["rollout_logprobs"][0], twice["rollout_logprobs"][1], atol=1e-5, rtol=0)


def test_the_engine_keeps_caches_under_the_weights_that_made_them(model, tok):
    model.eval()
    engine = HFEngine(model, tok, seed=0, multimodal=False)
    prompts = first_turn(tok)
    settings = SamplingSettings(max_tokens=6)
    firsts = engine.generate([Request(p, seed=i, keep=True) for i, p in enumerate(prompts)], settings)
    assert all(c.cache is not None for c in firsts)
    nexts = [
        Request(p + c.token_ids + ids(tok, "ok"), seed=50 + i, cache=c.cache)
        for i, (p, c) in enumerate(zip(prompts, firsts))
    ]
    before = engine.prefilled_tokens
    continued = engine.generate(nexts, settings)
    assert engine.prefilled_tokens - before == len(firsts) * (1 + len(ids(tok, "ok")))  # the last token, "ok"
    assert all(c.cache is None for c in continued)  # not asked to keep
    plain = HFEngine(model, tok, seed=0, multimodal=False, share_prefix=False)
    reference = plain.generate([Request(r.prompt_ids, seed=r.seed) for r in nexts], settings)
    assert [c.token_ids for c in continued] == [c.token_ids for c in reference]
    assert plain.reused_tokens == 0 and all(
        c.cache is None for c in plain.generate([Request(prompts[0], keep=True)], settings)
    )  # enable_prefix_caching=false keeps nothing

    # After a weight update (a new version) a kept cache is stale: the next turn is prefilled whole.
    firsts = engine.generate([Request(p, seed=i, keep=True) for i, p in enumerate(prompts)], settings)
    engine.update_weights(None, engine.weight_version + 1)
    reused = engine.reused_tokens
    engine.generate(
        [Request(p + c.token_ids + [5], cache=c.cache) for p, c in zip(prompts, firsts)], settings
    )
    assert engine.reused_tokens == reused


@pytest.mark.parametrize("seeded", [True, False])
def test_ended_rows_leave_the_decoding_batch_and_keep_their_caches(eos_model, tok, monkeypatch, seeded):
    """Once half the rows being decoded have ended they leave the batch: the same tokens and log-probs as
    decoding every row to the end (the model's own forward, which keeps them), and the kept caches of the
    rows that left early continue as well as the others'. Unseeded, the generator still draws a number for
    every row at every step: the same stream."""
    from rlstack.models.decoding import LeanDecoder

    prompts = [ids(tok, FEW_SHOT + q) for q in QUESTIONS for _ in range(4)]
    seeds = [mix_seed(7, i) for i in range(len(prompts))]

    def run(**kw):
        draws = {"seeds": torch.tensor(seeds)} if seeded else {"generator": torch.Generator().manual_seed(3)}
        return sample(eos_model, prompts, 24, tok.eos_token_id, tok.pad_token_id, 1.0, **draws, **kw)

    sizes = []
    step = LeanDecoder.step
    monkeypatch.setattr(LeanDecoder, "step", lambda self, t, *a: sizes.append(len(t)) or step(self, t, *a))
    out = run(keep=[True] * len(prompts))
    lengths = out["response_mask"].sum(-1)
    assert sizes[0] == len(prompts) and min(sizes) < len(prompts) // 2  # the batch shrank, more than once
    assert len(sizes) == int(lengths.max()) - 1  # and decoded until the longest row ended
    with monkeypatch.context() as m:
        m.setattr(hf_sampling, "lean_decoder", lambda *a, **k: None)
        whole = run()
    for k in ("input_ids", "response_mask", "truncated"):
        assert torch.equal(out[k], whole[k]), k
    torch.testing.assert_close(out["rollout_logprobs"], whole["rollout_logprobs"], atol=1e-5, rtol=0)

    nexts = second_turn(tok, prompts, out)
    seeds2 = [mix_seed(8, i) for i in range(len(prompts))]
    continued = draw(eos_model, tok, nexts, seeds2, kept=out["kept"])
    assert int(continued["reused"]) == sum(len(p) + int(n) - 1 for p, n in zip(prompts, lengths))
    ref = draw(eos_model, tok, nexts, seeds2, share_prefix=False)
    assert torch.equal(continued["input_ids"], ref["input_ids"])
    torch.testing.assert_close(continued["rollout_logprobs"], ref["rollout_logprobs"], atol=1e-5, rtol=0)
