"""Reward functions: loading by reference, the manager's contract checks, and the built-ins."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from scored_batches import make_batch

from rlstack.batch_metrics import reward_component_means
from rlstack.config import RewardConfig
from rlstack.errors import RLStackError
from rlstack.rewards import builtin
from rlstack.rewards.loader import RewardLoadError, load_reward_function
from rlstack.rewards.manager import RewardError, RewardManager, reward_inputs


def write_module(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source).lstrip())
    return path


BATCH_FN = """
REWARD_TYPE = "batch"


def score(reward_inputs, bonus=0.0):
    out = []
    for x in reward_inputs:
        hit = float(x["response"].strip() == str(x["ground_truth"]))
        out.append({"overall": hit + bonus, "accuracy": hit, "length": float(x["response_length"])})
    return out


def _private():
    pass
"""

SEQUENTIAL_FN = """
REWARD_TYPE = "sequential"


def score(x):
    return {"overall": 2.0 * float(x["response"] == x["ground_truth"]), "extra_i": float(x["extra"]["i"])}
"""


# ----------------------------------------------------------------------------------------- loading


def test_load_batch_function_from_file(tmp_path):
    path = write_module(tmp_path / "my_reward.py", BATCH_FN)
    rf = load_reward_function(f"{path}:score")
    assert rf.reward_type == "batch"
    assert rf.name == f"{path}:score"
    assert rf.fn([{"response": "3", "ground_truth": "3", "response_length": 1}]) == [
        {"overall": 1.0, "accuracy": 1.0, "length": 1.0}
    ]


def test_load_sequential_function_from_file(tmp_path):
    path = write_module(tmp_path / "seq_reward.py", SEQUENTIAL_FN)
    rf = load_reward_function(f"{path}:score")
    assert rf.reward_type == "sequential"
    assert rf.fn({"response": "a", "ground_truth": "a", "extra": {"i": 4}}) == {
        "overall": 2.0,
        "extra_i": 4.0,
    }


def test_default_reward_type_is_batch(tmp_path):
    path = write_module(tmp_path / "plain.py", "def f(xs):\n    return [{'overall': 0.0} for _ in xs]\n")
    assert load_reward_function(f"{path}:f").reward_type == "batch"


VERL_FN = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    right = solution_str.strip() == ground_truth
    return {"score": float(right) + 0.1 * extra_info["i"], "acc": float(right)} if data_source else 0.0
"""

DEEPEYES_FN = """
def compute_score(predict_str, ground_truth, extra_info=None):
    return float(predict_str == ground_truth)
"""


def test_a_verl_style_reward_function_scores_each_sample(tmp_path):
    """veRL's signature (data_source, solution_str, ground_truth, extra_info; a number, or a dict with
    `score`) and DeepEyes' (predict_str, ...) are called per sample, with `score` as the reward."""
    verl = load_reward_function(f"{write_module(tmp_path / 'verl_reward.py', VERL_FN)}:compute_score")
    assert verl.reward_type == "sequential"
    out = RewardManager(RewardConfig(), [verl]).score(make_batch(["4", "5"], ["4", "4"]))
    assert out["reward_components"] == [{"overall": 1.0, "acc": 1.0}, {"overall": 0.1, "acc": 0.0}]
    assert out["scores"].tolist() == pytest.approx([1.0, 0.1])
    deepeyes = load_reward_function(f"{write_module(tmp_path / 'de_reward.py', DEEPEYES_FN)}:compute_score")
    out = RewardManager(RewardConfig(), [deepeyes]).score(make_batch(["4", "5"], ["4", "4"]))
    assert out["scores"].tolist() == [1.0, 0.0]


EASYR1_MATH = r"""
import re
from typing import Any

from mathruler.grader import extract_boxed_content, grade_answer

REWARD_NAME = "math"
REWARD_TYPE = "batch"


def format_reward(response: str) -> float:
    return 1.0 if re.fullmatch(r"<think>.*</think>.*\\boxed\{.*\}.*", response, re.DOTALL) else 0.0


def accuracy_reward(response: str, ground_truth: str) -> float:
    return 1.0 if grade_answer(extract_boxed_content(response), ground_truth) else 0.0


def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1) -> list[dict[str, float]]:
    scores = []
    for reward_input in reward_inputs:
        response = re.sub(r"\s*(<|>|/)\s*", r"\1", reward_input["response"])
        format_score = format_reward(response)
        accuracy_score = accuracy_reward(response, reward_input["ground_truth"])
        scores.append(
            {
                "overall": (1 - format_weight) * accuracy_score + format_weight * format_score,
                "format": format_score,
                "accuracy": accuracy_score,
            }
        )
    return scores
"""
"""A reward file in the shape of EasyR1's examples/reward_function/math.py (seeds/easyr1-guide.md, "Reward
Functions": REWARD_NAME, REWARD_TYPE = "batch", compute_score(reward_inputs, **kwargs) -> [{"overall", ...}]),
grading with EasyR1's grader, `mathruler` (the `math` extra)."""


def test_an_easyr1_reward_file_with_mathruler_runs_through_the_reward_manager(tmp_path):
    path = write_module(tmp_path / "math.py", EASYR1_MATH)
    cfg = RewardConfig(reward_function=f"{path}:compute_score", reward_function_kwargs={"format_weight": 0.5})
    manager = RewardManager.of(cfg, max_response_length=8)
    responses = [r"<think>half</think> \boxed{\frac{1}{2}}", r"\boxed{0.5}", r"<think>x</think> \boxed{3}"]
    out = manager.score(make_batch(responses, ["0.5", "0.5", "4"]))
    assert out["scores"].tolist() == [1.0, 0.5, 0.5]
    assert [c["accuracy"] for c in out["reward_components"]] == [1.0, 1.0, 0.0]
    assert [c["format"] for c in out["reward_components"]] == [1.0, 0.0, 1.0]


def test_load_from_module_path(tmp_path, monkeypatch):
    write_module(tmp_path / "rlstack_test_user_rewards.py", SEQUENTIAL_FN)
    monkeypatch.syspath_prepend(str(tmp_path))
    rf = load_reward_function("rlstack_test_user_rewards:score")
    assert rf.reward_type == "sequential"
    assert load_reward_function("rlstack.rewards.builtin:exact_match").fn is builtin.exact_match


def test_load_builtins():
    assert load_reward_function("builtin:exact_match").fn is builtin.exact_match
    assert load_reward_function("builtin:math").fn is builtin.math
    with pytest.raises(
        RewardLoadError, match="no such built-in; built-ins are builtin:exact_match, builtin:math"
    ):
        load_reward_function("builtin:nope")


def test_missing_file(tmp_path):
    with pytest.raises(RewardLoadError, match=r"file '.*missing\.py' does not exist"):
        load_reward_function(f"{tmp_path}/missing.py:score")


def test_missing_function_lists_the_functions_there(tmp_path):
    path = write_module(tmp_path / "my_reward.py", BATCH_FN)
    with pytest.raises(RewardLoadError) as info:
        load_reward_function(f"{path}:scor")
    msg = str(info.value)
    assert "has no function 'scor'" in msg
    assert "functions there: ['score']" in msg  # private helpers are not offered


def test_bad_reward_type(tmp_path):
    path = write_module(tmp_path / "bad_type.py", "REWARD_TYPE = 'batched'\n\ndef f(xs):\n    return []\n")
    with pytest.raises(RewardLoadError, match="REWARD_TYPE must be 'batch' or 'sequential', got 'batched'"):
        load_reward_function(f"{path}:f")


def test_reference_without_function_name():
    """A module without a function is refused; a file without one means its `compute_score` (VPPO's
    `examples/reward_function/math.py`), so a missing file is named."""
    with pytest.raises(
        RewardLoadError, match="must be path/to/file.py:function_name or package.module:function_name"
    ):
        load_reward_function("my_reward")
    with pytest.raises(RewardLoadError, match="file 'my_reward.py' does not exist"):
        load_reward_function("my_reward.py")


def test_module_that_cannot_be_imported():
    with pytest.raises(RewardLoadError, match="cannot import module 'rlstack_no_such_module_xyz'"):
        load_reward_function("rlstack_no_such_module_xyz:score")


def test_file_that_fails_on_import(tmp_path):
    path = write_module(tmp_path / "broken.py", "import rlstack_no_such_module_xyz\n")
    with pytest.raises(RewardLoadError, match="importing reward file .* failed: ModuleNotFoundError"):
        load_reward_function(f"{path}:score")


def test_load_errors_are_user_facing():
    assert issubclass(RewardLoadError, RLStackError)
    assert issubclass(RewardError, RLStackError)


# ----------------------------------------------------------------------------------------- manager


def test_reward_inputs_from_batch():
    inputs = reward_inputs(make_batch(["3", "x"], ["3", "4"]))
    assert inputs[1] == {
        "response": "x",
        "response_length": 2,
        "ground_truth": "4",
        "prompt": "prompt 1",
        "data_source": "addition",
        "extra": {"i": 1},
        "i": 1,  # the row's own fields, at the top level too (EasyR1)
    }


def test_score_adds_scores_and_components(tmp_path):
    path = write_module(tmp_path / "my_reward.py", BATCH_FN)
    manager = RewardManager(
        RewardConfig(reward_function_kwargs={"bonus": 0.5}), [load_reward_function(f"{path}:score")]
    )
    batch = make_batch(["3", " 7 ", "5"], ["3", "7", "6"])
    out = manager.score(batch)
    assert out is batch
    assert out["scores"].dtype == torch.float32
    assert out["scores"].tolist() == [1.5, 1.5, 0.5]
    assert out["reward_components"] == [
        {"accuracy": 1.0, "length": 1.0, "overall": 1.5},
        {"accuracy": 1.0, "length": 2.0, "overall": 1.5},
        {"accuracy": 0.0, "length": 3.0, "overall": 0.5},
    ]


def test_score_sequential(tmp_path):
    path = write_module(tmp_path / "seq_reward.py", SEQUENTIAL_FN)
    out = RewardManager(RewardConfig(), [load_reward_function(f"{path}:score")]).score(
        make_batch(["a", "b"], ["a", "a"])
    )
    assert out["scores"].tolist() == [2.0, 0.0]
    assert out["reward_components"] == [{"extra_i": 0.0, "overall": 2.0}, {"extra_i": 1.0, "overall": 0.0}]


def test_a_component_missing_in_some_results_is_averaged_over_the_rows_that_have_it(tmp_path):
    path = write_module(
        tmp_path / "partial.py",
        """
        def f(xs):
            return [{"overall": 1.0, "format": 1.0}, {"overall": 0.0}]
        """,
    )
    out = RewardManager(RewardConfig(), [load_reward_function(f"{path}:f")]).score(
        make_batch(["a", "b"], ["a", "b"])
    )
    assert out["reward_components"] == [{"format": 1.0, "overall": 1.0}, {"overall": 0.0}]
    assert reward_component_means(out) == {"reward/format": 1.0, "reward/overall": 0.5}


def test_batch_function_raising_names_the_sample(tmp_path):
    path = write_module(
        tmp_path / "raises.py",
        """
        def f(xs):
            out = []
            for x in xs:
                if x["response"] == "boom":
                    raise ValueError("cannot parse")
                out.append({"overall": 1.0})
            return out
        """,
    )
    manager = RewardManager(RewardConfig(), [load_reward_function(f"{path}:f")])
    with pytest.raises(RewardError) as info:
        manager.score(make_batch(["1", "2", "boom"], ["1", "2", "3"]))
    msg = str(info.value)
    assert "sample 2 (row train.jsonl:3, response 'boom')" in msg
    assert "ValueError: cannot parse" in msg


def test_batch_function_failing_only_on_the_whole_batch(tmp_path):
    path = write_module(
        tmp_path / "needs_two.py",
        """
        def f(xs):
            if len(xs) > 1:
                raise RuntimeError("batch too big")
            return [{"overall": 0.0}]
        """,
    )
    with pytest.raises(RewardError, match=r"the whole batch \(each sample alone scored fine\)"):
        RewardManager(RewardConfig(), [load_reward_function(f"{path}:f")]).score(
            make_batch(["1", "2"], ["1", "2"])
        )


def test_sequential_function_raising_names_the_sample(tmp_path):
    path = write_module(
        tmp_path / "seq_raises.py",
        """
        REWARD_TYPE = "sequential"

        def f(x):
            return {"overall": 1.0 / (len(x["response"]) - 3)}
        """,
    )
    long_response = "x" * 100
    with pytest.raises(RewardError) as info:
        RewardManager(RewardConfig(), [load_reward_function(f"{path}:f")]).score(
            make_batch([long_response, "abc"], ["", ""])
        )
    msg = str(info.value)
    assert "raised on sample 1 (row train.jsonl:2, response 'abc')" in msg
    assert "ZeroDivisionError" in msg


def test_long_response_is_shortened_in_messages(tmp_path):
    path = write_module(tmp_path / "no_overall.py", "def f(xs):\n    return [{'score': 1.0} for _ in xs]\n")
    with pytest.raises(RewardError) as info:
        RewardManager(RewardConfig(), [load_reward_function(f"{path}:f")]).score(
            make_batch(["y" * 100], [""])
        )
    assert "'" + "y" * 77 + "...'" in str(info.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return {'overall': 1.0}", "must return a list of 2 dicts, got dict of length 1"),
        ("return [{'overall': 1.0}]", "must return a list of 2 dicts, got list of length 1"),
        ("return None", "must return a list of 2 dicts, got None"),
        (
            "return [{'overall': 1.0}, {'accuracy': 1.0}]",
            r"returned \{'accuracy': 1.0\} for sample 1 \(row train.jsonl:2.*needs an 'overall' key",
        ),
        ("return [{'overall': 1.0}, 0.5]", r"returned 0.5 for sample 1.*needs an 'overall' key"),
        ("return [{'overall': 1.0}, {'overall': '1'}]", r"overall='1' for sample 1 .* is not a number"),
        ("return [{'overall': True}, {'overall': 1.0}]", r"overall=True for sample 0 .* is not a number"),
    ],
)
def test_wrong_return_values_are_errors(tmp_path, body, message):
    path = write_module(tmp_path / "wrong.py", f"def f(xs):\n    {body}\n")
    with pytest.raises(RewardError, match=message):
        RewardManager(RewardConfig(), [load_reward_function(f"{path}:f")]).score(
            make_batch(["a", "b"], ["a", "b"])
        )


def test_sequential_result_without_overall(tmp_path):
    path = write_module(
        tmp_path / "seq_wrong.py", "REWARD_TYPE = 'sequential'\n\ndef f(x):\n    return {'acc': 1}\n"
    )
    with pytest.raises(RewardError, match="sample 0 .*needs an 'overall' key"):
        RewardManager(RewardConfig(), [load_reward_function(f"{path}:f")]).score(make_batch(["a"], ["a"]))


# ---------------------------------------------------------------------------------------- built-ins


def test_exact_match_strips_whitespace():
    got = builtin.exact_match(
        [
            {"response": " 12\n", "ground_truth": "12"},
            {"response": "12", "ground_truth": 12},
            {"response": "13", "ground_truth": "12"},
        ]
    )
    assert got == [
        {"overall": 1.0, "accuracy": 1.0},
        {"overall": 1.0, "accuracy": 1.0},
        {"overall": 0.0, "accuracy": 0.0},
    ]


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        (r"The answer is \boxed{\frac{1}{2}}", "0.5", 1.0),
        ("<answer>3</answer>", "3", 1.0),
        (r"<answer>\frac{6}{2}</answer>", "3", 1.0),
        ("<answer>4</answer>", "3", 0.0),
        (r"\boxed{\frac{1}{3}}", "0.5", 0.0),
        ("", "3", 0.0),
        ("The answer is 42", "42", 1.0),
        ("42", "42", 0.0),  # as in EasyR1: a bare number is not a marked answer
    ],
)
def test_math_builtin(response, truth, expected):
    (out,) = builtin.math([{"response": response, "ground_truth": truth}], format_weight=0.0)
    assert {k: out[k] for k in ("overall", "accuracy", "format")} == {
        "overall": expected,
        "accuracy": expected,
        "format": 0.0,
    }
    assert out["reason"] and isinstance(out["answer"], str)  # written to generations/, not logged


def test_math_through_the_manager():
    manager = RewardManager(
        RewardConfig(reward_function_kwargs={"format_weight": 0.0}), [load_reward_function("builtin:math")]
    )
    out = manager.score(
        make_batch([r"\boxed{\frac{1}{2}}", "<answer>3</answer>", "<answer>5</answer>"], ["0.5", "3", "3"])
    )
    assert out["scores"].tolist() == [1.0, 1.0, 0.0]
    assert [c["accuracy"] for c in out["reward_components"]] == [1.0, 1.0, 0.0]
