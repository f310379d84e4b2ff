"""Environment feedback turns (`worker.rollout.agent.feedback`, NeMo RL's multi-turn environments): an
answer ending with EOS goes to the environment, whose reply is the next user turn (masked out) until it
accepts or max_turns is reached; what it reads, what it may return, and a GRPO run with it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from test_agent import Scripted

from rlstack.batch import Batch
from rlstack.config import AgentConfig, ConfigError, load_config
from rlstack.errors import RLStackError
from rlstack.models.loading import load_tokenizer
from rlstack.models.vision import VisionProcessor
from rlstack.rollout.agent import AgentLoop

ENVIRONMENT = """
SEEN = []

def reply(x):
    SEEN.append(dict(x))
    if x["ground_truth"] in x["last_turn"]:
        return None
    return f"No. Turn {x['turn']} was wrong, try again."

def broken(x):
    return 42

def slow(x):
    import time
    time.sleep(3)

def raising(x):
    return x["nope"]

def reply_by_the_old_name(x):
    SEEN.append(dict(x))
    if x["ground_truth"] in x["answer"]:  # what `last_turn` was called first
        return None
    return f"No. Turn {x['turn']} was wrong, try again."
"""


def _feedback_loop(model_dir: Path, tmp_path: Path, turns: list[list[str]], fn: str = "reply", **agent):
    env = tmp_path / "env.py"
    env.write_text(ENVIRONMENT)
    tok = load_tokenizer(str(model_dir))
    prompts = [tok(f"q{i}?", add_special_tokens=False)["input_ids"] for i in range(len(turns))]
    scripted = Scripted(tok, prompts, turns)
    cfg = AgentConfig(feedback=f"{env}:{fn}", **agent)
    loop = AgentLoop(
        scripted, VisionProcessor(tok, None), None, cfg, max_response_length=200, multimodal=False
    )
    batch = Batch(
        {
            "prompt_ids": prompts,
            "prompt": [f"q{i}?" for i in range(len(turns))],
            "ground_truth": ["7", "8"][: len(turns)],
            "data_source": ["env"] * len(turns),
            "extra": [{"i": i} for i in range(len(turns))],
            "where": [f"rows.jsonl:{i + 1}" for i in range(len(turns))],
        }
    )
    return loop.generate(batch, 1, 1.0), scripted, loop, tok


def test_a_rejected_answer_gets_the_environments_reply_and_another_turn(tiny_model_dir: Path, tmp_path: Path):
    out, scripted, loop, tok = _feedback_loop(
        tiny_model_dir, tmp_path, [["3<eos>", "7<eos>"], ["8<eos>"]], max_turns=4
    )
    assert out["end_reason"] == ["done", "done"]
    assert out["num_turns"].tolist() == [2, 1] and out["feedback_turns"].tolist() == [1, 0]
    real = out["attention_mask"][0].bool()
    start = len(out["prompt_ids"][0])
    response, mask = out["input_ids"][0][real][start:], out["response_mask"][0][real][start:]
    assert tok.decode(response[mask.bool()]) == "3<|im_end|>7<|im_end|>"  # both answers are trained on
    assert "No. Turn 1 was wrong, try again." in tok.decode(response[~mask.bool()])  # the reply is not
    # the second answer was generated after the reply, as a user turn of the chat template
    assert tok.decode(scripted.contexts[1][0]).endswith(
        "3<|im_end|>\n<|im_start|>user\nNo. Turn 1 was wrong, try again.<|im_end|>\n<|im_start|>assistant\n"
    )
    seen = loop.feedback.__globals__["SEEN"]
    assert [(x["turn"], x["last_turn"], x["ground_truth"], x["data_source"], x["extra"]) for x in seen] == [
        (1, "3", "7", "env", {"i": 0}),
        (1, "8", "8", "env", {"i": 1}),
        (2, "7", "7", "env", {"i": 0}),
    ]
    assert "3" in seen[2]["response"] and "try again" in seen[2]["response"]  # the whole trajectory so far
    assert [t["role"] for t in out["turns"][0]] == ["assistant", "user", "assistant"]


def test_a_feedback_function_written_with_the_old_name_answer_reads_the_last_turn(
    tiny_model_dir: Path, tmp_path: Path
):
    turns = [["3<eos>", "7<eos>"], ["8<eos>"]]
    (tmp_path / "new").mkdir(), (tmp_path / "old").mkdir()
    new, _, _, _ = _feedback_loop(tiny_model_dir, tmp_path / "new", turns, max_turns=4)
    old, _, old_loop, _ = _feedback_loop(
        tiny_model_dir, tmp_path / "old", turns, fn="reply_by_the_old_name", max_turns=4
    )
    assert old["end_reason"] == new["end_reason"] == ["done", "done"]
    assert old["num_turns"].tolist() == new["num_turns"].tolist() == [2, 1]
    assert torch.equal(old["input_ids"], new["input_ids"])
    seen = old_loop.feedback.__globals__["SEEN"]
    assert [x["answer"] for x in seen] == [x["last_turn"] for x in seen] == ["3", "8", "7"]


def test_the_last_of_max_turns_ends_the_trajectory_without_asking(tiny_model_dir: Path, tmp_path: Path):
    out, scripted, loop, _ = _feedback_loop(
        tiny_model_dir, tmp_path, [["1<eos>", "2<eos>", "3<eos>"]], max_turns=2
    )
    assert out["end_reason"] == ["done"] and out["num_turns"].tolist() == [2]
    assert len(loop.feedback.__globals__["SEEN"]) == 1  # only the first answer was read


def test_a_feedback_function_returning_something_else_names_the_row(tiny_model_dir: Path, tmp_path: Path):
    with pytest.raises(
        RLStackError, match=r"feedback \(.*env.py:broken\) returned 42 for rows.jsonl:1, turn 1"
    ):
        _feedback_loop(tiny_model_dir, tmp_path, [["1<eos>"]], fn="broken")


def test_a_feedback_function_that_raises_is_shown_at_its_line(tiny_model_dir: Path, tmp_path: Path):
    with pytest.raises(RLStackError) as info:
        _feedback_loop(tiny_model_dir, tmp_path, [["1<eos>"]], fn="raising")
    assert (
        f"raised KeyError: 'nope' at {tmp_path / 'env.py'}:18 in raising: `return x[\"nope\"]` for rows.jsonl:1"
        in str(info.value)
    )


def test_grpo_with_an_environment_that_asks_again(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.trainer import Trainer

    env = tmp_path / "env.py"
    env.write_text("def reply(x):\n    return None if x['turn'] > 1 else 'Check your sum.'\n")
    cfg = load_config(
        [
            f"worker.actor.model.model_path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path / 'out'}",
            f"worker.rollout.agent.feedback={env}:reply",
            "worker.rollout.agent.max_turns=2",
            "data.rollout_batch_size=2",
            "worker.actor.global_batch_size=2",
            "worker.rollout.n=2",
            "worker.actor.micro_batch_size_per_device_for_update=4",
            "data.max_response_length=48",
            "data.val_files=",
            "trainer.max_steps=1",
            "trainer.logger=[file]",
            "trainer.save_model_only=true",
        ]
    )
    trainer = Trainer(cfg)
    loop = trainer.groups["rollout"].worker.loop
    inner = loop.engine

    class Answering:  # the random tiny model rarely ends a turn itself: its fourth token becomes EOS
        capabilities, eos_token_ids = inner.capabilities, inner.eos_token_ids

        @property
        def weight_version(self):
            return inner.weight_version

        def generate(self, requests, sampling):
            out = inner.generate(requests, sampling)
            for c in out:
                k = min(4, len(c.token_ids))
                c.token_ids[k - 1 :], c.logprobs[k:] = [min(inner.eos_token_ids)], []
            return out

    loop.engine = Answering()
    trainer.fit()
    (row,) = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["agent/feedback_turns/mean"] > 0 and row["agent/num_turns/mean"] > 1


def test_a_feedback_file_that_does_not_exist_is_named_at_load(tmp_path: Path):
    with pytest.raises(
        ConfigError, match=r"worker.rollout.agent.feedback: .*nowhere.py' does not exist \(looked for"
    ):
        load_config([f"worker.rollout.agent.feedback={tmp_path / 'nowhere.py'}:reply"])


def test_a_reply_past_the_tool_timeout_ends_the_trajectory(tiny_model_dir: Path, tmp_path: Path):
    began = time.perf_counter()
    out, _, _, _ = _feedback_loop(tiny_model_dir, tmp_path, [["1<eos>"]], fn="slow", tool_timeout_s=0.2)
    assert out["end_reason"] == ["timeout"] and time.perf_counter() - began < 2.5
