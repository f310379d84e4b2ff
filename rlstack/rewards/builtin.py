"""Built-in reward functions, in EasyR1's batch interface.

Each takes `reward_inputs` (dicts with `response`, `ground_truth`, ...) and returns one dict per
input with `overall` (the reward) and other components that are logged as `reward/<key>`.
"""

from __future__ import annotations

from typing import Any

REWARD_TYPE = "batch"


def exact_match(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """1 when the stripped response equals the stripped ground truth, else 0."""
    out = []
    for x in reward_inputs:
        hit = float(str(x["response"]).strip() == str(x["ground_truth"]).strip())
        out.append({"overall": hit, "accuracy": hit})
    return out


def math(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1) -> list[dict[str, float]]:
    """Math answers by math-verify (`rlstack.rewards.math`): overall = (1 - w) * accuracy + w * format."""
    from rlstack.rewards import math as math_reward

    return math_reward.compute_score(reward_inputs, format_weight=format_weight)


def code(reward_inputs: list[dict[str, Any]], mode: str = "fraction") -> list[dict[str, float]]:
    """Unit tests from `ground_truth` run in the sandbox (`rlstack.rewards.code`); overall = pass rate."""
    from rlstack.rewards import code as code_reward

    return code_reward.compute_score(reward_inputs, mode=mode)


def agent(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Tool-using agents (`rlstack.rewards.agent`): 0.8 accuracy + 0.2 format + 1.2 tool bonus, as DeepEyes."""
    from rlstack.rewards import agent as agent_reward

    return agent_reward.compute_score(reward_inputs)


BUILTINS = {"exact_match": exact_match, "math": math, "code": code, "agent": agent}
