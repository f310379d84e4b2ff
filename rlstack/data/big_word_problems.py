"""Word problems a small model cannot compute in its head (`builtin:big_word_problems`), the tool demo's task.

Stories of two or three operations on numbers in the tens and hundreds ("Leo has 345 cards. Leo buys
27 packs with 118 cards in each. How many cards does Leo have now?"): choosing the expression is
within a 135M model's reach, computing `345 + 27 * 118` is not. Each problem keeps the expression that
answers it, so the warm-start rows can show it.

Two prompts over the same problems, each a chat with one worked example, as `builtin:word_problems`:
- `big_word_problems`: with the Python tool. A system turn says that code in `<code>...</code>` runs
  and its value comes back; the example calls the tool with the expression, reads the value (a user
  turn, as the agent loop's `rlstack` contract with code calls replies) and boxes it.
- `big_word_problems_no_tool`: the example computes the expression in its head and boxes the value
  (the baseline that measures what the tool adds).

`..._tool_sft` and `..._no_tool_sft` hold the first `SFT_ROWS` training problems answered by a weak
teacher in each format (the tool call, the value it returns, the boxed answer; or the expression with
its value), right about half the time: the short supervised warm start of the tool demo.

Problems are drawn from a template, a name, an object and numbers by a generator seeded with the split
and index, so a split is the same on every machine; `test` (1,000 problems) shares no computation (no
expression) with `train` (20,000) nor with the worked example, and no two problems of a split share one.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from rlstack.data.word_problems import CONTAINERS, NAMES, THINGS

Template = Callable[[random.Random, str, str], tuple[str, str]]
"""(generator, name, object) -> (question, the expression that answers it)."""


def _buy_boxes(r: random.Random, n: str, t: str) -> tuple[str, str]:
    a, b, c, box = r.randint(100, 999), r.randint(12, 48), r.randint(11, 99), r.choice(CONTAINERS)
    return f"{n} has {a} {t}. {n} buys {b} {box} with {c} {t} in each. How many {t} does {n} have now?", (
        f"{a} + {b} * {c}"
    )


def _boxes_minus(r: random.Random, n: str, t: str) -> tuple[str, str]:
    a, b, box = r.randint(12, 60), r.randint(12, 99), r.choice(CONTAINERS)
    c = r.randint(100, a * b - 1)
    return f"{n} has {a} {box} with {b} {t} in each. {n} gives away {c} {t}. How many {t} are left?", (
        f"{a} * {b} - {c}"
    )


def _give_each(r: random.Random, n: str, t: str) -> tuple[str, str]:
    b, c = r.randint(12, 45), r.randint(12, 30)
    a = b * c + r.randint(1, 899)
    return f"{n} has {a} {t}. {n} gives {b} {t} to each of {c} friends. How many {t} does {n} have left?", (
        f"{a} - {b} * {c}"
    )


def _two_kinds(r: random.Random, n: str, t: str) -> tuple[str, str]:
    a, b, c, d = r.randint(12, 40), r.randint(12, 60), r.randint(12, 40), r.randint(12, 60)
    box, other = r.sample(CONTAINERS, 2)
    text = f"{n} buys {a} {box} with {b} {t} in each and {c} {other} with {d} {t} in each. How many {t} does {n} buy in all?"
    return text, f"{a} * {b} + {c} * {d}"


def _share_boxes(r: random.Random, n: str, t: str) -> tuple[str, str]:
    sizes: list[int] = []
    while not sizes:  # a box size of 12-60 that divides the whole, so that no count is given away
        k, q = r.randint(3, 12), r.randint(25, 150)
        sizes = [d for d in range(12, 61) if (k * q) % d == 0 and d != k]
    b = r.choice(sizes)
    a, box = k * q // b, r.choice(CONTAINERS)
    text = f"{n} has {a} {box} with {b} {t} in each and shares them equally among {k} friends. How many {t} does each friend get?"
    return text, f"{a} * {b} // {k}"


def _add_then_give(r: random.Random, n: str, t: str) -> tuple[str, str]:
    a, b = r.randint(150, 999), r.randint(150, 999)
    c = r.randint(100, a + b - 1)
    text = f"{n} has {a} {t}, gets {b} more and then gives away {c}. How many {t} does {n} have now?"
    return text, f"{a} + {b} - {c}"


def _nested_boxes(r: random.Random, n: str, t: str) -> tuple[str, str]:
    a, b, c = r.randint(12, 40), r.randint(3, 12), r.randint(12, 30)
    box, inner = r.sample(CONTAINERS, 2)
    text = (
        f"{n} has {a} {box}. Each of them holds {b} {inner} with {c} {t} in each. How many {t} does {n} have?"
    )
    return text, f"{a} * {b} * {c}"


def _change(r: random.Random, n: str, t: str) -> tuple[str, str]:
    a, b = r.randint(12, 40), r.randint(15, 95)
    c = (a * b // 100 + r.randint(1, 9)) * 100
    text = (
        f"{n} buys {a} {t} at {b} cents each and pays with {c} cents. How many cents of change does {n} get?"
    )
    return text, f"{c} - {a} * {b}"


TEMPLATES: tuple[Template, ...] = (
    _buy_boxes,
    _boxes_minus,
    _give_each,
    _two_kinds,
    _share_boxes,
    _add_then_give,
    _nested_boxes,
    _change,
)
SIZES = {"train": 20_000, "test": 1_000}
SFT_ROWS = 48
"""Training problems in each warm-start set: a few dozen, as the tool demo allows."""
TEACHER_RIGHT = 0.5
"""Share of the warm start's problems whose expression is right; the others have one operator changed
(`345 - 27 * 118`), so that the warm start teaches the format and a spread of plausible expressions,
and GRPO has the choice of the right one to learn."""

TOOL_SYSTEM = (
    "You can run Python. Write an expression in <code>...</code> and you will get its value back. "
    "Give the final answer in \\boxed{}."
)
NO_TOOL_SYSTEM = "Give the final answer in \\boxed{}."
EXAMPLE_QUESTION = (
    "Leo has 345 cards. Leo buys 27 packs with 118 cards in each. How many cards does Leo have now?"
)
EXAMPLE_EXPRESSION = "345 + 27 * 118"


def tool_call(expression: str) -> str:
    """The turn that asks the Python tool for an expression's value."""
    return f"<code>{expression}</code>"


def final_answer(expression: str) -> str:
    """The turn that states the expression's value and boxes it."""
    value = evaluate(expression)
    return f"{expression} = {value}\n\\boxed{{{value}}}"


def evaluate(expression: str) -> int:
    """The value of one of this module's expressions (whole numbers, + - * //)."""
    return int(eval(expression, {"__builtins__": {}}))  # noqa: S307 - our own templates' expressions


def tool_prompt(question: str) -> list[dict]:
    """The tool prompt: the system turn, the worked example (call, value, answer), the question."""
    value = str(evaluate(EXAMPLE_EXPRESSION))
    return [
        {"role": "system", "content": TOOL_SYSTEM},
        {"role": "user", "content": EXAMPLE_QUESTION},
        {"role": "assistant", "content": tool_call(EXAMPLE_EXPRESSION)},
        {"role": "user", "content": value},
        {"role": "assistant", "content": final_answer(EXAMPLE_EXPRESSION)},
        {"role": "user", "content": question},
    ]


def no_tool_prompt(question: str) -> list[dict]:
    """The prompt without the tool: the system turn, the worked example computed in the head, the question."""
    return [
        {"role": "system", "content": NO_TOOL_SYSTEM},
        {"role": "user", "content": EXAMPLE_QUESTION},
        {"role": "assistant", "content": final_answer(EXAMPLE_EXPRESSION)},
        {"role": "user", "content": question},
    ]


def problem(split: str, index: int) -> tuple[str, str, Template]:
    """The question, expression and template of problem `index` of `split` (before the held-out check)."""
    r = random.Random(f"big_word_problems/{split}/{index}")
    template = TEMPLATES[r.randrange(len(TEMPLATES))]
    return (*template(r, r.choice(NAMES), r.choice(THINGS)), template)


def problems(split: str) -> list[tuple[str, str, Template]]:
    """The (question, expression, template) of each problem of `split` (`train` or `test`). Held out by
    computation, not only by wording: no two problems, in a split or across the two, have the same
    expression, and none has the worked example's."""
    excluded = {EXAMPLE_EXPRESSION}
    held_out = _distinct("test", SIZES["test"], excluded)
    if split == "test":
        return held_out
    return _distinct("train", SIZES["train"], excluded | {expression for _, expression, _ in held_out})


def rows(split: str, tool: bool = True) -> list[dict]:
    """The rows of `split`: `problem` (the chat), `question`, `answer`, `data_source=big_word_problems`,
    `extra.expression` and `extra.kind` (the story's template)."""
    prompt = tool_prompt if tool else no_tool_prompt
    return [
        {
            "problem": prompt(question),
            "question": question,
            "answer": str(evaluate(expression)),
            "data_source": "big_word_problems",
            "extra": {"expression": expression, "kind": template.__name__.lstrip("_")},
        }
        for question, expression, template in problems(split)
    ]


def no_tool_rows(split: str) -> list[dict]:
    """`builtin:big_word_problems_no_tool`: the same problems with the prompt that has no tool."""
    return rows(split, tool=False)


def teacher_expression(expression: str, index: int) -> str:
    """The warm start's expression for problem `index`: right with probability `TEACHER_RIGHT`, else the
    same numbers with one operator changed (never a negative value)."""
    r = random.Random(f"big_word_problems/teacher/{index}")
    if r.random() < TEACHER_RIGHT:
        return expression
    tokens = expression.split(" ")
    operators = [i for i, t in enumerate(tokens) if t in ("+", "-", "*", "//")]
    for _ in range(100):
        changed = list(tokens)
        i = r.choice(operators)
        changed[i] = r.choice([o for o in ("+", "-", "*") if o != tokens[i]])
        if evaluate(" ".join(changed)) >= 0:
            return " ".join(changed)
    return expression


def tool_sft_rows(split: str) -> list[dict]:
    """`builtin:big_word_problems_tool_sft`: the first `SFT_ROWS` problems of `split` with a weak
    teacher's tool-using trajectory as the answer (`teacher_expression`): the call, the value the tool
    returns for it (a user turn, masked from the loss), that value boxed."""
    out = []
    for index, r in enumerate(rows(split)[:SFT_ROWS]):
        expression = teacher_expression(r["extra"]["expression"], index)
        conversation = [
            {"role": "assistant", "content": tool_call(expression)},
            {"role": "user", "content": str(evaluate(expression))},
            {"role": "assistant", "content": final_answer(expression)},
        ]
        out.append({**r, "answer": conversation})
    return out


def no_tool_sft_rows(split: str) -> list[dict]:
    """`builtin:big_word_problems_no_tool_sft`: the same `SFT_ROWS` problems and teacher's expressions with
    the no-tool prompt, each with its value computed in the head (right) and boxed."""
    return [
        {
            **r,
            "answer": [
                {
                    "role": "assistant",
                    "content": final_answer(teacher_expression(r["extra"]["expression"], i)),
                }
            ],
        }
        for i, r in enumerate(no_tool_rows(split)[:SFT_ROWS])
    ]


def _distinct(split: str, size: int, excluded: set[str]) -> list[tuple[str, str, Template]]:
    out, seen, i = [], set(excluded), 0
    while len(out) < size:
        text, expression, template = problem(split, i)
        i += 1
        if expression not in seen:
            seen.add(expression)
            out.append((text, expression, template))
    return out
