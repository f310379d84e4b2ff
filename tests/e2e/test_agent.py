"""The multi-turn agent loop: masks, end reasons, tool calls and observations, log-prob agreement, e2e."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from PIL import Image
from pinned import assert_matches_pinned, deterministic_metrics
from visual_agent import visual_batch

from rlstack.algos.policy_loss import LossAggMode, PolicyLoss, PolicyLossParams, aggregate_loss, policy_loss
from rlstack.batch import Batch
from rlstack.config import AgentConfig, load_config
from rlstack.errors import RLStackError
from rlstack.models.loading import load_causal_lm, load_processor, load_tokenizer, resolve_model_path
from rlstack.models.logprobs import forward_logprobs
from rlstack.models.vision import VisionProcessor, position_ids
from rlstack.rollout.agent import AgentLoop
from rlstack.rollout.engine import Completion, EngineCapabilities, Request, SamplingSettings
from rlstack.rollout.hf import HFEngine
from rlstack.tools.base import Observation, ToolCall
from rlstack.tools.parsing import parse_tool_call
from rlstack.tools.registry import build_toolset

# --------------------------------------------------------------------------------------------------
# A scripted policy: each trajectory's turns are given as text, so the loop's bookkeeping is exact.


class Scripted:
    """A scripted engine: trajectory i's k-th turn is `turns[i][k]` (then EOS when the text ends with
    `<eos>`, `<|endoftext|>` with `<endoftext>`), at log-prob -0.5 per token; a turn ends at either, or
    at a closing call tag."""

    capabilities = EngineCapabilities("scripted", True, False, True, False)
    weight_version = 0

    def __init__(self, tokenizer, prompts: list[list[int]], turns: list[list[str]]):
        self.tok, self.prompts, self.turns = tokenizer, prompts, turns
        # as Qwen's chat models: `<|im_end|>` (the tokenizer's EOS) and `<|endoftext|>` end a completion
        self.endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        self.eos_token_ids = frozenset([tokenizer.eos_token_id, self.endoftext])
        self.turn = [0] * len(turns)
        self.contexts: list[list[list[int]]] = []
        self.requests: list[list[list[Image.Image]]] = []
        """The images of each request, per call."""

    def generate(self, requests: list[Request], sampling: SamplingSettings) -> list[Completion]:
        self.contexts.append([list(r.prompt_ids) for r in requests])
        self.requests.append([r.images for r in requests])
        out = []
        for r in requests:
            i = next(i for i, q in enumerate(self.prompts) if list(r.prompt_ids[: len(q)]) == q)
            text = self.turns[i][self.turn[i]]
            self.turn[i] += 1
            ids = self.tok(text.removesuffix("<eos>").removesuffix("<endoftext>"), add_special_tokens=False)[
                "input_ids"
            ]
            ids += [self.tok.eos_token_id] if text.endswith("<eos>") else []
            ids += [self.endoftext] if text.endswith("<endoftext>") else []
            ended = (
                text.endswith(("<eos>", "<endoftext>", "</code>", "</tool_call>"))
                and len(ids) <= sampling.max_tokens
            )
            ids = ids[: sampling.max_tokens]
            out.append(Completion(ids, [-0.5] * len(ids), "stop" if ended else "length"))
        return out


class Echo:
    """A tool that echoes its argument; `image` returns a small picture; `crash` raises."""

    name: ClassVar[str] = "echo"
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "echo",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    instances: ClassVar[list[Echo]] = []

    def reset(self, images: list[Image.Image], extra: dict[str, Any]) -> None:
        self.images, self.extra, self.seen = images, extra, []
        Echo.instances.append(self)

    def execute(self, call: ToolCall) -> Observation:
        self.seen.append(call.arguments)
        if call.arguments.get("crash"):
            raise RuntimeError("tool blew up")
        images = [Image.new("RGB", (56, 56), "red")] * int(call.arguments.get("images", 0))
        return Observation(
            f"echo {call.arguments.get('x', '')}", images, evaluated=bool(call.arguments.get("evaluated"))
        )

    def close(self) -> None:
        self.closed = True


def _loop(model_dir: Path | str, turns: list[list[str]], **agent: Any) -> tuple[Batch, Scripted]:
    tok = load_tokenizer(str(model_dir))
    processor = load_processor(str(model_dir))
    prompts = [tok(f"q{i}?", add_special_tokens=False)["input_ids"] for i in range(len(turns))]
    scripted = Scripted(tok, prompts, turns)
    cfg = AgentConfig(
        tools=[{"name": "echo", "import_path": f"{__name__}:Echo"}], tool_call_format="hermes", **agent
    )
    loop = AgentLoop(
        scripted,
        processor or VisionProcessor(tok, None),
        build_toolset(cfg.tools),
        cfg,
        max_response_length=400,
        multimodal=processor is not None,
    )
    batch = Batch(
        {
            "prompt_ids": prompts,
            "uid": [str(i) for i in range(len(turns))],
            "extra": [{} for _ in turns],
            "where": [f"rows.jsonl:{i + 1}" for i in range(len(turns))],
        }
    )
    return loop.generate(batch, 1, 1.0), scripted


class Caching(Scripted):
    """`Scripted` whose completions carry a cache handle naming the call and row, as the HF engine's kept KV."""

    def generate(self, requests: list[Request], sampling: SamplingSettings) -> list[Completion]:
        self.handed = getattr(self, "handed", []) + [[(r.keep, r.cache) for r in requests]]
        call = len(self.handed)
        return [
            dataclasses.replace(c, cache=("kv", call, i))
            for i, c in enumerate(super().generate(requests, sampling))
        ]


def test_each_turns_kept_cache_goes_to_its_next_request_and_a_last_turn_keeps_none(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    turns = [[_call("a"), _call("b"), _call("c")], [_call("a"), "done<eos>"]]
    prompts = [tok(f"q{i}?", add_special_tokens=False)["input_ids"] for i in range(2)]
    engine = Caching(tok, prompts, turns)
    cfg = AgentConfig(
        tools=[{"name": "echo", "import_path": f"{__name__}:Echo"}], tool_call_format="hermes", max_turns=3
    )
    loop = AgentLoop(engine, VisionProcessor(tok, None), build_toolset(cfg.tools), cfg, 400, multimodal=False)
    out = loop.generate(Batch({"prompt_ids": prompts}), 1, 1.0)
    assert out["end_reason"] == ["max_turns", "done"]
    assert engine.handed == [
        [(True, None), (True, None)],  # both may go on: keep
        [(True, ("kv", 1, 0)), (True, ("kv", 1, 1))],  # each gets its own first turn's cache back
        [(False, ("kv", 2, 0))],  # the third and last turn: nothing to keep
    ]


def _call(x: str = "", **args: Any) -> str:
    return "<tool_call>" + json.dumps({"name": "echo", "arguments": {"x": x, **args}}) + "</tool_call>"


def test_observations_are_masked_and_turns_counted(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    out, scripted = _loop(
        tiny_model_dir,
        [[_call("a"), "ok <answer>1</answer><eos>"], ["<answer>2</answer><eos>"]],
    )
    assert out["end_reason"] == ["done", "done"]
    assert out["num_turns"].tolist() == [2, 1] and out["tool_calls"].tolist() == [1, 0]
    row, mask, logp = out["input_ids"][0], out["response_mask"][0], out["rollout_logprobs"][0]
    real = out["attention_mask"][0].bool()
    response = row[real][len(out["prompt_ids"][0]) :]
    response_mask = mask[real][len(out["prompt_ids"][0]) :]
    sampled = tok.decode(response[response_mask.bool()])
    observed = tok.decode(response[~response_mask.bool()])
    assert sampled.startswith(_call("a")) and "<answer>1</answer>" in sampled
    assert "echo a" in observed and "echo" not in sampled.replace(_call("a"), "")
    assert (logp[mask == 0] == 0).all() and (logp[mask == 1] == -0.5).all()
    # the second turn was generated from the whole context: prompt + call + observation
    second = scripted.contexts[1][0]
    assert tok.decode(second).endswith("echo a<|im_end|>\n<|im_start|>assistant\n")


def test_observation_tokens_get_no_gradient(tiny_model_dir):
    out, _ = _loop(tiny_model_dir, [[_call("zz"), "<answer>1</answer><eos>"]])
    model = load_causal_lm(str(tiny_model_dir))
    positions = position_ids(model, out["input_ids"], out["attention_mask"])
    logp, _ = forward_logprobs(
        model, out["input_ids"], out["attention_mask"], positions, out["response_mask"]
    )
    logp.retain_grad()
    mask = out["response_mask"].float()
    result = policy_loss(
        PolicyLoss.VANILLA, logp, logp.detach(), torch.ones_like(logp), mask, PolicyLossParams()
    )
    loss = aggregate_loss(result.loss, mask, LossAggMode.TOKEN_MEAN, mask.sum(), torch.tensor(1.0), 200)
    loss.backward()
    obs = (out["response_mask"] == 0) & (out["attention_mask"] == 1)
    obs[:, : len(out["prompt_ids"][0])] = False
    assert obs.any()
    assert (logp.grad[obs] == 0).all()
    assert (logp.grad[out["response_mask"] == 1] != 0).all()


def test_a_turn_ending_at_any_end_token_of_the_engine_is_done(tiny_model_dir):
    """Not only the tokenizer's EOS: a turn that ends at another of the engine's end tokens (Qwen's
    `<|endoftext|>`) ends its trajectory, instead of being parsed for a tool call that is not there."""
    out, _ = _loop(tiny_model_dir, [[_call("a"), "fine<endoftext>"], ["<answer>2</answer><eos>"]])
    assert out["end_reason"] == ["done", "done"]
    assert out["tool_calls"].tolist() == [1, 0] and out["tool_errors"].tolist() == [0, 0]


def test_end_reasons_and_bad_calls_become_observations(tiny_model_dir):
    turns = [
        [_call("1"), _call("2"), _call("3")],  # max_turns=3: still calling on the last turn
        ["<tool_call>{not json</tool_call>", "<answer>x</answer><eos>"],  # malformed: an observation
        ['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "<eos>"],  # unknown tool
        [_call(crash=True), "<eos>"],  # the tool raises: an observation, ok=False
        [_call(images=1), "<eos>"],  # a text model cannot see the image: told so
        ["x" * 450],  # never ends: over_length
    ]
    out, _ = _loop(tiny_model_dir, turns, max_turns=3)
    assert out["end_reason"] == ["max_turns", "done", "done", "done", "done", "over_length"]
    assert out["tool_calls"].tolist() == [2, 1, 1, 1, 1, 0]
    assert out["tool_errors"].tolist() == [0, 1, 1, 1, 0, 0]
    text = out["response_text"]
    assert "not valid JSON" in text[1] and "there is no tool 'nope'" in text[2] and "tool blew up" in text[3]
    assert "cannot see images" in text[4]
    assert out["response_mask"].sum(-1)[5] == 400  # cut at max_response_length
    assert all(getattr(e, "closed", False) for e in Echo.instances[-6:])  # every trajectory's tools closed


def test_a_reply_past_the_response_budget_stays_in_the_turns_marked_dropped(tiny_model_dir):
    """The model never reads it, but whoever reads the trajectory sees the tool's reply and what was cut."""
    out, _ = _loop(tiny_model_dir, [[_call("y" * 190), "<eos>"], [_call("a"), "<eos>"]])
    assert out["end_reason"] == ["over_length", "done"]
    call, reply = out["turns"][0]
    assert call["tool_call"]["name"] == "echo" and reply["role"] == "tool"
    assert reply["text"] == "echo " + "y" * 190 and reply["images"] == []
    dropped, sampled = reply["dropped"], int(out["response_mask"][0].sum())
    assert dropped == {"reason": "over_length", "tokens": dropped["tokens"], "room": 400 - sampled}
    assert dropped["tokens"] >= dropped["room"]  # it did not fit
    assert out["response_text"][0] == _call("y" * 190)  # nothing of it reached the context
    assert all("dropped" not in turn for turn in out["turns"][1])


def test_tool_images_come_back_as_image_tokens_and_max_images_ends():
    vlm = resolve_model_path("builtin:tiny-qwen2.5-vl")
    processor = load_processor(vlm)
    turns = [[_call(images=1), _call(images=2), "<eos>"], [_call(images=4), "<eos>"]]
    out, scripted = _loop(vlm, turns, max_images=3)
    assert out["end_reason"] == ["done", "max_images"]
    grids = out["image_grid_thw"]
    assert [len(g) for g in grids] == [3, 0]  # 1 + 2 images fed back; 4 > max_images=3 is refused
    assert out["turns"][1][-1]["dropped"] == {"reason": "max_images", "images": 4}  # and said in the turns
    pad = processor.image_token_id
    tokens_per_image = (grids[0].prod(-1) // processor.merge_size**2).tolist()
    # the second turn's context holds the first image's tokens, the third turn's all three
    assert scripted.contexts[1][0].count(pad) == tokens_per_image[0]
    assert scripted.contexts[2][0].count(pad) == sum(tokens_per_image)
    assert int((out["input_ids"][0] == pad).sum()) == sum(tokens_per_image)
    assert out["response_mask"][0][out["input_ids"][0] == pad].sum() == 0  # image tokens are observations
    assert len(out["pixel_values"][0]) == int(grids[0].prod(-1).sum())
    assert [len(images) for images in scripted.requests[-1]] == [3]  # the engine saw the images themselves


# --------------------------------------------------------------------------------------------------
# The tiny vision-language model, warm-started to call the Python tool


def test_interpreter_state_persists_within_a_trajectory_and_not_across(tiny_model_dir):
    turns = [
        ["<code>x = 41</code>", "<code>print(x + 1)</code>", "<eos>"],
        ["<code>print(x)</code>", "<code>print(image_1.size)</code>", "<eos>"],
    ]
    tok = load_tokenizer(str(tiny_model_dir))
    prompts = [tok(f"q{i}?", add_special_tokens=False)["input_ids"] for i in range(2)]
    cfg = AgentConfig(tools=[{"name": "python", "import_path": "builtin:python"}], tool_call_format="code")
    loop = AgentLoop(
        Scripted(tok, prompts, turns),
        VisionProcessor(tok, None),
        build_toolset(cfg.tools),
        cfg,
        max_response_length=600,
        multimodal=False,
    )
    picture = Image.new("RGB", (64, 48), "blue")
    batch = Batch(
        {
            "prompt_ids": prompts,
            "uid": ["a", "b"],
            "images": [[], [picture]],
            "extra": [{}, {}],
            "where": ["r:1", "r:2"],
        }
    )
    out = loop.generate(batch, 1, 1.0)
    first, second = out["response_text"]
    assert "42" in first  # x from the first cell is still there in the second
    assert "NameError" in second and "(64, 48)" in second  # another trajectory's x is not; its image is
    assert out["tool_errors"].tolist() == [0, 1]


def _assert_documented(metrics: dict[int, dict]) -> None:
    glossary = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    for name in {k for row in metrics.values() for k in row}:
        if name.startswith(("agent/", "vppo/", "timing_s/", "actor/")):
            assert f"`{name}`" in glossary, f"{name} is logged but not described in docs/metrics.md"


@pytest.mark.slow
def test_rollout_logprobs_match_a_forward_pass_on_multi_turn_multi_image_trajectories(tool_vlm: Path):
    model = load_causal_lm(str(tool_vlm))
    processor = load_processor(str(tool_vlm))
    cfg = AgentConfig(tools=[{"name": "python", "import_path": "builtin:python"}], max_turns=3)
    engine = HFEngine(model, processor.tokenizer, seed=0, multimodal=True)
    loop = AgentLoop(engine, processor, build_toolset(cfg.tools), cfg, 160, multimodal=True)
    out = loop.generate(visual_batch(processor, 4), 3, 1.0)
    images = torch.tensor([len(g) for g in out["image_grid_thw"]])
    multi = (images >= 2) & (out["num_turns"] >= 2)
    assert multi.any(), (out["end_reason"], out["response_text"])  # a crop came back and was read
    with torch.no_grad():
        logp, _ = forward_logprobs(
            model,
            out["input_ids"],
            out["attention_mask"],
            position_ids(model, out["input_ids"], out["attention_mask"], out["image_grid_thw"]),
            out["response_mask"],
            pixel_values=out["pixel_values"],
            image_grid_thw=out["image_grid_thw"],
        )
    mask = out["response_mask"].bool()
    diff = (logp - out["rollout_logprobs"]).abs()[mask]
    assert diff.max() < 1e-4, diff.max()
    assert (out["response_mask"] * (out["input_ids"] == processor.image_token_id)).sum() == 0


@pytest.mark.slow
def test_agentic_grpo_on_the_visual_task_two_steps(agent_run):
    cfg, elapsed = agent_run
    assert elapsed < 120
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = {json.loads(line)["step"]: json.loads(line) for line in lines}
    for step in (1, 2):
        m = metrics[step]
        assert m["agent/tool_calls/mean"] > 0 and m["timing_s/agent_tools"] > 0
        assert 0 < m["agent/tool_success_rate"] <= 1
        assert sum(
            m[f"agent/end_reason/{r}"]
            for r in ("done", "max_turns", "over_length", "tool_error", "max_images")
        ) == pytest.approx(1.0)
        assert "actor/pg_loss" in m and "reward/tool" in m
    rows = [
        json.loads(x) for x in (cfg.run_dir / "generations" / "train_step_1.jsonl").read_text().splitlines()
    ]
    assert any(r["num_images"] > 1 for r in rows)  # an image made by code went back into the context
    # each trajectory's turns, with the prompt's and the tools' images saved once under images/
    row = next(r for r in rows if r["num_images"] > 1)
    roles = [turn["role"] for turn in row["turns"]]
    # every sampled turn, and every tool reply (one that would not fit the response budget ends the
    # trajectory unread, marked dropped)
    assert roles[0] == "assistant" and roles.count("assistant") == row["num_turns"]
    assert 1 <= roles.count("tool") <= row["tool_calls"]
    for r in rows:  # no call that ran is left without its reply
        assert "tool_call" not in r["turns"][-1] or r["end_reason"] in ("max_turns", "timeout"), r["turns"]
    call = next(turn["tool_call"] for turn in row["turns"] if "tool_call" in turn)
    assert call.get("name") == "python" or "error" in call
    tool_turn = next(turn for turn in row["turns"] if turn["role"] == "tool" and turn["images"])
    paths = [row["tool_images"][k] for k in tool_turn["images"]] + row["images"]
    assert all(p.startswith("images/") and (cfg.run_dir / p).is_file() for p in paths)
    every = [
        json.loads(x)
        for f in (cfg.run_dir / "generations").glob("*.jsonl")
        for x in f.read_text().splitlines()
    ]
    referenced = {p for r in every for p in r.get("images", []) + r.get("tool_images", [])}
    assert {f"images/{f.name}" for f in (cfg.run_dir / "images").glob("*.png")} == referenced  # each once
    assert_matches_pinned("agent_vlm", deterministic_metrics(cfg.run_dir))


@pytest.mark.slow
def test_vppo_two_steps_on_the_tiny_vlm(tmp_path: Path):
    from rlstack.trainer import Trainer

    start = time.perf_counter()
    cfg = load_config(
        [
            "worker.actor.model.model_path=builtin:tiny-qwen2.5-vl",
            f"trainer.output_dir={tmp_path}",
            "data.train_files=builtin:visual@test",
            "data.val_files=",
            "data.max_prompt_length=256",
            "data.max_response_length=16",
            "data.min_pixels=3136",
            "data.max_pixels=12544",
            "data.rollout_batch_size=4",
            "worker.actor.global_batch_size=4",
            "worker.rollout.n=4",
            "worker.actor.micro_batch_size_per_device_for_update=16",
            "worker.actor.optim.lr=1e-3",
            "worker.actor.freeze_vision_tower=true",
            "worker.reward.reward_function=builtin:agent",
            "algorithm.use_vppo_on_perception=true",
            "algorithm.top_p_perception_tokens=0.4",
            "algorithm.use_advantage_shaping=true",
            "algorithm.advantage_scaling_min=0.9",
            "algorithm.use_entropy_penalty=true",
            "algorithm.use_kl_loss=true",  # the reference model scores the same rows, images included
            "trainer.max_steps=2",
            "trainer.logger=[file]",
            "worker.rollout.check_weight_sync=true",  # the probe works for a vision model too
        ]
    )
    trainer = Trainer(cfg)
    tower_before = {
        n: p.clone() for n, p in trainer.groups["actor"].worker.model.model.visual.named_parameters()
    }
    trainer.fit()
    assert time.perf_counter() - start < 120
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = {json.loads(line)["step"]: json.loads(line) for line in lines}
    for step in (1, 2):
        m = metrics[step]
        assert m["vppo/dependency/mean"] > 0  # blacking out patches moves the tiny model's distributions
        # ceil(0.4 * n) of each response's n tokens: between 40% and 40% + one token per response
        assert 0.4 <= m["vppo/perception_token_fraction"] <= 0.4 + 1 / m["response_length/mean"] + 1e-6
        assert m["vppo/advantage_scale/min"] >= 0.9 - 1e-6 and m["vppo/advantage_scale/max"] >= 1.0
        assert m["actor/vppo_entropy_penalty"] > 0
        assert m["actor/kl_loss"] >= 0
    assert metrics[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at the start
    assert metrics[2]["actor/kl_loss"] > 1e-7
    assert all(metrics[step]["rollout/weight_sync_max_diff"] < 1e-5 for step in (1, 2))
    _assert_documented(metrics)
    model = trainer.groups["actor"].worker.model
    for name, p in model.model.visual.named_parameters():
        assert torch.equal(p, tower_before[name]), f"frozen vision tower parameter {name} changed"
    assert (cfg.run_dir / "checkpoints" / "global_step_2" / "model" / "preprocessor_config.json").is_file()


def test_multi_turn_sft_rows_are_laid_out_like_agent_trajectories(monkeypatch):
    """`builtin:visual_tool_sft` answers are whole trajectories: the SFT batch trains on the assistant
    turns only, holds the prompt's and the observation's images, and its observation is exactly what
    the Python tool returns for the crop call (the same text and the same enlarged crop)."""
    from rlstack.data.dataset import PromptDataset, sft_batch
    from rlstack.data.visual import crop_box, tool_sft_rows
    from rlstack.tools.python import PythonTool

    vlm = resolve_model_path("builtin:tiny-qwen2.5-vl")
    tok, processor = load_tokenizer(vlm), load_processor(vlm)
    rows = tool_sft_rows("test")[:2]
    monkeypatch.setattr("rlstack.data.readers.builtin_rows", lambda spec: rows)
    data = load_config(["data.min_pixels=3136", "data.max_pixels=12544", "data.max_prompt_length=256"]).data
    ds = PromptDataset.from_config("builtin:visual_tool_sft@test", tok, data, -1, processor)
    batch = sft_batch(ds, [0, 1], tok, processor)

    conversation = rows[0]["answer"]
    tool = PythonTool()
    tool.reset(rows[0]["images"], {})
    try:
        call = parse_tool_call(conversation[0]["content"], "code")
        observation = tool.execute(call)
    finally:
        tool.close()
    assert observation.ok and observation.text == ""
    assert [im.size for im in observation.images] == [im.size for im in conversation[1]["images"]]
    assert list(observation.images[0].getdata()) == list(conversation[1]["images"][0].getdata())
    assert call.arguments["code"] == f"image_1.crop({crop_box(rows[0]['extra']['target_bbox'])})"

    ids, mask = batch["input_ids"][0], batch["response_mask"][0]
    trained = tok.decode(ids[mask.bool()])
    assert trained == conversation[0]["content"] + conversation[2]["content"] + tok.eos_token
    grid = batch["image_grid_thw"][0]
    assert len(grid) == 2  # the picture in the prompt and the crop in the observation
    pads = int((ids == processor.image_token_id).sum())
    assert pads == int((grid.prod(-1) // processor.merge_size**2).sum())
    assert int((mask * (ids == processor.image_token_id)).sum()) == 0


def test_a_tool_call_past_the_timeout_ends_its_trajectory_without_waiting(tiny_model_dir):
    turns = [
        ["<code>import time\ntime.sleep(60)</code>", "<eos>"],  # hangs (the tool's own limit is 120 s)
        ["<code>print(6 * 7)</code>", "<eos>"],
    ]
    tok = load_tokenizer(str(tiny_model_dir))
    prompts = [tok(f"q{i}?", add_special_tokens=False)["input_ids"] for i in range(2)]
    cfg = AgentConfig(
        tools=[{"name": "python", "import_path": "builtin:python", "kwargs": {"timeout_s": 120}}],
        tool_call_format="code",
        tool_timeout_s=2.0,
    )
    loop = AgentLoop(
        Scripted(tok, prompts, turns), VisionProcessor(tok, None), build_toolset(cfg.tools), cfg, 600, False
    )
    batch = Batch({"prompt_ids": prompts, "uid": ["a", "b"], "extra": [{}, {}], "where": ["r:1", "r:2"]})
    began = time.perf_counter()
    out = loop.generate(batch, 1, 1.0)
    assert time.perf_counter() - began < 20
    assert out["end_reason"] == ["timeout", "done"]
    assert "42" in out["response_text"][1]
    # the abandoned call's thread ends with its interpreter, closed at the timeout (a thread left running
    # is joined when the trainer exits: it would hold the exit up to the tool's own 120 s, or for ever)
    deadline = time.monotonic() + 10
    while any(t.name.startswith("tool") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [t.name for t in threading.enumerate() if t.name.startswith("tool")] == []


def test_the_trainer_drops_the_groups_of_timed_out_trajectories(tiny_model_dir, tmp_path):
    from rlstack.trainer import Trainer

    cfg = load_config(
        [
            f"worker.actor.model.model_path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "data.val_files=",
            "worker.rollout.agent.tool_timeout_s=5",
            "trainer.logger=[file]",
        ]
    )
    trainer = Trainer(cfg)
    rows = Batch(
        {"uid": ["a", "a", "b", "b", "c", "c"], "end_reason": ["done", "timeout", "done", "done", "x", "y"]}
    )
    kept = trainer.collector.drop_timed_out_groups(rows, 1)
    assert kept["uid"] == ["b", "b", "c", "c"] and trainer.collector.dropped_groups == 1
    with pytest.raises(RLStackError, match="every prompt group .*tool_timeout_s"):
        trainer.collector.drop_timed_out_groups(Batch({"uid": ["a"], "end_reason": ["timeout"]}), 1)


# --------------------------------------------------------------------------------------------------
# Tool contracts: a PyVision, CodeV or DeepEyes checkpoint meets the image names and replies it was trained on


@pytest.mark.parametrize(
    ("contract", "cell", "reply"),
    [
        ("rlstack", "print(image_1.size)", "(64, 48)"),
        ("pyvision", "print(image_clue_0.size)", "<interpreter>Text Result:\n(64, 48)</interpreter>"),
        (
            "codev",
            "from PIL import Image\nprint(image_filename, Image.open(image_filename).size)",
            "<sandbox_output>image_1.png (64, 48)</sandbox_output>Analyze sandbox output",
        ),
    ],
)
def test_the_python_tool_names_the_images_and_wraps_its_replies_by_the_contract(
    tiny_model_dir, contract, cell, reply
):
    tok = load_tokenizer(str(tiny_model_dir))
    prompts = [tok("q?", add_special_tokens=False)["input_ids"]]
    turns = [[f"<code>```python\n{cell}\n```</code>", "<answer>7</answer><eos>"]]
    cfg = AgentConfig(tools=[{"name": "python", "import_path": "builtin:python"}], tool_contract=contract)
    toolset = build_toolset(cfg.tools, contract=contract)
    loop = AgentLoop(Scripted(tok, prompts, turns), VisionProcessor(tok, None), toolset, cfg, 600, False)
    picture = Image.new("RGB", (64, 48), "blue")
    batch = Batch(
        {"prompt_ids": prompts, "uid": ["a"], "images": [[picture]], "extra": [{}], "where": ["r:1"]}
    )
    out = loop.generate(batch, 1, 1.0)
    assert out["tool_errors"].tolist() == [0] and out["end_reason"] == ["done"]
    assert reply in out["response_text"][0]


def test_pyvision_replies_number_the_shown_images_on_from_the_prompts():
    vlm = resolve_model_path("builtin:tiny-qwen2.5-vl")
    processor = load_processor(vlm)
    batch = visual_batch(processor, 1)
    cell = "<code>```python\nimage_clue_0.crop((0, 0, 56, 56))\n```</code>"
    scripted = Scripted(processor.tokenizer, list(batch["prompt_ids"]), [[cell, cell, "<eos>"]])
    cfg = AgentConfig(tools=[{"name": "python", "import_path": "builtin:python"}], tool_contract="pyvision")
    toolset = build_toolset(cfg.tools, contract="pyvision")
    out = AgentLoop(scripted, processor, toolset, cfg, 400, multimodal=True).generate(batch, 1, 1.0)
    text = processor.tokenizer.decode(out["input_ids"][0])
    assert out["end_reason"] == ["done"] and len(out["image_grid_thw"][0]) == 3  # the prompt's and two crops
    for k in (1, 2):  # the prompt's picture is image_clue_0
        assert (
            f"<|im_start|>user\n<interpreter>Text Result:\n\nImage Result:\n<image_clue_{k}><|vision_start|>"
            in text
        )
    assert text.count("<|vision_end|></image_clue_") == 2  # each image's tokens sit inside its tags


def test_deepeyes_replies_are_the_crop_in_tool_response_and_its_turn_prompt():
    vlm = resolve_model_path("builtin:tiny-qwen2.5-vl")
    processor = load_processor(vlm)
    out, _ = _loop(vlm, [[_call(images=1), "<eos>"]], tool_contract="deepeyes")
    text = processor.tokenizer.decode(out["input_ids"][0])
    assert "<|im_start|>user\n<tool_response><|vision_start|>" in text
    assert "<|vision_end|></tool_response>\nThink first, call **image_zoom_in_tool** if needed" in text
    assert "echo" not in text.split("</tool_call>", 1)[1]  # DeepEyes shows the crop, not the tool's text


TOOL_AWARE_REWARD = '''
import re


def compute_score(reward_inputs):
    """Credit an answer only where a tool reply that worked said it (CodeV's TAPO in miniature)."""
    out = []
    for x in reward_inputs:
        answer = re.search(r"<answer>(.*?)</answer>", x["response"]).group(1)
        replies = [t for t in x["turns"] if t["role"] == "tool" and t["ok"]]
        helped = any(answer in t["text"] for t in replies)
        shown = sum(len(t["images"]) for t in replies)
        out.append({"overall": float(helped), "tool_images": float(shown == len(x["tool_images"]) > 0)})
    return out
'''


def test_a_reward_function_reads_the_tool_calls_and_replies_also_on_a_remote_worker(tmp_path):
    from rlstack.rewards.loader import load_reward_function
    from rlstack.rewards.manager import REWARD_COLUMNS, reward_inputs

    out, _ = _loop(
        resolve_model_path("builtin:tiny-qwen2.5-vl"),
        [
            [_call("7", images=1), "<answer>7</answer><eos>"],  # the tool said 7: credited
            ["<answer>7</answer><eos>"],  # the same answer without the tool: nothing
            [_call("7", crash=True), "<answer>7</answer><eos>"],  # the tool failed: nothing
        ],
    )
    n = len(out)
    out = out.update(
        {
            "ground_truth": ["7"] * n,
            "prompt": [f"q{i}?" for i in range(n)],
            "data_source": ["t"] * n,
        }
    )
    inputs = reward_inputs(out)
    # a Ray reward actor is sent REWARD_COLUMNS alone: it must see the same inputs
    assert reward_inputs(Batch({k: out[k] for k in REWARD_COLUMNS if k in out})) == inputs
    assert [x["num_tool_calls"] for x in inputs] == [1, 0, 1]
    call = next(t for t in inputs[0]["turns"] if t["role"] == "assistant")
    assert call["tool_call"] == {"name": "echo", "arguments": {"x": "7", "images": 1}}
    assert len(inputs[0]["tool_images"]) == 1 and inputs[0]["tool_images"][0].size == (56, 56)
    path = tmp_path / "tool_aware.py"
    path.write_text(TOOL_AWARE_REWARD)
    scores = load_reward_function(f"{path}:compute_score").fn(inputs)
    assert [s["overall"] for s in scores] == [1.0, 0.0, 0.0]
    assert [s["tool_images"] for s in scores] == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("end", [True, False])
def test_end_on_evaluation_ends_the_trajectory_at_an_evaluated_result(tiny_model_dir, end):
    """NeMo RL's code environment with terminate_on_evaluation: a call whose code ended with an expression
    that ran is the last turn; a call without one (or with end_on_evaluation off) lets the model go on."""
    turns = [
        [_call("a", evaluated=True), "<answer>1</answer><eos>"],
        [_call("b"), "<answer>2</answer><eos>"],
    ]
    out, _ = _loop(tiny_model_dir, turns, end_on_evaluation=end, max_turns=3)
    assert out["num_turns"].tolist() == ([1, 2] if end else [2, 2])
    assert out["end_reason"] == ["done", "done"]
    assert ("<answer>1</answer>" in out["response_text"][0]) is not end
