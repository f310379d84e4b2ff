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
    """Same items on every machine and in every process: statements, tests and split sizes."""
    train, test = programs.rows("train"), programs.rows("test")
    assert (len(train), len(test)) == (278, 264)
    assert (_digest(train), _digest(test)) == ("4ae355685041876b", "09e333b54b153b8f")
    assert test[0] == {
        "responses_create_params": {
            "input": [
                {"role": "user", "content": "Read an integer n. Print n plus 4. Write a Python program."}
            ]
        },
        "verifier_metadata": {
            "unit_tests": {"inputs": ["66\n", "11\n", "-10\n"], "outputs": ["70\n", "15\n", "-6\n"]}
        },
        "data_source": "code",
    }


def test_splits_are_disjoint_and_families_without_constants_train_only():
    train = {p.statement for p in programs.problems("train")}
    test = {p.statement for p in programs.problems("test")}
    assert not train & test
    constant_free = {
        f"{programs._STATEMENT_START[f.input_kind]} {f.statement}" for f in programs.FAMILIES if not f.ks
    }
    assert constant_free <= train and not constant_free & test
    for family in programs.FAMILIES:  # every family with constants is in both splits
        if family.ks:
            stem = family.statement.split("{")[0]
            assert any(stem in s for s in test) and any(stem in s for s in train), family


def test_rows_load_as_nemotron_code():
    rows, where = read_rows("builtin:code@test")
    canonical = normalize_rows(rows, where)
    assert canonical[0]["problem"] == [
        {"role": "user", "content": "Read an integer n. Print n plus 4. Write a Python program."}
    ]
    assert canonical[0]["answer"] == {
        "inputs": ["66\n", "11\n", "-10\n"],
        "outputs": ["70\n", "15\n", "-6\n"],
    }
    assert canonical[0]["data_source"] == "code"


def test_reference_programs_pass_their_tests_in_the_sandbox():
    """One problem of every family, scored by the code reward as a model's answer would be."""
    seen, inputs = set(), []
    for split in ("train", "test"):
        for p in programs.problems(split):
            family = p.program.splitlines()[1].translate(str.maketrans("", "", "0123456789"))
            if family not in seen:
                seen.add(family)
                inputs.append(
                    {
                        "response": programs.solution(p),
                        "ground_truth": p.row()["verifier_metadata"]["unit_tests"],
                    }
                )
    assert len(inputs) == len(programs.FAMILIES)
    out = compute_score(inputs)
    assert [r["status"] for r in out] == ["passed"] * len(inputs)
    # A wrong constant fails: the tests tell the programs of one family apart.
    wrong = dict(inputs[0], response=inputs[0]["response"].replace("+2", "+3"))
    assert compute_score([wrong])[0]["accuracy"] == 0.0


def test_sft_rows_answer_with_the_reference_program():
    sft = programs.sft_rows("train")
    assert len(sft) == 278
    assert sft[0] == {
        "problem": "Read an integer n. Print n plus 2. Write a Python program.",
        "answer": "```python\nn=int(input())\nprint(n+2)\n```",
        "data_source": "code",
    }
