"""The vLLM engine with a tiny Qwen2.5-VL: image prompts and multi-turn trajectories with the Python
tool (crops of the image come back as images), their masks, and behaviour log-probs that match the
policy's forward pass."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from engines import make_engine
from visual_agent import build_tool_vlm, visual_batch

from rlstack.batch import Batch
from rlstack.config import AgentConfig
from rlstack.models.loading import load_causal_lm, load_processor
from rlstack.models.logprobs import response_logits
from rlstack.models.vision import position_ids, vision_token_ids
from rlstack.rollout.agent import AgentLoop
from rlstack.rollout.vllm import VLLMEngine
from rlstack.tools.registry import build_toolset

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tool_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2.5-VL with text head size 32 (the smallest vLLM's CPU attention takes), warm-started
    to answer with a Python cell that crops the image."""
    from rlstack.models.loading import write_model_dir

    folder = tmp_path_factory.mktemp("tool_vlm")
    base = write_model_dir(folder / "base", vision=True, hidden_size=64, num_heads=2, num_kv_heads=1)
    return build_tool_vlm(folder, str(base))


@pytest.fixture(scope="module")
def engine(tool_vlm: Path) -> VLLMEngine:
    return make_engine(tool_vlm, multimodal=True, max_model_len=512, image_limit=4)


def max_logprob_gap(model, out: Batch) -> float:
    """Largest gap between the engine's behaviour log-probs and the policy's, over the distribution the
    engine samples from: the policy's without the image / video / vision markers, which are never sampled
    (vLLM's logit bias; for the tiny model they hold up to a few percent of the mass)."""
    grids = out["image_grid_thw"]
    banned = vision_token_ids(
        lambda key: getattr(model.config, key, None), model.config.text_config.vocab_size
    )
    with torch.no_grad():
        scored = response_logits(
            model,
            out["input_ids"],
            out["attention_mask"],
            position_ids(model, out["input_ids"], out["attention_mask"], grids),
            out["response_mask"],
            pixel_values=out["pixel_values"],
            image_grid_thw=grids,
        )
        logits = scored.logits.float().index_fill(-1, torch.tensor(banned), float("-inf"))
        logp = scored.to_full(logits.log_softmax(-1).gather(-1, scored.labels[..., None]).squeeze(-1))
    mask = out["response_mask"].bool()
    return float((logp - out["rollout_logprobs"]).abs()[mask].max())


def test_image_prompts_sample_with_logprobs_that_match_the_policy(engine, tool_vlm):
    processor, model = load_processor(str(tool_vlm)), load_causal_lm(str(tool_vlm)).eval()
    loop = AgentLoop(engine, processor, None, AgentConfig(), 24, multimodal=True)
    out = loop.generate(visual_batch(processor, 3), 2, 1.0)
    assert len(out) == 6 and out["response_mask"].sum() > 0
    assert max_logprob_gap(model, out) < TOLERANCE


def test_multi_turn_python_tool_trajectories_with_images_on_vllm(engine, tool_vlm):
    processor, model = load_processor(str(tool_vlm)), load_causal_lm(str(tool_vlm)).eval()
    cfg = AgentConfig(tools=[{"name": "python", "import_path": "builtin:python"}], max_turns=3, max_images=4)
    loop = AgentLoop(engine, processor, build_toolset(cfg.tools), cfg, 160, multimodal=True)
    out = loop.generate(visual_batch(processor, 4), 2, 1.0)
    images = torch.tensor([len(g) for g in out["image_grid_thw"]])
    multi = (images >= 2) & (out["num_turns"] >= 2)
    assert multi.any(), (out["end_reason"], out["response_text"])  # a crop came back and was read
    assert out["tool_calls"].sum() > 0
    pad = processor.image_token_id
    assert (out["response_mask"] * (out["input_ids"] == pad)).sum() == 0  # image tokens are never trained on
    observed = (out["response_mask"] == 0) & (out["attention_mask"] == 1)
    observed[:, : max(len(p) for p in out["prompt_ids"])] = False
    assert observed.any()  # observations sit inside the responses, masked out
    assert (out["rollout_logprobs"][out["response_mask"] == 0] == 0).all()
    assert max_logprob_gap(model, out) < TOLERANCE


def test_image_and_vision_markers_are_never_sampled(engine, tool_vlm):
    """With the final norm zeroed every logit is 0: each step would sample one of the four image / video /
    vision markers with probability 4/V. They are banned, as in the HF engine, and the log-probs are those
    of the uniform distribution over the other tokens."""
    processor, model = load_processor(str(tool_vlm)), load_causal_lm(str(tool_vlm)).eval()
    banned = set(
        vision_token_ids(lambda key: getattr(model.config, key, None), model.config.text_config.vocab_size)
    )
    vocab = model.config.text_config.vocab_size
    assert len(banned) == 4 and 4 / vocab > 0.02, (banned, vocab)
    flat = copy.deepcopy(model)
    norm = next(p for n, p in flat.named_parameters() if n.endswith("language_model.norm.weight"))
    with torch.no_grad():
        norm.zero_()
    engine.update_weights(((n, t.detach()) for n, t in flat.state_dict().items()), version=5)
    try:
        loop = AgentLoop(engine, processor, None, AgentConfig(), 24, multimodal=True)
        out = loop.generate(visual_batch(processor, 3), 4, 1.0)
        sampled = out["input_ids"][out["response_mask"].bool()]
        assert len(sampled) >= 200  # ~5 markers expected at 4/V per token: a ban that leaked would show
        assert not set(sampled.tolist()) & banned
        logp = out["rollout_logprobs"][out["response_mask"].bool()]
        assert torch.allclose(logp, torch.full_like(logp, -math.log(vocab - len(banned))), atol=1e-4)
    finally:  # the warm-started weights back, for any test after this one
        engine.update_weights(((n, t.detach()) for n, t in model.state_dict().items()), version=6)
