"""CodeV's TAPO reward, as its RL code scores a trajectory: `builtin:codev`.

CodeV (RenlyH/CodeV_internal at c7eed11, `rl/verl/utils/reward_score/vl_agent.py`:
`compute_score_generative`, called for its data sources by `_batched_compute_score` of
`verl/utils/reward_score/__init__.py` through veRL's batch reward manager, as `examples/agent/codev_7b_H200.sh`
sets) scores each trajectory

    overall = 1.0 * accuracy + 0.3 * format + 0.5 * tool

- the answer: in the text after the last `</think>`, what the last `<answer>` holds up to its `</answer>`;
  where there is no `<answer>`, or the last is never closed, the last `\\boxed{...}` there (braces not
  nested). An empty `<answer></answer>` is an answer, the empty one.
- accuracy: 1 when math-verify finds the answer equal to the ground truth (`verify(parse(truth),
  parse(answer))`), else the judge's TRUE/FALSE verdict (`VERIFY`, read by `parse_verify`); no answer: 0,
  not judged.
- format: 1, or 0 when any of these holds (`format_errors`): `<code>`/`</code>` or `<think>`/`</think>` counts
  differ; a `<code>` after the last `</answer>` (with no `</answer>` at all, anywhere); `<answer>` and
  `</answer>` counts differ after the last `</think>`; a tagged answer with more than one `<answer>` there;
  no answer, or a boxed answer that is one of several `\\boxed{}`.
- tool: TAPO's process reward, the judge's grade in [0, 1] of how the trajectory used its tools (`RUBRIC`,
  read by `parse_grade`), asked for every row, answer or not. The rubric is chosen by data source
  (`rubric_of`: CodeV's visual-search sources by `search`, IconQA by `counting`, the others by
  `calculation`; `worker.reward.codev.rubric_by_source` names more). The judge sees the question, the row's
  images, the response's last 6000 characters and the first 3 images the tools returned.

Where rlstack departs:
- the prompts are rlstack's wording of CodeV's (the same checks and grades, in rlstack's words); the images
  go before the text of the request, which says which are the question's and which the tools', where CodeV
  interleaves them with its sections; a row without images whose tools made none is graded on the same
  sections as text (CodeV would send the judge only the rubric's last line);
- the requests are rlstack's judge client's: chat completions at temperature 0, retried, cached, a failure
  following `worker.reward.judge.on_error` (CodeV asks the verifier through the Responses API at
  temperature 1 with minimal reasoning effort, the rubric at 0.7, and scores a row whose scoring raised 0
  in every term);
- the question is the row's `question` field, else its last user message (`question_of`); CodeV reads only
  the field (without it, no tool use is graded, 0, and a row that needs the verifier scores 0 in every term);
- CodeV also checks that `<|vision_start|><|image_pad|>` and `<|image_pad|><|vision_end|>` pair up, which
  only a response cut inside an image fails: rlstack's responses never are, and their text leaves special
  tokens out;
- math-verify gets 5 s per call where it can stop one (the main thread), as `builtin:math` does; CodeV
  turns math-verify's timeouts off.
"""

from __future__ import annotations

import re
from typing import Any

from rlstack.config.reward import route_of
from rlstack.rewards.inputs import question_of
from rlstack.rewards.judge import Messages, Template
from rlstack.rewards.math import _timeouts

REWARD_TYPE = "batch"

WEIGHTS = {"accuracy": 1.0, "format": 0.3, "tool": 0.5}
"""CodeV's weights of its three terms."""
RESPONSE_CHARS = 6000
"""The rubric judge sees the response's last this many characters."""
TOOL_IMAGES = 3
"""The rubric judge sees at most this many of the images the tools returned."""

CODEV_SOURCES = {"vstar": "search", "chart": "search", "high_res": "search", "IconQA": "counting"}
"""CodeV's own data sources with a rubric other than `calculation`."""

_BOXED = re.compile(r"\\boxed{([^}]+)}", re.DOTALL)


def after_think(response: str) -> str:
    return response.split("</think>")[-1].strip()


def _tagged(tail: str) -> str | None:
    """What the last `<answer>` of `tail` holds up to its `</answer>`; None: no `<answer>`, or never closed."""
    last = tail.split("<answer>")[-1] if "<answer>" in tail else ""
    return last.split("</answer>")[0].strip() if "</answer>" in last else None


def extract_answer(response: str) -> str | None:
    """After the last `</think>`: the last `<answer>`'s content, else the last `\\boxed{}`'s; None: neither."""
    tail = after_think(response)
    tagged = _tagged(tail)
    if tagged is not None:
        return tagged
    boxed = _BOXED.findall(tail)
    return boxed[-1] if boxed else None


def format_errors(response: str) -> list[str]:
    """What breaks CodeV's format rule (empty: the format term is 1)."""
    tail = after_think(response)
    errors = [
        f"{a} and {b} do not pair up"
        for a, b in (("<code>", "</code>"), ("<think>", "</think>"))
        if response.count(a) != response.count(b)
    ]
    if "<code>" in response.split("</answer>")[-1]:
        errors.append("<code> after the last </answer> (or no </answer>)")
    if tail.count("<answer>") != tail.count("</answer>"):
        errors.append("<answer> and </answer> do not pair up after </think>")
    if _tagged(tail) is not None:
        if tail.count("<answer>") > 1:
            errors.append("more than one <answer>")
    elif (boxed := len(_BOXED.findall(tail))) != 1:
        errors.append("no answer" if boxed == 0 else "more than one \\boxed{}")
    return errors


def math_equal(truth: str, answer: str) -> bool:
    """math-verify's verdict on the two, each parsed with its default extraction."""
    from math_verify import parse, verify

    timeout = _timeouts(5)
    try:
        return bool(
            verify(
                parse(truth, parsing_timeout=timeout),
                parse(answer, parsing_timeout=timeout),
                timeout_seconds=timeout,
            )
        )
    except Exception:
        return False


def rubric_of(source: str, rubric_by_source: dict[str, str]) -> str:
    """The rubric of a data source: `rubric_by_source` (names, then patterns), then CodeV's own, else
    `calculation`."""
    k = route_of(source, list(rubric_by_source))
    if k is None:
        return CODEV_SOURCES.get(source, "calculation")
    rubric = list(rubric_by_source.values())[k]
    if rubric not in RUBRICS:  # reward_function_kwargs pass by the config's own check of the key
        raise ValueError(
            f"rubric_by_source gives data source {source!r} the rubric {rubric!r}, which CodeV does not have: "
            f"use one of {sorted(RUBRICS)} (worker.reward.codev.rubric_by_source)"
        )
    return rubric


# ---------------------------------------------------------------------------------------------------------
# The judge: the answer's verdict


def verify_prompt(question: str, answer: str, response: str) -> Messages:
    """The verifier's message for (question, ground truth, the extracted answer)."""
    user = (
        "Does the student answer mean strictly the same as the reference answer? Wording and format may "
        "differ; a different value, a missing part or an added claim may not. The reference answer is always "
        "correct.\nReply with one word, TRUE or FALSE, and nothing else.\n\n"
        f"Question:\n{question}\n\nReference answer:\n{answer}\n\nStudent answer:\n{response}"
    )
    return [{"role": "user", "content": user}]


def parse_verify(text: str) -> tuple[str, float]:
    """CodeV's reading: lower-cased, after the last `## Equivalence Judgement` if the reply has one, TRUE when
    `true` appears and `false` does not; anything else is FALSE (never retried)."""
    tail = text.split("## Equivalence Judgement")[-1].lower()
    verdict = "TRUE" if "true" in tail and "false" not in tail else "FALSE"
    return verdict, float(verdict == "TRUE")


VERIFY = Template(verify_prompt, parse_verify, "codev_verify")
"""The judge `builtin:codev` asks about an answer math-verify does not find equal, without images."""


# ---------------------------------------------------------------------------------------------------------
# The judge: the tool-use grade (TAPO's process reward)


_READ = """\
The agent reasons inside <think></think>, writes Python inside <code></code> and answers inside \
<answer></answer>; what a program printed comes back inside <sandbox_output></sandbox_output>, and the \
images its programs produced are shown to you, marked as the agent's."""

RUBRICS: dict[str, str] = {
    "search": f"""\
You grade how well an agent used Python tools to answer a question about an image.
{_READ}

Check in this order.
1. Give 0 at once when: there is no Python <code>, or the code only prints or holds comments; the code \
does nothing to the image (no loading, cropping or resizing); or the code is far more elaborate than the \
question calls for (a sign of gaming the grade).
2. Otherwise look at the images the agent's code produced:
   - 1 when at least one of them shows the region or object the question asks about;
   - 0.75 when one shows it only in part;
   - 0.25 when none shows it (the tool use missed the evidence).""",
    "calculation": f"""\
You grade the reasoning and the tool use of an agent that may run Python to work a problem out.
{_READ}

Check in this order.
1. Give 0 at once when: the code only prints an answer, computing or parsing nothing; the code does \
many things, none of them relevant to this problem; the reasoning is wrong from the start or made up; or \
the code is far more elaborate than the question calls for.
2. Otherwise:
   - 1 for sound, well-argued reasoning (code is optional: good reasoning without code scores high);
   - 0.75 when the code really computes and the sandbox shows meaningful output, not errors;
   - 0.5 when the reasoning or the computation is only partly there, or when the sandbox showed an error \
that the agent then fixed;
   - 0.25 when the reasoning is weak, the code (if any) does not help, or the reasoning did not change \
after a sandbox error.
3. Guard against gaming: elaborate code must be borne out by what the sandbox printed; a sandbox that \
shows only the final answer and no step before it is probably faked (0.25 at most).""",
    "counting": f"""\
You grade an agent's counting or detection work on an image.
{_READ}
Counting has to be done systematically in code to score well.

Check in this order.
1. Give 0 at once when: there is no Python <code> (counting by eye is not accepted); the code only prints \
a count without any detection or counting logic; the code is elaborate but the sandbox shows no detection \
step; or the code does many things, none of which helps to count.
2. Otherwise:
   - 1 for systematic counting code whose sandbox output shows clear detection steps;
   - 0.75 for a sound counting approach with reasonable sandbox output;
   - 0.5 when the counting code is incomplete, or when the sandbox showed an error that the agent then fixed;
   - 0.25 when the reasoning did not change after a sandbox error.
3. Guard against gaming: elaborate code must be borne out by the sandbox ("found 7 regions", "detected 3 \
objects"); a sandbox that shows only the final count is probably faked (0); vague output after heavy \
filtering or thresholding is gaming.""",
}
"""The system prompt of each rubric (`config.reward.CODEV_RUBRICS`)."""

_GRADES = "Reply with a single number, 0, 0.25, 0.5, 0.75 or 1, and no explanation."


def rubric_content(question: str, row_images: int, response: str, tool_images: int) -> str:
    """The request's text: the question, which images are which, the response, then the grades to give."""
    shown = []
    if row_images:
        shown.append(f"the first {row_images} are the question's")
    if tool_images:
        shown.append(f"the last {tool_images} are images the agent's code produced")
    images = f"Images above: {'; '.join(shown)}.\n\n" if shown else ""
    produced = "" if tool_images else "The agent's code produced no image.\n\n"
    return (
        f"{images}## Question\n{question}\n\n---\n## The agent's response\n{response}\n\n---\n{produced}"
        f"{_GRADES}"
    )


def rubric_prompt(question: str, answer: str, response: str) -> Messages:
    """(question, the rubric's system prompt, `rubric_content`) -> the grader's messages."""
    return [{"role": "system", "content": answer}, {"role": "user", "content": response}]


_NUMBER = re.compile(r"(\d+\.?\d*)")


def parse_grade(text: str) -> tuple[str, float]:
    """CodeV's reading: the first number in the reply, clamped to [0, 1]; none: 0 (never retried)."""
    match = _NUMBER.search(text)
    if match is None:
        return "none", 0.0
    grade = min(max(float(match.group(1)), 0.0), 1.0)
    return f"{grade:g}", grade


RUBRIC = Template(rubric_prompt, parse_grade, "codev_rubric")
"""The judge `builtin:codev` asks to grade each trajectory's tool use, with the images."""


# ---------------------------------------------------------------------------------------------------------
# The reward


def compute_score(
    reward_inputs: list[dict[str, Any]], rubric_by_source: dict[str, str] | None = None, judge=None
) -> list[dict[str, Any]]:
    """One result per input: `overall`, `accuracy`, `format`, `tool`, and the extracted `answer` and the
    `rubric` it was graded by.

    `judge`: `RewardManager.ask_judge`: the answers math-verify does not settle are sent together (`VERIFY`),
    then every row's tool use (`RUBRIC`, with images); `rubric_by_source`: `worker.reward.codev.rubric_by_source`.
    """
    if judge is None:
        raise ValueError(
            "builtin:codev needs the run's judge: set worker.reward.judge.base_url (or LLM_AS_A_JUDGE_BASE)"
        )
    responses = [str(x["response"]) for x in reward_inputs]
    answers = [extract_answer(r) for r in responses]
    accuracy = [
        0.0 if a is None else 1.0 if math_equal(str(x["ground_truth"]), a) else None
        for x, a in zip(reward_inputs, answers)
    ]
    asked = [i for i, acc in enumerate(accuracy) if acc is None]
    if asked:
        queries = [
            (question_of(reward_inputs[i]), str(reward_inputs[i]["ground_truth"]), answers[i]) for i in asked
        ]
        for i, verdict in zip(asked, judge(queries, template=VERIFY, send_images=False)):
            accuracy[i] = verdict
    rubrics = [rubric_of(str(x.get("data_source", "")), rubric_by_source or {}) for x in reward_inputs]
    grading = []
    for x, response, rubric in zip(reward_inputs, responses, rubrics):
        row, made = list(x.get("images") or ()), list(x.get("tool_images") or ())[:TOOL_IMAGES]
        question = question_of(x)
        content = rubric_content(question, len(row), response[-RESPONSE_CHARS:], len(made))
        grading.append((question, RUBRICS[rubric], content, row + made))
    tool = judge(grading, template=RUBRIC, send_images=True)
    out = []
    for acc, response, answer, rubric, grade in zip(accuracy, responses, answers, rubrics, tool):
        terms = {"accuracy": float(acc or 0.0), "format": float(not format_errors(response)), "tool": grade}
        overall = sum(WEIGHTS[k] * v for k, v in terms.items())
        out.append({"overall": overall, **terms, "answer": answer or "", "rubric": rubric})
    return out
