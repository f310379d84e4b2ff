"""The composite reward of tool-using agents (DeepEyes style), EasyR1's batch interface.

    overall = accuracy_weight * accuracy + format_weight * format + tool_bonus * tool

- accuracy: the answer in the last `<answer>...</answer>` against the ground truth, by
  math-verify's equivalence, else by normalized text match; an optional `judge` callable decides
  the cases the rule cannot (e.g. free-text answers), or every answer with `judge_always` (DeepEyes'
  vl_agent reward asks its LLM judge about each one; CodeV's and PyVision's own rewards are `codev.py`
  and `pyvision.py`).
- format: the tool-call tags are balanced (`<tool_call>`/`</tool_call>` and `<code>`/`</code>`),
  there is exactly one answer, and it is at most `max_answer_chars` long.
- tool: 1 only when the answer is correct AND at least one tool call succeeded
  (`num_tool_calls > num_tool_errors` in the reward input), so that calling a tool is never
  rewarded on its own.

Defaults are DeepEyes' weights (0.8 / 0.2 / 1.2). The agent loop supplies `num_tool_calls` and
`num_tool_errors` in each reward input (0 when absent).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rlstack.rewards.math import extract_answer_tag, is_equivalent

REWARD_TYPE = "batch"

Judge = Callable[[list[tuple[str, str, str, Any]]], list[float]]
"""(question, ground truth, extracted answer, the row's images) per undecided row -> scores in [0, 1]."""

_TAG_PAIRS = (("<tool_call>", "</tool_call>"), ("<code>", "</code>"))


def format_ok(response: str, max_answer_chars: int) -> bool:
    """Balanced tool tags, exactly one complete answer, and a short enough answer."""
    for open_tag, close_tag in _TAG_PAIRS:
        if response.count(open_tag) != response.count(close_tag):
            return False
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return False
    answer = extract_answer_tag(response)
    return answer is not None and 0 < len(answer) <= max_answer_chars


def _normalize_text(text: str) -> str:
    return re.sub(r"[\s.]+$", "", re.sub(r"\s+", " ", text.strip().lower()))


def rule_accuracy(gold: str, answer: str | None) -> float | None:
    """1.0 / 0.0, or None when the rule cannot decide (for the judge)."""
    if answer is None:
        return 0.0
    if _normalize_text(answer) == _normalize_text(gold):
        return 1.0
    verdict, _ = is_equivalent(gold, answer)
    return None if verdict is None else float(verdict)


def compute_score(
    reward_inputs: list[dict[str, Any]],
    accuracy_weight: float = 0.8,
    format_weight: float = 0.2,
    tool_bonus: float = 1.2,
    max_answer_chars: int = 200,
    judge: Judge | None = None,
    judge_always: bool = False,
) -> list[dict[str, float]]:
    answers = [extract_answer_tag(str(x["response"])) for x in reward_inputs]
    if judge_always and judge is not None:  # vl_agent's way: the judge decides every answer there is
        accuracy = [0.0 if a is None else None for a in answers]
    else:
        accuracy = [rule_accuracy(str(x["ground_truth"]), a) for x, a in zip(reward_inputs, answers)]
    undecided = [i for i, acc in enumerate(accuracy) if acc is None]
    if undecided and judge is not None:
        queries = [
            (
                str(reward_inputs[i].get("prompt", "")),
                str(reward_inputs[i]["ground_truth"]),
                str(answers[i]),
                reward_inputs[i].get("images") or (),
            )
            for i in undecided
        ]
        for i, score in zip(undecided, judge(queries)):
            accuracy[i] = min(max(float(score), 0.0), 1.0)
    out = []
    for x, acc in zip(reward_inputs, accuracy):
        acc = acc or 0.0
        fmt = float(format_ok(str(x["response"]), max_answer_chars))
        tool_ok = int(x.get("num_tool_calls", 0)) > int(x.get("num_tool_errors", 0))
        tool = float(acc >= 0.5 and tool_ok)
        overall = accuracy_weight * acc + format_weight * fmt + tool_bonus * tool
        out.append({"overall": overall, "accuracy": acc, "format": fmt, "tool": tool})
    return out
