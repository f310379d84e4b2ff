"""Built-in reward functions, in EasyR1's batch interface.

Each takes `reward_inputs` (dicts with `response`, `ground_truth`, ...) and returns one dict per
input with `overall` (the reward) and other components that are logged as `reward/<key>`. A built-in
with a config section (`worker.reward.<name>`) has beside it the function that reads the section into
its keyword arguments, registered with it in `BUILTINS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlstack.config.reward import RewardConfig

REWARD_TYPE = "batch"

AskJudge = Callable[..., list[float]]
"""The run's judge (`RewardManager.ask_judge`): (question, reference, response[, images]) -> score, in order;
with the configured template unless given one (`template=`, `send_images=`)."""


def exact_match(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """1 when the stripped response equals the stripped ground truth, else 0."""
    out = []
    for x in reward_inputs:
        hit = float(str(x["response"]).strip() == str(x["ground_truth"]).strip())
        out.append({"overall": hit, "accuracy": hit})
    return out


def math(
    reward_inputs: list[dict[str, Any]], format_weight: float = 0.1, **settings: Any
) -> list[dict[str, Any]]:
    """Math answers by math-verify (`rlstack.rewards.math`): overall = (1 - w) * accuracy + w * format.

    `settings`: `fallback` (judge for unparseable answers), `timeout_seconds`, `max_answer_chars`,
    `numeric_answers` (from `worker.reward.math`). Each result also carries the extracted answer and the reason.
    """
    from rlstack.rewards import math as math_reward

    details = math_reward.score_details(reward_inputs, format_weight=format_weight, **settings)
    return [d.scores() | {"answer": d.answer or "", "reason": d.reason} for d in details]


def math_settings(cfg: RewardConfig, judge: AskJudge | None) -> dict[str, Any]:
    """`math`'s keyword arguments from `worker.reward.math`: the judge is its fallback where asked for."""
    m = cfg.math
    return {
        "format_weight": m.format_weight,
        "fallback": judge if m.judge_fallback else None,
        "timeout_seconds": m.timeout_s,
        "max_answer_chars": m.max_answer_chars,
        "numeric_answers": m.numeric_answers,
    }


def code(
    reward_inputs: list[dict[str, Any]], mode: str = "fraction", **settings: Any
) -> list[dict[str, Any]]:
    """Unit tests from `ground_truth` run in the sandbox (`rlstack.rewards.code`); overall = pass rate.

    `settings`: `stop_at_first_failure`, `stop_at_first_timeout`, `test_time_s`, `total_time_s`,
    `memory_mb`, `runner` (from `worker.reward.code`). Each result also carries the status of the
    first failure and its reason.
    """
    from rlstack.rewards import code as code_reward

    return code_reward.compute_score(reward_inputs, mode=mode, **settings)


def code_settings(cfg: RewardConfig, judge: AskJudge | None) -> dict[str, Any]:
    """`code`'s keyword arguments from `worker.reward.code`, with the sandbox it names."""
    from rlstack.rewards.sandbox_fusion import make_runner

    c = cfg.code
    return {
        "mode": c.mode,
        "stop_at_first_failure": c.stop_at_first_failure,
        "stop_at_first_timeout": c.stop_at_first_timeout,
        "test_time_s": c.test_time_s,
        "total_time_s": c.total_time_s,
        "memory_mb": c.memory_mb,
        "runner": make_runner(c.sandbox, c.sandbox_url or None),
    }


def agent(reward_inputs: list[dict[str, Any]], **settings: Any) -> list[dict[str, float]]:
    """Tool-using agents (`rlstack.rewards.agent`): 0.8 accuracy + 0.2 format + 1.2 tool bonus, as DeepEyes.

    `settings`: the weights, `max_answer_chars` and `judge` (from `worker.reward.agent`).
    """
    from rlstack.rewards import agent as agent_reward

    return agent_reward.compute_score(reward_inputs, **settings)


def agent_settings(cfg: RewardConfig, judge: AskJudge | None) -> dict[str, Any]:
    """`agent`'s keyword arguments from `worker.reward.agent`: the judge where it falls back to it or always
    asks it."""
    a = cfg.agent
    return {
        "accuracy_weight": a.accuracy_weight,
        "format_weight": a.format_weight,
        "tool_bonus": a.tool_bonus,
        "max_answer_chars": a.max_answer_chars,
        "judge": judge if a.judge_fallback or a.judge_always else None,
        "judge_always": a.judge_always,
    }


def pyvision(reward_inputs: list[dict[str, Any]], judge=None) -> list[dict[str, Any]]:
    """PyVision's reward as its RL fork scores (`rlstack.rewards.pyvision`): the judge's verdict on the boxed
    answer, plus 0.1 per code cell run where it is right.

    `judge`: `RewardManager.ask_judge`, asked with PyVision's own prompt.
    """
    from rlstack.rewards import pyvision as pyvision_reward

    return pyvision_reward.compute_score(reward_inputs, judge=judge)


def codev(reward_inputs: list[dict[str, Any]], judge=None, **settings: Any) -> list[dict[str, Any]]:
    """CodeV's TAPO reward (`rlstack.rewards.codev`): accuracy (math-verify, else the judge) + 0.3 format + 0.5
    tool use graded by the judge against a rubric.

    `settings`: `rubric_by_source` (from `worker.reward.codev`); `judge`: `RewardManager.ask_judge`, asked with
    CodeV's own prompts.
    """
    from rlstack.rewards import codev as codev_reward

    return codev_reward.compute_score(reward_inputs, judge=judge, **settings)


def codev_settings(cfg: RewardConfig, judge: AskJudge | None) -> dict[str, Any]:
    """`codev`'s keyword arguments from `worker.reward.codev`."""
    return {"rubric_by_source": dict(cfg.codev.rubric_by_source)}


def judge(reward_inputs: list[dict[str, Any]], judge=None) -> list[dict[str, float]]:
    """Every response scored by the LLM judge (`worker.reward.judge`): overall = judge = its score.

    `judge`: `RewardManager.ask_judge`, sent (question, reference, response, images) per row: the question is
    the row's `question` field, else the text of its last user message before the chat template, else the
    prompt (`inputs.question_of`); the reference is the ground truth; the images go where `judge.send_images`
    is set.
    """
    from rlstack.rewards.inputs import question_of

    if judge is None:
        raise ValueError("builtin:judge is called with the judge of worker.reward.judge")
    queries = [
        (question_of(x), str(x["ground_truth"]), str(x["response"]), x.get("images") or ())
        for x in reward_inputs
    ]
    return [{"overall": s, "judge": s} for s in judge(queries)]


def reward_model(reward_inputs: list[dict[str, Any]], model=None) -> list[dict[str, float]]:
    """A reward model's score of each prompt and response (`rlstack.rewards.reward_model`): overall = rm_score.

    `model`: the loaded `RewardModel` (from `worker.reward.reward_model`, loaded once per run).
    """
    if model is None:
        raise ValueError("builtin:reward_model is called with the model of worker.reward.reward_model")
    return model.score(reward_inputs)


def reward_model_settings(cfg: RewardConfig, judge: AskJudge | None) -> dict[str, Any]:
    """`reward_model`'s keyword argument: the model of `worker.reward.reward_model`, loaded."""
    from rlstack.rewards.reward_model import RewardModel

    return {"model": RewardModel(cfg.reward_model)}


@dataclass(frozen=True)
class Builtin:
    """A built-in reward function and what its config section gives it."""

    fn: Callable[..., list[dict[str, Any]]]
    settings: Callable[[RewardConfig, AskJudge | None], dict[str, Any]] | None = None
    """Its keyword arguments from its section, given the run's judge (None: the run has none); called once
    per run however many times the built-in is named, and `reward_function_kwargs` win over them. None: it
    takes none."""
    asks_judge: Callable[[RewardConfig], bool] | None = None
    """Whether its section asks for the judge (a `judge_fallback` key); None: it does not. A built-in with a
    parameter named `judge` (`builtin:judge`) asks for it by that, as a user's function does."""


BUILTINS: dict[str, Builtin] = {
    "exact_match": Builtin(exact_match),
    "math": Builtin(math, math_settings, lambda cfg: cfg.math.judge_fallback),
    "code": Builtin(code, code_settings),
    "agent": Builtin(agent, agent_settings, lambda cfg: cfg.agent.judge_fallback or cfg.agent.judge_always),
    "pyvision": Builtin(pyvision),
    "codev": Builtin(codev, codev_settings),
    "judge": Builtin(judge),
    "reward_model": Builtin(reward_model, reward_model_settings),
}
"""The built-ins, by the name that follows `builtin:`."""
