"""Tests that fail when learning breaks, not only when numbers change: GRPO on the random tiny model raises
the reward it is given, and each of three faults that keep every number finite makes the same check fail: the
advantages' sign flipped (the reward falls instead), a learning rate of zero, and a loss detached from the
log-probs (no gradient reaches the weights). The run is `digits_run`'s (the reward: the share of digits in the
response) at a learning rate that moves the tiny model within a few steps. The DAPO and PPO recipes raise the
same reward, and agentic GRPO raises the share of trajectories that call the Python tool when a call that ran
is what it pays for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from digits_run import digits_run

import rlstack.algos.actor_loss as actor_loss
import rlstack.algos.step as algo_step
from rlstack.config import load_config
from rlstack.sft import run_sft
from rlstack.trainer import Trainer

STEPS = 16
pytestmark = pytest.mark.slow


def trained_rows(cfg) -> list[dict]:
    """Train `cfg` (STEPS steps) and return each step's metrics."""
    Trainer(cfg).fit()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return rows


def scores(tiny_model_dir, tmp_path, name: str, *extra: str) -> list[float]:
    """The mean reward of each step's rollouts."""
    cfg = digits_run(tiny_model_dir, tmp_path, name, "worker.actor.optim.lr=1e-2", *extra, steps=STEPS)
    return [r["critic/score/mean"] for r in trained_rows(cfg)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def learned(rewards: list[float]) -> bool:
    """The check: the last three steps' mean reward is 0.4 above the first three's. Measured (this CPU,
    2026-11-28): 0.06 at step 1, 0.89-0.94 over the last three steps."""
    return mean(rewards[-3:]) > mean(rewards[:3]) + 0.4


def flip_advantages(monkeypatch) -> None:
    real = algo_step.compute_advantages

    def flipped(*args, **kwargs):
        advantages, returns = real(*args, **kwargs)
        return -advantages, returns

    monkeypatch.setattr(algo_step, "compute_advantages", flipped)


def detach_loss(monkeypatch) -> None:
    """The policy loss of detached log-probs (`+ 0 * logp` keeps a graph, so backward runs): the same loss
    values, a gradient of zero."""
    real = actor_loss.policy_loss

    def detached(kind, logprobs, *args):
        return real(kind, logprobs.detach() + 0.0 * logprobs, *args)

    monkeypatch.setattr(actor_loss, "policy_loss", detached)


def test_grpo_raises_its_reward(tiny_model_dir, tmp_path):
    rewards = scores(tiny_model_dir, tmp_path, "learns")
    assert learned(rewards), f"GRPO did not raise its reward: {rewards}"


def test_a_flipped_advantage_lowers_the_reward(tiny_model_dir, tmp_path, monkeypatch):
    flip_advantages(monkeypatch)
    rewards = scores(tiny_model_dir, tmp_path, "flipped")
    assert not learned(rewards)
    start, end = mean(rewards[:3]), mean(rewards[-3:])
    assert end < start / 2, (
        f"a flipped advantage did not lower the reward: {start:.3f} -> {end:.3f} ({rewards})"
    )


@pytest.mark.parametrize("fault", ["zero_learning_rate", "detached_loss"])
def test_a_run_that_cannot_learn_fails_the_check(tiny_model_dir, tmp_path, monkeypatch, fault):
    extra = []
    if fault == "zero_learning_rate":
        extra = ["worker.actor.optim.lr=0"]
    else:
        detach_loss(monkeypatch)
    rewards = scores(tiny_model_dir, tmp_path, fault, *extra)
    assert not learned(rewards), rewards
    assert max(rewards[-3:]) < 0.4, rewards  # never near the 0.89-0.94 a learning run reaches


RECIPES = Path(__file__).parents[2] / "examples" / "recipes"
FAST_SCHEDULE = ["lr_warmup_steps=0", "lr_scheduler_type=constant"]
RECIPE_RUNS = {
    # DAPO's dynamic sampling keeps groups by their mean `overall` (the recipe's key, accuracy, is the
    # addition reward's, which the digits reward does not give), inside the digits reward's range (0 to 1.5).
    "dapo": ["algorithm.filter_key=overall", "algorithm.filter_low=0", "algorithm.filter_high=1.5"],
    # PPO's critic at the update's sizes and learning rate (the recipe's: 32 prompts a step, 1e-4).
    "ppo_gae": [
        "worker.critic.global_batch_size=2",
        "worker.critic.micro_batch_size_per_device_for_update=4",
        "worker.critic.optim.lr=1e-2",
        *(f"worker.critic.optim.{kv}" for kv in FAST_SCHEDULE),
    ],
}


@pytest.mark.parametrize("recipe", sorted(RECIPE_RUNS))
def test_dapo_and_ppo_raise_their_reward(tiny_model_dir, tmp_path, recipe):
    """The DAPO and PPO recipes (examples/recipes: DAPO's clip-higher, dynamic sampling, token-mean loss
    and overlong penalty; PPO's critic, GAE and KL in the reward) on the digits run: each raises its reward
    as GRPO does. Only the task, the sizes and the schedule are the run's. Measured (this CPU, 2026-11-30): DAPO
    -0.91 -> 0.67 (its overlong penalty: a response past 4 of the 6 tokens loses up to 1), PPO 0.06 -> 0.90; with a
    learning rate of 0 neither passes (-0.91 -> -0.77, 0.06 -> 0.17)."""
    extra = [f"config={RECIPES / recipe}.yaml", *RECIPE_RUNS[recipe]]
    extra += [f"worker.actor.optim.{kv}" for kv in FAST_SCHEDULE]
    rewards = scores(tiny_model_dir, tmp_path, recipe, *extra)
    assert learned(rewards), f"{recipe} did not raise its reward: {rewards}"


TOOL_REWARD = """
REWARD_TYPE = "sequential"

def compute_score(reward_input):
    return {"overall": float(reward_input["num_tool_calls"] > reward_input["num_tool_errors"])}
"""
CALL, ANSWER = "<code>print(1)</code>", "<answer>1</answer>"


def tool_run(model: Path, prompts: Path, out: Path, name: str, *extra: str) -> list[float]:
    """Agentic GRPO with the sandboxed Python tool (two turns) from `model`, paid 1 for a trajectory whose
    tool call ran: the share of trajectories that called the tool (`agent/called_tool`) at each step."""
    (out / "tool_reward.py").write_text(TOOL_REWARD)
    cfg = load_config(
        [
            f"worker.actor.model.model_path={model}",
            f"trainer.output_dir={out}",
            f"trainer.experiment_name={name}",
            f"data.train_files={prompts}",
            "data.val_files=",
            "data.max_prompt_length=64",  # one token a character: the chat template's tags are most of it
            "data.max_response_length=128",  # the call, the tool's reply in its user turn, a second turn
            "data.rollout_batch_size=4",
            "worker.rollout.n=4",
            "worker.actor.global_batch_size=2",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.actor.optim.lr=1e-3",
            "worker.rollout.agent.tools=[{name: python, import_path: 'builtin:python'}]",
            "worker.rollout.agent.tool_call_format=code",
            "worker.rollout.agent.max_turns=2",
            f"worker.reward.reward_function={out / 'tool_reward.py'}:compute_score",
            f"trainer.max_steps={STEPS}",
            "trainer.logger=[file]",
            "trainer.save_freq=-1",
            "trainer.save_model_only=true",
            "trainer.num_threads=1",
            *extra,
        ]
    )
    return [r["agent/called_tool"] for r in trained_rows(cfg)]


@pytest.fixture(scope="module")
def half_tool_model(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny model after SFT on 16 questions, each answered once with a tool call and once without: it
    calls the tool about half the time, for every question. Returns the model and the questions."""
    out = tmp_path_factory.mktemp("half_tool")
    questions = [f"{i}+{i % 7}=" for i in range(16)]
    sft = [{"problem": q, "answer": a} for q in questions for a in (CALL, ANSWER)]  # both, for every question
    (out / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    (out / "prompts.jsonl").write_text(
        "".join(json.dumps({"problem": q, "answer": "1"}) + "\n" for q in questions)
    )
    cfg = load_config(
        [
            f"worker.actor.model.model_path={tiny_model_dir}",
            f"trainer.output_dir={out}",
            "trainer.experiment_name=sft",
            f"data.train_files={out / 'sft.jsonl'}",
            "data.val_files=",
            "data.max_prompt_length=64",
            "data.max_response_length=32",
            "data.rollout_batch_size=8",
            "worker.actor.global_batch_size=8",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.actor.optim.lr=1e-2",
            "trainer.max_steps=300",
            "trainer.logger=[file]",
            "trainer.num_threads=1",
        ],
        rewards=False,
    )
    return run_sft(cfg), out / "prompts.jsonl"


def calls_more(called: list[float]) -> bool:
    """The check: over the last three steps 80% of trajectories call the tool, 0.15 more than over the first
    three. Measured (this CPU, 2026-11-30, data and sampling seeds 1-5): 0.48-0.65 over the first three steps,
    0.90-1.00 over the last three; with the advantages flipped (seed 1) 0.00 from step 9 on. 13 s for the run
    and 3 s for the module's SFT here."""
    return mean(called[-3:]) >= 0.8 and mean(called[-3:]) >= mean(called[:3]) + 0.15


def test_agentic_grpo_raises_tool_use(half_tool_model, tmp_path):
    called = tool_run(*half_tool_model, tmp_path, "tool")
    assert calls_more(called), f"tool use did not rise: {called}"


def test_agentic_grpo_with_flipped_advantages_drops_the_tool(half_tool_model, tmp_path, monkeypatch):
    flip_advantages(monkeypatch)
    called = tool_run(*half_tool_model, tmp_path, "flipped")
    assert not calls_more(called) and mean(called[-3:]) < 0.2, called
