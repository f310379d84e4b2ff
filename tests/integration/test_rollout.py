"""HF sampling with the tiny model: masks, truncation, log-probs that match a forward pass, seeding."""

from __future__ import annotations

import pytest
import torch

from rlstack.batch import Batch
from rlstack.config import AgentConfig
from rlstack.models.loading import load_causal_lm
from rlstack.models.logprobs import forward_logprobs
from rlstack.models.vision import VisionProcessor, position_ids
from rlstack.rollout.agent import AgentLoop
from rlstack.rollout.engine import Request, RequestTooLong, SamplingSettings, mix_seed
from rlstack.rollout.hf import HFEngine, sample
from rlstack.rollout.hf_sampling import _inverse_cdf, _uniform

PROMPTS = ["1+2=", "12+34=", "123+4567=", "ab", "99+1=", "x"]
MAX_NEW = 8


def prompt_ids(tok, texts=PROMPTS) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def run(m, tok, temperature=1.0, seed=0, texts=PROMPTS, **kw) -> dict[str, torch.Tensor]:
    return sample(
        m,
        prompt_ids(tok, texts),
        max_new_tokens=MAX_NEW,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        temperature=temperature,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )


def rescored(m, out, temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logp, _ = forward_logprobs(
            m,
            out["input_ids"],
            out["attention_mask"],
            position_ids(m, out["input_ids"], out["attention_mask"]),
            out["response_mask"],
            temperature=temperature,
        )
    return logp * out["response_mask"]


# ------------------------------------------------------------------------------------------ masks


def mixed_outcome(m, tok) -> dict[str, torch.Tensor]:
    """A seeded sample where some rows stop at EOS (at different steps) and some run out of tokens."""
    for seed in range(20):
        out = run(m, tok, seed=seed)
        ends = {row.index(tok.eos_token_id) for row in out["input_ids"].tolist() if tok.eos_token_id in row}
        if out["truncated"].any() and len(ends) >= 2:
            return out
    raise AssertionError("no seed in 0..19 gave both truncated rows and rows ending at different steps")


def test_masks_prompt_padding_and_first_eos(eos_model, tok):
    out = mixed_outcome(eos_model, tok)
    prompts = prompt_ids(tok)
    B, P = len(prompts), max(len(p) for p in prompts)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    ids, attn, rmask = out["input_ids"], out["attention_mask"], out["response_mask"]
    R = ids.shape[1] - P
    assert 1 <= R <= MAX_NEW
    for k in ("input_ids", "attention_mask", "response_mask", "rollout_logprobs"):
        assert out[k].shape == (B, P + R), k
    assert out["truncated"].shape == (B,)

    ended = []
    for i, p in enumerate(prompts):
        # prompt: left-padded, attended only where it has tokens, never in the response mask
        assert ids[i, :P].tolist() == [pad] * (P - len(p)) + p
        assert attn[i, :P].tolist() == [0] * (P - len(p)) + [1] * len(p)
        assert rmask[i, :P].tolist() == [0] * P
        # response: 1 up to and including the first EOS, then 0 with pad ids
        resp = ids[i, P:].tolist()
        if eos in resp:
            first = resp.index(eos)
            expected = [1] * (first + 1) + [0] * (R - first - 1)
            assert resp[first + 1 :] == [pad] * (R - first - 1)
            ended.append(first)
        else:
            expected = [1] * R
            assert R == MAX_NEW
        assert rmask[i, P:].tolist() == expected, i
        assert attn[i, P:].tolist() == expected, i
        assert out["truncated"][i].item() == (eos not in resp)
    assert out["truncated"].any() and not out["truncated"].all()
    assert len(set(ended)) >= 2 and min(ended) < R - 1  # some rows are padded after their EOS
    lp = out["rollout_logprobs"]
    assert (lp[rmask == 0] == 0).all()
    assert (lp[rmask == 1] < 0).all()


def test_generation_stops_when_every_row_has_ended(tiny_model_dir, tok):
    """With a huge EOS bias, every row ends at its first token: one response column."""
    m = load_causal_lm(str(tiny_model_dir)).eval()
    head = torch.nn.Linear(m.config.hidden_size, m.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[tok.eos_token_id] = 100.0
    m.lm_head = head
    out = run(m, tok, texts=["1+2=", "ab"])
    assert out["input_ids"][:, -1].tolist() == [tok.eos_token_id] * 2
    assert out["response_mask"].tolist() == [[0, 0, 0, 0, 1], [0, 0, 0, 0, 1]]
    assert out["truncated"].tolist() == [False, False]


def test_truncated_when_no_eos(model, tok):
    out = run(model, tok, temperature=0.0)
    if (out["input_ids"][:, -MAX_NEW:] == tok.eos_token_id).any():
        pytest.fail("the untrained tiny model is expected not to emit EOS greedily within 8 tokens")
    assert out["truncated"].all()
    assert out["response_mask"][:, -MAX_NEW:].eq(1).all()


# -------------------------------------------------------------------------------------- log-probs


def test_rollout_logprobs_match_a_forward_pass_at_temperature_1(eos_model, tok):
    out = run(eos_model, tok, temperature=1.0, seed=2)
    torch.testing.assert_close(out["rollout_logprobs"], rescored(eos_model, out), atol=1e-4, rtol=0)


def test_rollout_logprobs_match_a_forward_pass_at_temperature_0_7(eos_model, tok):
    out = run(eos_model, tok, temperature=0.7, seed=3)
    torch.testing.assert_close(
        out["rollout_logprobs"], rescored(eos_model, out, temperature=0.7), atol=1e-4, rtol=0
    )
    # scored at the wrong temperature they differ: the comparison above can fail
    diff = (out["rollout_logprobs"] - rescored(eos_model, out, temperature=1.0)).abs().max()
    assert diff > 1e-2


def test_greedy_logprobs_are_at_temperature_1(model, tok):
    out = run(model, tok, temperature=0.0)
    torch.testing.assert_close(out["rollout_logprobs"], rescored(model, out), atol=1e-4, rtol=0)


def test_truncation_does_not_change_rollout_logprobs(eos_model, tok):
    """rollout_logprobs are under the temperature-scaled distribution before top-k / top-p."""
    out = run(eos_model, tok, temperature=1.0, seed=4, top_k=5, top_p=0.9)
    torch.testing.assert_close(out["rollout_logprobs"], rescored(eos_model, out), atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------- determinism


def test_greedy_is_deterministic_and_picks_the_argmax(model, tok):
    a = run(model, tok, temperature=0.0, seed=0)
    b = run(model, tok, temperature=0.0, seed=123)
    assert torch.equal(a["input_ids"], b["input_ids"])
    # each greedy token is the most likely one under a forward pass
    P = max(len(p) for p in prompt_ids(tok))
    with torch.no_grad():
        logits = model(
            input_ids=a["input_ids"],
            attention_mask=a["attention_mask"],
            position_ids=position_ids(model, a["input_ids"], a["attention_mask"]),
        ).logits
    assert torch.equal(logits[:, P - 1 : -1].argmax(-1), a["input_ids"][:, P:])


def test_seeded_generator_gives_the_same_samples(eos_model, tok):
    a = run(eos_model, tok, seed=7)
    b = run(eos_model, tok, seed=7)
    c = run(eos_model, tok, seed=8)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not torch.equal(a["input_ids"], c["input_ids"])


def test_a_seeded_request_samples_the_same_tokens_whatever_shares_its_batch(eos_model, tok):
    engine = HFEngine(eos_model, tok, seed=0, multimodal=False)
    ids = prompt_ids(tok, PROMPTS)
    settings = SamplingSettings(max_tokens=MAX_NEW, top_p=0.9)
    requests = [Request(p, seed=mix_seed(3, i, j)) for i, p in enumerate(ids) for j in range(4)]
    together = engine.generate(requests, settings)
    alone = [engine.generate([r], settings)[0] for r in requests[5:7]]
    reversed_ = engine.generate(requests[::-1], settings)[::-1]
    for a, b in zip(together[5:7], alone):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert [c.token_ids for c in reversed_] == [c.token_ids for c in together]
    # the seed, not the position, decides: the 4 samples of a prompt differ from each other
    assert len({tuple(c.token_ids) for c in together[:4]}) > 1
    with pytest.raises(ValueError, match="every request"):
        engine.generate([requests[0], Request(ids[0])], settings)


def test_seeded_draws_follow_the_distribution():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]]).expand(100_000, 4)
    u = _uniform(torch.arange(100_000, dtype=torch.long) * 7919, index=3)
    assert float(u.min()) >= 0 and float(u.max()) < 1
    freq = torch.bincount(_inverse_cdf(probs, u), minlength=4) / 100_000
    assert freq.tolist() == pytest.approx([0.1, 0.0, 0.6, 0.3], abs=0.006)
    assert freq[1] == 0  # a token of probability 0 is never drawn
    # another token index gives other numbers for the same seeds
    assert not torch.equal(u, _uniform(torch.arange(100_000, dtype=torch.long) * 7919, index=4))


def test_a_large_vocabulary_is_searched_in_blocks_with_the_same_draws():
    """Over more than `CDF_BLOCK` tokens the draw goes through the blocks' sums, then one block: the tokens of
    one float64 cumulative sum over the whole vocabulary, and never one of probability 0 (a cut-off top-k /
    top-p tail, a last block shorter than the others, all the mass in one token, numbers close to 1)."""
    from rlstack.rollout.hf_sampling import CDF_BLOCK

    g = torch.Generator().manual_seed(0)
    V = 3 * CDF_BLOCK + 77
    probs = torch.softmax(torch.randn(64, V, generator=g) * 4, -1)
    probs[:, ::3] = 0  # tokens a warper cut off
    probs[:8] = 0
    probs[:8, V - 5] = 1.0  # all the mass in one token of the short last block
    u = torch.cat([torch.rand(64 * 50, generator=g, dtype=torch.float64), torch.full((64,), 1 - 2**-53)])
    rows = probs.repeat(51, 1)
    cdf = rows.double().cumsum(-1)
    whole = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1).clamp(max=V - 1)
    drawn = _inverse_cdf(rows, u)
    # float32 block sums may move a draw at a boundary; at u = 1 - 2^-53 the whole sum's search runs off the
    # end (to a token of probability 0 where the last one is), the blocks' keeps to the last drawable token
    assert (drawn == whole)[:-64].float().mean() > 0.999
    assert bool((rows.gather(1, drawn[:, None]) > 0).all())
    assert set(drawn[:8].tolist()) == {V - 5}


def test_draws_from_the_engine_generator_follow_the_distribution(model, tok):
    """Without seeds a row's token comes from the generator's uniform numbers: the frequencies of the first
    token over many rows are the model's next-token probabilities."""
    prompt = tok.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)
    n = 20_000
    out = sample(
        model,
        [prompt] * n,
        1,
        tok.eos_token_id,
        tok.pad_token_id,
        1.0,
        generator=torch.Generator().manual_seed(0),
    )
    freq = torch.bincount(out["input_ids"][:, len(prompt)], minlength=len(probs)) / n
    assert (freq - probs).abs().max() < 0.004  # ~5 standard deviations at n = 20,000


def test_top_k_1_equals_greedy(model, tok):
    greedy = run(model, tok, temperature=0.0)
    top1 = run(model, tok, temperature=1.0, top_k=1, seed=5)
    assert torch.equal(top1["input_ids"], greedy["input_ids"])
    assert torch.equal(top1["response_mask"], greedy["response_mask"])


def test_sampling_differs_from_greedy(model, tok):
    greedy = run(model, tok, temperature=0.0)
    sampled = run(model, tok, temperature=1.0, seed=5)
    assert not torch.equal(sampled["input_ids"], greedy["input_ids"])


# ----------------------------------------------------------------------------------------- engine


def prompt_batch(tok, texts: list[str]) -> Batch:
    return Batch(
        {
            "prompt_ids": prompt_ids(tok, texts),
            "uid": [f"u{i}" for i in range(len(texts))],
            "ground_truth": [str(i) for i in range(len(texts))],
        }
    )


def rollout_loop(m, tok, max_response_length: int, seed: int) -> AgentLoop:
    """Single-turn generation as the rollout worker does it: the loop without tools over the HF engine."""
    engine = HFEngine(m, tok, seed=seed, multimodal=False)
    return AgentLoop(
        engine, VisionProcessor(tok, None), None, AgentConfig(), max_response_length, multimodal=False
    )


def test_loop_repeats_prompts_and_decodes_responses(eos_model, tok):
    loop = rollout_loop(eos_model, tok, MAX_NEW, seed=2)
    eos_model.train()
    out = loop.generate(prompt_batch(tok, ["1+2=", "123+4567="]), n=3, temperature=1.0)
    assert eos_model.training  # the mode is restored
    eos_model.eval()
    assert len(out) == 6
    assert out["uid"] == ["u0", "u0", "u0", "u1", "u1", "u1"]
    assert out["ground_truth"] == ["0", "0", "0", "1", "1", "1"]
    P = len(prompt_ids(tok, ["123+4567="])[0])
    assert out["input_ids"][0, :P].tolist() == [tok.pad_token_id] * 5 + prompt_ids(tok, ["1+2="])[0]
    texts = []
    for i in range(6):
        sampled = out["input_ids"][i][out["response_mask"][i].bool()].tolist()
        assert tok.eos_token_id not in sampled[:-1]
        texts.append(tok.decode([t for t in sampled if t not in tok.all_special_ids]))
    assert out["response_text"] == texts
    assert all(tok.eos_token not in t for t in out["response_text"])
    assert out["end_reason"] == ["over_length" if t else "done" for t in out["truncated"].tolist()]
    assert "done" in out["end_reason"]
    assert "num_turns" not in out and "agent_timing" not in out.meta  # no agent columns without tools
    # samples of the same prompt differ
    assert len(set(out["response_text"][:3])) > 1


def test_loop_greedy_samples_agree(model, tok):
    loop = rollout_loop(model, tok, 4, seed=0)
    whole = loop.generate(prompt_batch(tok, ["1+2=", "123+4567=", "ab"]), n=2, temperature=0.0)
    assert whole["uid"] == ["u0", "u0", "u1", "u1", "u2", "u2"]
    assert whole["response_text"][0] == whole["response_text"][1]  # greedy: both samples agree


def test_engine_completions_are_the_sampled_tokens_their_logprobs_and_why_they_ended(eos_model, tok):
    requests = [Request(p) for p in prompt_ids(tok)]
    for seed in range(20):
        engine = HFEngine(eos_model, tok, seed=seed, multimodal=False)
        completions = engine.generate(requests, SamplingSettings(max_tokens=MAX_NEW))
        reasons = {c.finish_reason for c in completions}
        if reasons == {"stop", "length"}:
            break
    else:
        raise AssertionError("no seed in 0..19 gave completions ending both ways")
    out = run(eos_model, tok, seed=seed)  # the same draws through the tensor-level sampler
    P = max(len(p) for p in prompt_ids(tok))
    for b, c in enumerate(completions):
        n = int(out["response_mask"][b].sum())
        assert c.token_ids == out["input_ids"][b, P : P + n].tolist()
        assert c.logprobs == out["rollout_logprobs"][b, P : P + n].tolist()
        assert len(c.token_ids) == len(c.logprobs)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == tok.eos_token_id
        else:
            assert len(c.token_ids) == MAX_NEW and tok.eos_token_id not in c.token_ids


def test_a_request_past_the_model_context_is_refused_with_its_row_and_completions_stop_at_it(model, tok):
    engine = HFEngine(model, tok, seed=0, multimodal=False)
    context = model.config.max_position_embeddings
    assert engine.context == context == 512
    short, long = prompt_ids(tok)[0], prompt_ids(tok)[1] * 200
    with pytest.raises(
        RequestTooLong, match=f"request 1 has {len(long)} prompt tokens.*at most 512 positions"
    ) as e:
        engine.generate([Request(short), Request(long)], SamplingSettings(max_tokens=4))
    assert e.value.index == 1
    near = (short * context)[: context - 3]  # room for 3 tokens
    (c,) = engine.generate([Request(near)], SamplingSettings(max_tokens=8, temperature=0.0))
    assert len(c.token_ids) <= 3
    if tok.eos_token_id not in c.token_ids:
        assert len(c.token_ids) == 3 and c.finish_reason == "length"


def test_the_context_is_checked_only_where_rope_is_unscaled():
    from types import SimpleNamespace as Config

    from rlstack.rollout.hf import context_length

    assert (
        context_length(Config(max_position_embeddings=512, rope_parameters={"rope_type": "default"})) == 512
    )
    assert context_length(Config(max_position_embeddings=512, rope_scaling=None)) == 512
    assert (
        context_length(
            Config(max_position_embeddings=512, rope_parameters={"rope_type": "yarn", "factor": 4})
        )
        is None
    )
    per_layer_type = {
        "full_attention": {"rope_type": "linear"},
        "sliding_attention": {"rope_type": "default"},
    }
    assert context_length(Config(max_position_embeddings=512, rope_parameters=per_layer_type)) is None
    assert context_length(Config()) is None


def test_every_end_token_of_the_generation_config_ends_a_completion(tiny_model_dir, tok):
    """Qwen's chat models end at `<|im_end|>` or `<|endoftext|>` (their generation config lists both, the
    tokenizer names one): here every token is one, so each completion is one token, ended, and done."""
    m = load_causal_lm(str(tiny_model_dir)).eval()
    m.generation_config.eos_token_id = list(range(m.config.vocab_size))
    engine = HFEngine(m, tok, seed=0, multimodal=False)
    assert engine.eos_token_ids == frozenset(range(m.config.vocab_size))
    completions = engine.generate([Request(p) for p in prompt_ids(tok)], SamplingSettings(max_tokens=MAX_NEW))
    assert all(len(c.token_ids) == 1 and c.finish_reason == "stop" for c in completions)
    assert any(c.token_ids[0] != tok.eos_token_id for c in completions)
    loop = AgentLoop(engine, VisionProcessor(tok, None), None, AgentConfig(), MAX_NEW, multimodal=False)
    out = loop.generate(prompt_batch(tok, ["1+2=", "ab"]), n=4, temperature=1.0)
    assert out["end_reason"] == ["done"] * 8 and not out["truncated"].any()
    assert (out["response_mask"].sum(-1) == 1).all()


def test_engine_shares_the_policy_weights_and_only_records_versions(model, tok):
    engine = HFEngine(model, tok, seed=0, multimodal=False)
    assert engine.capabilities.shares_policy_weights and not engine.capabilities.sleep
    engine.update_weights(None, 7)
    assert engine.weight_version == 7
    with pytest.raises(ValueError, match="takes no weights"):
        engine.update_weights(iter([("lm_head.weight", torch.zeros(1))]), 8)
    engine.sleep()
    engine.wake_up()  # no-ops: nothing to free
    assert engine.state_dict()["weight_version"] == 7


def test_one_model_call_per_token_and_ended_rows_keep_attending(eos_model, tok, monkeypatch):
    """Decoding through the module's `forward` (models the lean step does not take, see
    test_lean_decoding.py for the lean step's own count): the prefill gives the first token and each
    later token costs one decode call, none after the last; rows that ended keep 1 in the attention mask
    (their padding is masked out of the result)."""
    import rlstack.rollout.hf_sampling as hf_sampling

    monkeypatch.setattr(hf_sampling, "lean_decoder", lambda model, positions: None)
    masks = []

    def record(module, args, kwargs):
        masks.append(kwargs["attention_mask"].clone())

    handle = eos_model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        out = mixed_outcome(eos_model, tok)
    finally:
        handle.remove()
    R = out["input_ids"].shape[1] - max(len(p) for p in prompt_ids(tok))
    assert R == MAX_NEW  # a row ran out of tokens
    last = masks[-R:]  # mixed_outcome may have tried several seeds: the last sample's calls
    assert last[0].shape[1] == max(len(p) for p in prompt_ids(tok))  # the prefill
    assert [m.shape[1] for m in last[1:]] == [last[0].shape[1] + k for k in range(1, R)]
    P = last[0].shape[1]
    assert (last[-1][:, P:] == 1).all()  # ended rows included
    assert not out["truncated"].all()


def test_engine_generator_state_round_trip(eos_model, tok):
    loop = rollout_loop(eos_model, tok, MAX_NEW, seed=11)
    batch = prompt_batch(tok, ["1+2=", "ab"])
    loop.generate(batch, n=2, temperature=1.0)
    state = loop.engine.state_dict()
    first = loop.generate(batch, n=2, temperature=1.0)
    loop.engine.load_state_dict(state)
    again = loop.generate(batch, n=2, temperature=1.0)
    assert first["response_text"] == again["response_text"]
    assert torch.equal(first["input_ids"], again["input_ids"])


def test_diverged_weights_raise_a_clear_error_instead_of_sampling_garbage(tiny_model_dir, tok):
    from rlstack.errors import TrainingDiverged

    broken = load_causal_lm(str(tiny_model_dir))
    with torch.no_grad():
        broken.model.norm.weight.fill_(float("nan"))
    with pytest.raises(TrainingDiverged, match="non-finite logits"):
        run(broken, tok)


def test_weights_sent_during_a_generation_land_between_two_decoding_steps(tiny_model_dir, tok):
    """In-flight weight updates: `update_weights` from another thread returns while the generation runs;
    the tokens before the update are the old weights' samples, those after come from the new weights
    reading the KV cache the old ones wrote (what a reference with that cache computes)."""
    import threading

    old = load_causal_lm(str(tiny_model_dir)).eval()
    new = load_causal_lm(str(tiny_model_dir)).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in new.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    new_weights = {k: v.clone() for k, v in new.state_dict().items()}
    request = Request(prompt_ids(tok, ["12+34="])[0], seed=5)
    settings = SamplingSettings(max_tokens=MAX_NEW)

    reference = HFEngine(
        load_causal_lm(str(tiny_model_dir)).eval(), tok, 0, False, shares_policy_weights=False
    )
    before = reference.generate([request], settings)[0]  # the old weights throughout

    engine = HFEngine(load_causal_lm(str(tiny_model_dir)).eval(), tok, 0, False, shares_policy_weights=False)
    assert engine.capabilities.in_flight_updates
    landing, calls, returned = 3, [0], []
    between = engine._between_steps

    def third_step_gets_new_weights():
        calls[0] += 1
        if calls[0] == landing:  # the trainer's thread sends weights while this generation waits here
            sender = threading.Thread(
                target=lambda: returned.append(engine.update_weights(iter(new_weights.items()), 1))
            )
            sender.start()
            sender.join(timeout=30)
            assert returned, "update_weights waited for the generation in progress"
            assert engine.weight_version == 0  # staged, not landed: this step's forward is next
        between()

    engine._between_steps = third_step_gets_new_weights
    got = engine.generate([request], settings)[0]
    assert engine.weight_version == 1 and got.weight_version == 1 and before.weight_version == 0
    assert len(got.token_ids) == MAX_NEW
    # tokens 0..2 were sampled before the update's step: the old weights' (token 0 from the prefill)
    assert got.token_ids[:landing] == before.token_ids[:landing]
    assert got.logprobs[:landing] == pytest.approx(before.logprobs[:landing], abs=1e-6)
    # token 3 on: the new weights read the old weights' cache of the prompt and tokens 0..1
    ids = torch.tensor([request.prompt_ids + got.token_ids])
    P = len(request.prompt_ids)
    with torch.no_grad():
        cache = old(input_ids=ids[:, : P + landing - 1], use_cache=True).past_key_values
        logits = new(input_ids=ids[:, P + landing - 1 : -1], past_key_values=cache, use_cache=True).logits
    want = torch.log_softmax(logits[0].float(), -1).gather(-1, ids[0, P + landing :, None]).squeeze(-1)
    assert got.logprobs[landing:] == pytest.approx(want.tolist(), abs=1e-5)
    assert got.logprobs[landing:] != pytest.approx(before.logprobs[landing:], abs=1e-3)
    # the engine now holds the new weights outright
    probe = request.prompt_ids, got.token_ids
    assert engine.probe_logprobs(Request(probe[0]), probe[1]) == pytest.approx(
        HFEngine(new, tok, 0, False).probe_logprobs(Request(probe[0]), probe[1]), abs=1e-5
    )


def test_an_update_between_generations_loads_at_once(tiny_model_dir, tok):
    engine = HFEngine(load_causal_lm(str(tiny_model_dir)).eval(), tok, 0, False, shares_policy_weights=False)
    zeros = [(k, torch.zeros_like(v)) for k, v in engine.model.state_dict().items()]
    engine.update_weights(iter(zeros), 4)
    assert engine.weight_version == 4 and engine._staged is None
    assert all(bool((v == 0).all()) for v in engine.model.state_dict().values())
    with pytest.raises(KeyError, match="not a weight of the engine's model"):
        engine.update_weights(iter([("no.such.weight", torch.zeros(1))]), 5)
    assert not HFEngine(engine.model, tok, 0, False).capabilities.in_flight_updates  # shares the policy's


def test_a_completion_names_the_weights_that_sampled_its_last_token(eos_model, tok):
    """With an update landing before decoding step 3, completions that ended before it keep the old
    version and longer ones carry the new one."""
    import copy

    engine = HFEngine(copy.deepcopy(eos_model), tok, 0, False, shares_policy_weights=False)
    new_weights = [(k, v.clone()) for k, v in eos_model.state_dict().items()]  # the same values, version 1
    calls = [0]
    between = engine._between_steps

    def lands_at_step_3():
        calls[0] += 1
        if calls[0] == 3:
            engine._staged = (new_weights, 1)  # what update_weights stages during a generation
        return between()

    engine._between_steps = lands_at_step_3
    requests = [Request(ids, seed=s) for s, ids in enumerate(prompt_ids(tok) * 4)]
    out = engine.generate(requests, SamplingSettings(max_tokens=MAX_NEW))
    versions = {len(c.token_ids): c.weight_version for c in out}
    assert any(n <= 3 for n in versions) and any(n > 3 for n in versions)  # both kinds occur
    for c in out:  # tokens from index 3 on come from the weights that landed before step 3's forward
        assert c.weight_version == (1 if len(c.token_ids) > 3 else 0), len(c.token_ids)


def test_ignore_eos_samples_on_past_end_of_sequence_to_max_tokens(eos_model, tok):
    """`worker.rollout.ignore_eos` (benchmarks that need a fixed amount of work): an EOS no longer ends a
    completion; with per-request seeds every completion is the one that ended at EOS, continued."""
    requests = [Request(p, seed=mix_seed(5, i, 0)) for i, p in enumerate(prompt_ids(tok))]
    engine = HFEngine(eos_model, tok, seed=0, multimodal=False)
    ended = engine.generate(requests, SamplingSettings(max_tokens=MAX_NEW))
    assert any(c.finish_reason == "stop" for c in ended)  # the EOS bias ends some completions early
    full = engine.generate(requests, SamplingSettings(max_tokens=MAX_NEW, ignore_eos=True))
    assert [len(c.token_ids) for c in full] == [MAX_NEW] * len(requests)
    assert {c.finish_reason for c in full} == {"length"}
    assert any(tok.eos_token_id in c.token_ids[:-1] for c in full)  # EOS sampled, and sampling went on
    for a, b in zip(ended, full):
        assert b.token_ids[: len(a.token_ids)] == a.token_ids

    loop = AgentLoop(
        engine, VisionProcessor(tok, None), None, AgentConfig(), MAX_NEW, multimodal=False, ignore_eos=True
    )
    out = loop.generate(prompt_batch(tok, ["1+2=", "123+4567="]), n=4, temperature=1.0)
    assert out["response_mask"].sum(-1).tolist() == [MAX_NEW] * 8
