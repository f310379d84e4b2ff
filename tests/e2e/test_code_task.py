"""`builtin:code`: the generator is pinned, the rows are Nemotron-RL rows, the splits are disjoint,
and every reference program passes its own tests in the sandbox through the code reward."""

from __future__ import annotations

import hashlib
import json

from rlstack.data import programs
from rlstack.data.formats import normalize_rows
from rlstack.data.readers import read_rows
from rlstack.rewards.code import compute_score


def _digest(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def test_generator_is_pinned():
    """Same items on every machine and in every process: statements, tests, split sizes and the
    weak teacher's answers."""
    train, test = programs.rows("train"), programs.rows("test")
    assert (len(train), len(test)) == (407, 233)
    assert (_digest(train), _digest(test)) == ("c3b02e41688b3ab6", "b15a43f8a917e3a2")
    assert _digest(programs.guess_sft_rows("train")) == "a170f0b08f7b4cdd"
    assert test[0] == {
        "responses_create_params": {"input": [{"role": "user", "content": STATEMENT}]},
        "verifier_metadata": {
            "unit_tests": {"inputs": ["71 3\n", "16 4\n", "78 4\n"], "outputs": ["74\n", "20\n", "82\n"]}
        },
        "data_source": "code",
    }


STATEMENT = (
    "Read two integers n and k. Tom has n pens and buys k more. How many pens does Tom have now? "
    "Write a Python program."
)


def test_splits_are_disjoint_and_share_every_story_name_and_noun():
    train, test = programs.problems("train"), programs.problems("test")
    assert not {p.statement for p in train} & {p.statement for p in test}
    for split in (train, test):
        text = " ".join(p.statement for p in split)
        assert all(n in text for n in programs.NAMES) and all(n in text for n in programs.NOUNS)
        assert {p.story for p in split} == set(range(len(programs.STORIES)))


def test_rows_load_as_nemotron_code():
    rows, where = read_rows("builtin:code@test")
    canonical = normalize_rows(rows, where)
    assert canonical[0]["problem"] == [{"role": "user", "content": STATEMENT}]
    assert canonical[0]["answer"] == {
        "inputs": ["71 3\n", "16 4\n", "78 4\n"],
        "outputs": ["74\n", "20\n", "82\n"],
    }
    assert canonical[0]["data_source"] == "code"


def test_reference_programs_pass_their_tests_in_the_sandbox_and_other_operations_fail():
    """One problem of every story, scored by the code reward as a model's answer would be: the
    reference passes every test, each other operation's program fails at least one."""
    problems = {}
    for p in programs.problems("train"):
        problems.setdefault(p.story, p)
    assert len(problems) == len(programs.STORIES)
    inputs = [
        {
            "response": programs.solution(programs.program_of(op)),
            "ground_truth": p.row()["verifier_metadata"]["unit_tests"],
        }
        for p in problems.values()
        for op in programs.OPERATIONS
    ]
    expected = [
        "passed" if op == p.operation else "wrong_answer"
        for p in problems.values()
        for op in programs.OPERATIONS
    ]
    assert [r["status"] for r in compute_score(inputs)] == expected


def test_sft_rows_answer_with_the_reference_or_the_weak_teacher():
    sft, guess = programs.sft_rows("train"), programs.guess_sft_rows("train")
    assert len(sft) == len(guess) == 407
    assert sft[0]["answer"] == "```python\nn,k=map(int,input().split())\nprint(n+k)\n```"
    assert [r["problem"] for r in sft] == [r["problem"] for r in guess]
    # The teacher writes the right operation for about 40% of the statements, else its decoy.
    problems = programs.problems("train")
    ops = [programs.guessed_operation(p) for p in problems]
    assert all(op in (p.operation, programs.DECOYS[p.operation]) for op, p in zip(ops, problems))
    right = sum(op == p.operation for op, p in zip(ops, problems)) / len(problems)
    assert 0.3 < right < 0.5, right
    for op, row in zip(ops, guess, strict=True):
        assert row["answer"] == programs.solution(programs.program_of(op))
    # The decoys form one cycle through the five operations: no two operations swap, so the
    # teacher's mix differs for every operation and the warm start has to tell the stories apart.
    op, cycle = "plus", []
    while op not in cycle:
        cycle.append(op)
        op = programs.DECOYS[op]
    assert sorted(cycle) == sorted(programs.OPERATIONS) and op == "plus"
    # Every story gets both answers from the teacher: the warm start sees the right one too.
    for story in range(len(programs.STORIES)):
        assert {op == p.operation for op, p in zip(ops, problems) if p.story == story} == {True, False}
