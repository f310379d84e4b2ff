"""The vLLM engine with a tiny Qwen2.5-VL: image prompts and multi-turn trajectories with the Python
tool (crops of the image come back as images), their masks, and behaviour log-probs that match the
policy's forward pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlstack.batch import Batch
from rlstack.config import AgentConfig, load_config
from rlstack.models.loading import load_causal_lm, load_processor
from rlstack.models.logprobs import forward_logprobs
from rlstack.models.vision import position_ids
from rlstack.rollout.agent import AgentLoop
from rlstack.rollout.vllm import VLLMEngine
from rlstack.tools.registry import build_toolset

MIN_PIXELS, MAX_PIXELS = 3136, 12544
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tool_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2.5-VL (text head size 32, which vLLM's CPU attention takes) after 60 SFT steps on
    rows whose answer is a Python cell returning a crop of the image."""
    from rlstack.data.visual import row
    from rlstack.models.loading import write_model_dir
    from rlstack.sft import run_sft

    tmp = tmp_path_factory.mktemp("tool_vlm")
    base = write_model_dir(tmp / "base", vision=True, hidden_size=64, num_heads=2, num_kv_heads=1)
    lines = []
    for i in range(64):
        r = row("train", i)
        path = tmp / f"img{i}.png"
        r["images"][0].save(path)
        call = "<code>```python\nimage_1.crop((0, 0, 112, 112))\n```</code>"
        lines.append(json.dumps({"problem": r["problem"], "answer": call, "images": [path.name]}))
    (tmp / "sft.jsonl").write_text("\n".join(lines) + "\n")
    cfg = load_config(
        [
            f"worker.actor.model.model_path={base}",
            f"trainer.output_dir={tmp}",
            f"data.train_files={tmp / 'sft.jsonl'}",
            "data.val_files=",
            "data.max_prompt_length=256",
            "data.max_response_length=64",
            f"data.min_pixels={MIN_PIXELS}",
            f"data.max_pixels={MAX_PIXELS}",
            "data.rollout_batch_size=8",
            "worker.actor.global_batch_size=8",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.actor.optim.lr=3e-3",
            "trainer.max_steps=60",
            "trainer.total_epochs=100",
            "trainer.logger=[file]",
        ]
    )
    return run_sft(cfg)


@pytest.fixture(scope="module")
def engine(tool_vlm: Path) -> VLLMEngine:
    return VLLMEngine(
        str(tool_vlm),
        None,
        "float32",
        0,
        multimodal=True,
        max_model_len=512,
        gpu_memory_utilization=0.5,
        tensor_parallel_size=1,
        enforce_eager=True,
        enable_prefix_caching=True,
        max_num_batched_tokens=2048,
        free_cache_engine=False,
        image_limit=4,
    )


def visual_batch(processor, n_rows: int) -> Batch:
    from rlstack.data.images import fit_pixels
    from rlstack.data.visual import row
    from rlstack.models.vision import encode_prompt

    cols: dict[str, list] = {k: [] for k in ("prompt_ids", "uid", "images", "extra", "where")}
    cols |= {"pixel_values": [], "image_grid_thw": []}
    for i in range(n_rows):
        r = row("test", i)
        image = fit_pixels(r["images"][0], MIN_PIXELS, MAX_PIXELS, processor.factor)
        enc = encode_prompt(processor, [{"role": "user", "content": r["problem"]}], [image], f"visual:{i}")
        cols["prompt_ids"].append(enc.input_ids.tolist())
        cols["pixel_values"].append(enc.pixel_values)
        cols["image_grid_thw"].append(enc.image_grid_thw)
        cols["uid"].append(str(i))
        cols["images"].append(r["images"])  # tools work on the original picture
        cols["extra"].append(r["extra"])
        cols["where"].append(f"visual:{i}")
    return Batch(cols)


def max_logprob_gap(model, out: Batch) -> float:
    grids = out["image_grid_thw"]
    with torch.no_grad():
        logp, _ = forward_logprobs(
            model,
            out["input_ids"],
            out["attention_mask"],
            position_ids(model, out["input_ids"], out["attention_mask"], grids),
            out["response_mask"],
            pixel_values=out["pixel_values"],
            image_grid_thw=grids,
        )
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
