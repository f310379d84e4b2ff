"""PyVision's reward, as its RL fork scores a trajectory: `builtin:pyvision`.

The fork (agents-x-project/PyVision-RL at 2c04517, the commit whose README the seed is) scores its data
sources with `compute_score` of `verl_agents/verl/utils/reward_score/vl_agent.py`, and its reward manager
(`verl/workers/reward_manager/naive.py`) adds the tool environment's rewards (0.1 for each code cell run,
`verl/workers/agent/envs/agents_x/safe_persis_python_exe_tool.py`) where the answer was judged right.
GRPO sums a trajectory's token rewards, so its score is

    overall = accuracy + 0.1 * code_cells      (the 0.1 terms only where the judge said right)

- the answer: the first `<answer>`, newline, `\\boxed{...}`, newline, `</answer>` in the response (tool
  replies included), the braces' content stripped. None, or one holding `<interpreter>`, `<answer>` or
  `\\boxed`, scores 0 without asking the judge.
- accuracy: the judge's verdict on (question, ground truth, answer): `JUDGE`, a two-answer consistency
  prompt, its reply read as vl_agent.py reads it (`parse_verdict`). An answer of 1000 characters or more
  scores 0 whatever the verdict; the verdict still decides the tool term, as there.
- code_cells: the turns whose code cell was run, whatever it printed or raised (a turn without a cell
  gets no 0.1 there either).
- no format term: vl_agent.py checks the `<think>` and `<answer>` tags and then leaves the result unused.

Where rlstack departs: the judge's prompt is rlstack's wording of the same judge (few-shot examples of a
short answer against a sentence, then the item, "Judgement:" to complete); the request is rlstack's judge
client's (temperature 0, retried, cached; PyVision samples at 0.3); a failed request follows
`worker.reward.judge.on_error` (PyVision's run would stop).
"""

from __future__ import annotations

import re
from typing import Any

from rlstack.rewards.inputs import question_of
from rlstack.rewards.judge import Messages, Template

REWARD_TYPE = "batch"

CELL_REWARD = 0.1
"""What the tool environment gives each code cell it runs."""
MAX_ANSWER_CHARS = 1000
"""An answer this long or longer scores 0 (vl_agent.py: "hack llm-as-judge")."""

_ANSWER = re.compile(r"<answer>\n\\boxed\{(.*?)\}\n</answer>", re.DOTALL)
_FORBIDDEN = ("<interpreter>", "<answer>", "\\boxed")


def extract_answer(response: str) -> str | None:
    """The answer PyVision reads, or None: the first boxed answer in its tags, unless it holds a tag or a box."""
    match = _ANSWER.search(response)
    if match is None:
        return None
    answer = match.group(1).strip()
    return None if any(s in answer for s in _FORBIDDEN) else answer


def code_cells(x: dict[str, Any]) -> int:
    """The turns of a trajectory whose code cell the tool ran (a parsed call, whatever came of it)."""
    return sum(
        1 for t in x.get("turns") or () if t["role"] == "assistant" and "name" in (t.get("tool_call") or {})
    )


# ---------------------------------------------------------------------------------------------------------
# The judge


_INSTRUCTIONS = """\
Each item below gives a question, its standard answer, and the answer taken from a model's output. Decide \
whether the model's answer is consistent with the standard answer: it is when both say essentially the same \
thing, even if one is a full sentence and the other a single word ('green' and 'the light is green'). Reply \
with the judgement alone: 1 if they are consistent, 0 if they are not."""

_EXAMPLES = (
    ("Is the umbrella red or yellow?", "The umbrella is yellow.", "yellow", 1),
    ("Which side of the road is the bus on?", "The bus is on the right side of the road.", "right", 1),
    ("Is the dog small and white?", "Yes, the dog is small and white.", "Yes", 1),
    ("Is the clock on the tower?", "No, the clock is on the wall.", "no", 1),
    (
        "Who is holding the kite?",
        "The girl is holding the kite.",
        "A child in the picture holds the kite.",
        1,
    ),
    ("Is the cup both full and hot?", "Yes, the cup is both full and hot.", "No.", 0),
    ("What colour is the bench near the tree?", "The bench near the tree is green.", "It is brown.", 0),
)


def _item(question: str, standard: str, answer: str) -> str:
    return f"Question: {question}\nStandard answer: {standard}\nModel answer: {answer}\nJudgement:"


def judge_prompt(question: str, answer: str, response: str) -> Messages:
    """The judge's messages for (question, ground truth, the extracted answer)."""
    shots = "\n\n".join(f"{_item(q, s, a)} {j}" for q, s, a, j in _EXAMPLES)
    user = f"{_INSTRUCTIONS}\n\n{shots}\n\n{_item(question, answer, response)}"
    return [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> tuple[str, float]:
    """vl_agent.py's reading: after the last `Judgement:`, 1 if a `1` is there, else 0 if a `0` is; without
    that label, 1 or 0 only when the reply is exactly that; anything else is 0 (never retried)."""
    reply = text.strip()
    if "Judgement:" in reply:
        tail = reply.split("Judgement:")[-1]
        verdict = "1" if "1" in tail else "0" if "0" in tail else "none"
    else:
        verdict = reply if reply in ("0", "1") else "none"
    return verdict, float(verdict == "1")


JUDGE = Template(judge_prompt, parse_verdict, "pyvision")
"""The judge `builtin:pyvision` asks about each answer, without the row's images (PyVision's is a text model)."""


# ---------------------------------------------------------------------------------------------------------
# The reward


def compute_score(reward_inputs: list[dict[str, Any]], judge=None) -> list[dict[str, Any]]:
    """One result per input: `overall`, `accuracy`, `tool` (the cells' 0.1s it got) and the extracted `answer`.

    `judge`: `RewardManager.ask_judge`; each extracted answer is sent with the row's question (`question_of`)
    and ground truth, all at once.
    """
    if judge is None:
        raise ValueError(
            "builtin:pyvision needs the run's judge: set worker.reward.judge.base_url (or LLM_AS_A_JUDGE_BASE)"
        )
    answers = [extract_answer(str(x["response"])) for x in reward_inputs]
    asked = [i for i, a in enumerate(answers) if a is not None]
    queries = [
        (question_of(reward_inputs[i]), str(reward_inputs[i]["ground_truth"]), answers[i]) for i in asked
    ]
    verdicts = dict(zip(asked, judge(queries, template=JUDGE, send_images=False))) if asked else {}
    out = []
    for i, (x, answer) in enumerate(zip(reward_inputs, answers)):
        right = verdicts.get(i, 0.0)
        accuracy = right if answer is not None and len(answer) < MAX_ANSWER_CHARS else 0.0
        tool = CELL_REWARD * code_cells(x) if right > 0.5 else 0.0
        out.append({"overall": accuracy + tool, "accuracy": accuracy, "tool": tool, "answer": answer or ""})
    return out
