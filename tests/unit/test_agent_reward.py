"""The agent composite reward: accuracy + format + a tool bonus only for correct answers that used a tool."""

from __future__ import annotations

import pytest

from rlstack.rewards.agent import compute_score, format_ok

GOOD = '<think>zoom in</think><tool_call>{"name": "zoom"}</tool_call> obs <answer>3</answer>'


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        (GOOD, True),
        ("<answer>3</answer>", True),
        ("<tool_call>{}</tool_call><tool_call>{} <answer>3</answer>", False),  # unbalanced tool tags
        ("<code>print(1)<answer>3</answer>", False),  # an unclosed code block
        ("<answer>3</answer> <answer>4</answer>", False),  # two answers
        ("no answer at all", False),
        ("<answer></answer>", False),  # empty
        ("<answer>" + "x" * 201 + "</answer>", False),  # too long
    ],
)
def test_format(response: str, ok: bool):
    assert format_ok(response, max_answer_chars=200) is ok


def test_deepeyes_weights_by_hand():
    inputs = [
        # correct, well formed, one successful tool call: 0.8 + 0.2 + 1.2
        {"response": GOOD, "ground_truth": "3", "num_tool_calls": 1, "num_tool_errors": 0},
        # correct and well formed, but the only tool call failed: no bonus
        {"response": GOOD, "ground_truth": "3", "num_tool_calls": 1, "num_tool_errors": 1},
        # wrong answer with a successful tool call: the tool alone earns nothing
        {"response": GOOD, "ground_truth": "4", "num_tool_calls": 2, "num_tool_errors": 0},
        # equivalent by math-verify, no tool, no think: 0.8 + 0.2
        {"response": r"<answer>\frac{1}{2}</answer>", "ground_truth": "0.5"},
        # text answers compare case- and punctuation-insensitively
        {"response": "<answer>The red car.</answer>", "ground_truth": "the red car"},
    ]
    out = compute_score(inputs)
    assert [o["overall"] for o in out] == pytest.approx([2.2, 1.0, 0.2, 1.0, 1.0])
    assert [o["tool"] for o in out] == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_the_judge_decides_only_what_the_rule_cannot():
    calls = []

    def judge(triples):
        calls.append(triples)
        return [1.0 for _ in triples]

    inputs = [
        {"response": "<answer>3</answer>", "ground_truth": "3", "prompt": "q1"},  # rule: correct
        {"response": "<answer>5</answer>", "ground_truth": "3", "prompt": "q2"},  # rule: wrong
        {
            "response": "<answer>a small dog</answer>",
            "ground_truth": "a puppy",
            "prompt": "q3",
        },  # undecidable
        {"response": "nothing", "ground_truth": "3", "prompt": "q4"},  # no answer: 0, never judged
    ]
    out = compute_score(inputs, judge=judge)
    assert calls == [[("q3", "a puppy", "a small dog", ())]]
    assert [o["accuracy"] for o in out] == [1.0, 0.0, 1.0, 0.0]


def test_without_a_judge_undecidable_answers_score_zero():
    out = compute_score([{"response": "<answer>a small dog</answer>", "ground_truth": "a puppy"}])
    assert out[0]["accuracy"] == 0.0 and out[0]["format"] == 1.0


def test_builtin_agent_is_the_composite():
    from rlstack.rewards.loader import load_reward_function

    fn = load_reward_function("builtin:agent")
    out = fn.fn([{"response": GOOD, "ground_truth": "3", "num_tool_calls": 1}])
    assert out[0]["overall"] == pytest.approx(2.2)
