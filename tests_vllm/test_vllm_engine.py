"""The vLLM engine on the tiny Qwen2: behaviour log-probs, stop strings, context limit, weight updates.

vLLM keeps process-wide state: one engine per test file (`make test-vllm` runs each file in its own process)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from engines import make_engine

from rlstack.models.loading import load_causal_lm, load_tokenizer
from rlstack.models.logprobs import forward_logprobs
from rlstack.models.vision import position_ids
from rlstack.rollout.engine import Request, RequestTooLong, SamplingSettings
from rlstack.rollout.vllm import VLLMEngine

TOLERANCE = 1e-4
"""|vLLM log-prob - policy log-prob| on the same tokens, float32 on both sides (measured: ~5e-7)."""


GLOBAL_RNGS: dict[str, dict] = {}
"""The trainer's global generators (`checkpoint.rng_state`) before and after the engine was built."""


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> VLLMEngine:
    from rlstack.checkpoint import rng_state

    GLOBAL_RNGS["before"] = rng_state()
    built = make_engine(tiny_dir, multimodal=False, max_model_len=256)
    GLOBAL_RNGS["after"] = rng_state()
    return built


def test_building_the_engine_leaves_the_trainers_generators_as_they_were(engine):
    """`LLM()` reseeds Python's, NumPy's and torch's global generators; the engine puts them back."""
    before, after = GLOBAL_RNGS["before"], GLOBAL_RNGS["after"]
    assert after.keys() == before.keys() and after["python"] == before["python"]
    assert all(np.array_equal(a, b) for a, b in zip(after["numpy"], before["numpy"]))
    assert torch.equal(after["torch"], before["torch"])


def prompts(tok, texts=("1+2=", "12+34=", "99+1=")) -> list[list[int]]:
    return [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for t in texts
    ]


def policy_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> list[float]:
    ids = torch.tensor([prompt + tokens])
    mask = torch.ones_like(ids)
    response = torch.zeros_like(ids)
    response[0, len(prompt) :] = 1
    with torch.no_grad():
        logp, _ = forward_logprobs(
            model, ids, mask, position_ids(model, ids, mask), response, temperature=temperature
        )
    return logp[0, len(prompt) :].tolist()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_match_the_policy_forward_pass(engine, tiny_dir, temperature):
    tok, model = load_tokenizer(str(tiny_dir)), load_causal_lm(str(tiny_dir)).eval()
    requests = [Request(p) for p in prompts(tok) for _ in range(4)]
    completions = engine.generate(requests, SamplingSettings(max_tokens=12, temperature=temperature))
    assert len(completions) == len(requests)
    assert len({tuple(c.token_ids) for c in completions}) > 3  # samples of one prompt differ
    worst = 0.0
    for r, c in zip(requests, completions):
        assert len(c.token_ids) == len(c.logprobs) >= 1
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "length":
            assert len(c.token_ids) == 12
        ref = policy_logprobs(model, r.prompt_ids, c.token_ids, temperature)
        worst = max(worst, max(abs(a - b) for a, b in zip(c.logprobs, ref)))
    assert worst < TOLERANCE, worst


def test_stop_strings_keep_the_completing_tokens_and_end_with_stop(engine, tiny_dir):
    tok = load_tokenizer(str(tiny_dir))
    requests = [Request(p) for p in prompts(tok) for _ in range(8)]
    stop = tuple("aeiou")
    completions = engine.generate(requests, SamplingSettings(max_tokens=24, stop=stop))
    ended = 0
    for c in completions:
        text = tok.decode(c.token_ids, skip_special_tokens=True)
        if c.finish_reason == "stop" and c.token_ids[-1] != tok.eos_token_id:
            assert text.endswith(stop)  # the stop string is part of the completion
            ended += 1
        assert not any(s in text[:-1] for s in stop)
    assert ended > 0


def test_a_request_longer_than_the_context_is_refused_with_its_row(engine, tiny_dir):
    with pytest.raises(RequestTooLong, match="request 1 has 300 prompt tokens.*at most 256"):
        engine.generate([Request([5] * 8), Request([5] * 300)], SamplingSettings(max_tokens=4))
    from rlstack.batch import Batch
    from rlstack.config import AgentConfig
    from rlstack.models.vision import VisionProcessor
    from rlstack.rollout.agent import AgentLoop

    tok = load_tokenizer(str(tiny_dir))
    loop = AgentLoop(engine, VisionProcessor(tok, None), None, AgentConfig(), 8, multimodal=False)
    rows = Batch({"prompt_ids": [[5] * 8, [5] * 300], "where": ["data.jsonl:1", "data.jsonl:2"]})
    with pytest.raises(RequestTooLong, match="data.jsonl:2, turn 1: request 1 has 300 prompt tokens"):
        loop.generate(rows, 1, 1.0)


def test_weights_pushed_from_the_policy_are_sampled_from_and_scored_with(engine, tiny_dir):
    tok, model = load_tokenizer(str(tiny_dir)), load_causal_lm(str(tiny_dir)).eval()
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    prompt = prompts(tok)[0]
    probe = prompt[:10]
    # the prefix cache holds this prompt's KV entries from the old weights
    before = engine.probe_logprobs(Request(prompt), probe)
    assert max(abs(a - b) for a, b in zip(before, policy_logprobs(model, prompt, probe))) < TOLERANCE
    engine.update_weights(((n, t.detach()) for n, t in changed.state_dict().items()), version=3)
    assert engine.weight_version == 3
    after = engine.probe_logprobs(Request(prompt), probe)
    assert max(abs(a - b) for a, b in zip(after, policy_logprobs(changed, prompt, probe))) < TOLERANCE
    assert max(abs(a - b) for a, b in zip(after, before)) > 1e-2  # it really moved
    completions = engine.generate([Request(prompt)] * 4, SamplingSettings(max_tokens=8))
    for c in completions:
        ref = policy_logprobs(changed, prompt, c.token_ids)
        assert max(abs(a - b) for a, b in zip(c.logprobs, ref)) < TOLERANCE
    # back to the original weights, for any test after this one
    engine.update_weights(((n, t.detach()) for n, t in model.state_dict().items()), version=4)
    assert max(abs(a - b) for a, b in zip(engine.probe_logprobs(Request(prompt), probe), before)) < TOLERANCE


def test_completions_end_at_the_tokens_the_hf_engine_ends_at(engine, tiny_dir):
    """The tokenizer's EOS and the generation config's (vLLM stops at both; the rollout loop reads the set)."""
    from rlstack.rollout.hf import HFEngine

    tok, model = load_tokenizer(str(tiny_dir)), load_causal_lm(str(tiny_dir)).eval()
    assert engine.eos_token_ids == HFEngine(model, tok, seed=0, multimodal=False).eos_token_ids
    assert tok.eos_token_id in engine.eos_token_ids
    completions = engine.generate([Request(p) for p in prompts(tok)] * 4, SamplingSettings(max_tokens=12))
    for c in completions:
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in engine.eos_token_ids)
