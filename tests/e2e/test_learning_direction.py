"""Tests that fail when learning breaks, not only when numbers change: GRPO on the random tiny model raises
the reward it is given, and each of three faults that keep every number finite makes the same check fail: the
advantages' sign flipped (the reward falls instead), a learning rate of zero, and a loss detached from the
log-probs (no gradient reaches the weights). The run is `digits_run`'s (the reward: the share of digits in the
response) at a learning rate that moves the tiny model within a few steps."""

from __future__ import annotations

import json

import pytest
from digits_run import digits_run

import rlstack.algos.actor_loss as actor_loss
import rlstack.algos.step as algo_step
from rlstack.trainer import Trainer

STEPS = 16
pytestmark = pytest.mark.slow


def scores(tiny_model_dir, tmp_path, name: str, *extra: str) -> list[float]:
    """The mean reward of each step's rollouts."""
    cfg = digits_run(tiny_model_dir, tmp_path, name, "worker.actor.optim.lr=1e-2", *extra, steps=STEPS)
    Trainer(cfg).fit()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return [r["critic/score/mean"] for r in rows]


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
