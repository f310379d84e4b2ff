"""The tool demo's recipes on the real model (`make test-real`): SmolLM2-135M-Instruct, warm-started with
the demo's recipe (24 steps, about 3 minutes), calls the sandboxed Python tool, reads its reply and is
paid for the right boxed answer; two GRPO steps of each recipe (with and without the tool) run."""

from __future__ import annotations

import json
import re

import pytest

from rlstack.config import load_config
from rlstack.sft import run_sft
from rlstack.trainer import Trainer

pytestmark = pytest.mark.timeout(1200)  # the warm start alone takes about 3 minutes on 2 cores

SMALL = [
    "data.rollout_batch_size=2",
    "worker.rollout.n=4",
    "worker.actor.global_batch_size=2",
    "worker.actor.micro_batch_size_per_device_for_update=8",
    "worker.actor.micro_batch_size_per_device_for_experience=8",
    "data.val_max_samples=8",
    "trainer.max_steps=2",
    "trainer.val_freq=2",
    "trainer.save_freq=-1",
    "trainer.logger=[file]",
]


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("sft")
    cfg = load_config(["config=rlstack/configs/demo_real_tool_sft.yaml", f"trainer.output_dir={out}"])
    return str(run_sft(cfg))


def test_tool_grpo_calls_the_tool_reads_its_reply_and_pays_the_right_answer(warm_start, tmp_path):
    cfg = load_config(
        [
            "config=rlstack/configs/demo_real_tool_grpo.yaml",
            f"worker.actor.model.model_path={warm_start}",
            f"trainer.output_dir={tmp_path}",
            "trainer.val_generations_to_log=8",
            *SMALL,
        ]
    )
    metrics = Trainer(cfg).fit()
    assert (
        metrics["val/agent/called_tool"] > 0.5
    )  # the warm start calls on every held-out problem (500 of 500)
    rows = [
        json.loads(line)
        for line in (cfg.run_dir / "generations" / "val_step_2.jsonl").read_text().splitlines()
    ]
    # trajectories whose first turn is a well-formed call of plain arithmetic (what the warm start writes)
    arithmetic = [
        r
        for r in rows
        if len(r["turns"]) >= 2
        and "code" in r["turns"][0].get("tool_call", {}).get("arguments", {})
        and re.fullmatch(r"[\d\s+\-*/()]+", r["turns"][0]["tool_call"]["arguments"]["code"])
    ]
    assert arithmetic
    for r in arithmetic:
        code, reply = r["turns"][0]["tool_call"]["arguments"]["code"], r["turns"][1]
        assert reply["role"] == "tool", r  # the sandbox's reply came back, and the model read it
        if reply["ok"]:  # a division by zero is an error reply; otherwise the value is Python's
            assert reply["text"] == str(eval(code, {"__builtins__": {}})), r  # noqa: S307 - digits and operators only
        answer = r["reward_info"].get("answer")
        if answer == r["ground_truth"]:
            assert r["score"] == 1.0, r
        elif not answer or re.fullmatch(r"-?\d+", answer):  # no answer, or another whole number
            assert r["score"] == 0.0, r
    assert any(r["score"] == 1.0 for r in rows)  # the warm start answers some right (61% on 500)
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert all(json.loads(line)["agent/tool_calls/mean"] > 0 for line in lines)  # training rollouts call too


def test_no_tool_grpo_answers_in_one_turn_and_is_paid_for_the_right_answer(tmp_path):
    cfg = load_config(
        [
            "config=rlstack/configs/demo_real_no_tool_grpo.yaml",
            f"trainer.output_dir={tmp_path}",
            "trainer.val_generations_to_log=8",
            *SMALL,
        ]
    )
    metrics = Trainer(cfg).fit()
    assert "val/agent/called_tool" not in metrics
    rows = [
        json.loads(line)
        for line in (cfg.run_dir / "generations" / "val_step_2.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 8
    for r in rows:
        assert "<code>" not in r["prompt"] and "turns" not in r
        answer = r["reward_info"].get("answer")
        if answer == r["ground_truth"]:
            assert r["score"] == 1.0, r
        elif not answer or re.fullmatch(r"-?\d+", answer):  # no answer, or another whole number
            assert r["score"] == 0.0, r
