"""An example reward function in EasyR1's batch interface, for the built-in addition task.

`overall` is the reward GRPO uses; `accuracy` and `digits` are logged as reward/accuracy and
reward/digits.
"""

from typing import Any

REWARD_TYPE = "batch"


def compute_score(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    scores = []
    for x in reward_inputs:
        response, answer = x["response"].strip(), str(x["ground_truth"]).strip()
        accuracy = float(response == answer)
        # Fraction of the answer's digits that are right, aligned from the last digit.
        same = sum(a == b for a, b in zip(reversed(response), reversed(answer)))
        digits = same / max(len(answer), len(response), 1)
        scores.append({"overall": accuracy, "accuracy": accuracy, "digits": digits})
    return scores
