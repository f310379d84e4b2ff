"""Built-in reward functions, in EasyR1's batch interface.

Each takes `reward_inputs` (dicts with `response`, `ground_truth`, ...) and returns one dict per
input with `overall` (the reward) and other components that are logged as `reward/<key>`.
"""

from __future__ import annotations

import re
from typing import Any

REWARD_TYPE = "batch"

_BOXED = re.compile(r"\\boxed\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def exact_match(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """1 when the stripped response equals the stripped ground truth, else 0."""
    out = []
    for x in reward_inputs:
        hit = float(str(x["response"]).strip() == str(x["ground_truth"]).strip())
        out.append({"overall": hit, "accuracy": hit})
    return out


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}`, braces balanced; None when there is none."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(response: str) -> str:
    """The answer part of a response: `<answer>` tags, else the last `\\boxed{}`, else the whole text."""
    tags = _ANSWER_TAG.findall(response)
    if tags:
        response = tags[-1]
    boxed = extract_boxed(response)
    return (boxed if boxed is not None else response).strip()


def math(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Mathematical equivalence of the extracted answer and the ground truth, by math-verify."""
    from math_verify import parse, verify

    out = []
    for x in reward_inputs:
        answer = extract_answer(str(x["response"]))
        gold = parse(f"${x['ground_truth']}$")
        pred = parse(f"${answer}$") if answer else []
        hit = float(bool(gold) and bool(pred) and verify(gold, pred))
        out.append({"overall": hit, "accuracy": hit})
    return out


BUILTINS = {"exact_match": exact_match, "math": math}
