"""Arithmetic word problems (`builtin:word_problems`), the real-model demo's task.

Short stories with one or two operations on small whole numbers ("Mia has 23 stickers. Mia gives away
8 and then buys 15 more. How many stickers does Mia have now?"), the answer a whole number checked by
`builtin:math`. The prompt is a chat: one worked example (a question, then the answer as a short
calculation and `\\boxed{46}`), then the question, as few-shot evaluations of GSM8K do; without the
example SmolLM2-135M-Instruct never boxes its answer.

Each problem is drawn from a template, a name, an object and numbers by a generator seeded with its
split and index, so a split is the same on every machine. The held-out `test` split (1,000 distinct
problems) shares no question with `train` (20,000): a question drawn for `train` that is in `test` is
skipped.
"""

from __future__ import annotations

import random
from collections.abc import Callable

NAMES = (
    "Mia", "Leo", "Ava", "Sam", "Zoe", "Ben", "Lily", "Max", "Emma", "Noah",
    "Ruby", "Omar", "Nina", "Jack", "Aria", "Tom", "Ella", "Finn", "Ivy", "Kai",
)  # fmt: skip
THINGS = (
    "apples", "stickers", "marbles", "pencils", "cookies", "stamps", "books", "shells",
    "cards", "coins", "balloons", "crayons", "buttons", "flowers", "candies", "toy cars",
)  # fmt: skip
CONTAINERS = ("boxes", "bags", "jars", "packs", "baskets", "crates")

Template = Callable[[random.Random, str, str], tuple[str, int]]


def _give(r: random.Random, n: str, t: str) -> tuple[str, int]:
    a, b = r.randint(20, 99), r.randint(2, 19)
    return f"{n} has {a} {t}. {n} gives {b} {t} to a friend. How many {t} does {n} have left?", a - b


def _get(r: random.Random, n: str, t: str) -> tuple[str, int]:
    a, b = r.randint(10, 89), r.randint(2, 49)
    return f"{n} has {a} {t} and gets {b} more. How many {t} does {n} have now?", a + b


def _groups(r: random.Random, n: str, t: str) -> tuple[str, int]:
    a, b, c = r.randint(2, 9), r.randint(2, 12), r.choice(CONTAINERS)
    return f"{n} has {a} {c} with {b} {t} in each. How many {t} does {n} have in all?", a * b


def _share(r: random.Random, n: str, t: str) -> tuple[str, int]:
    k, q = r.randint(2, 9), r.randint(2, 12)
    return (
        f"{n} shares {k * q} {t} equally among {k} friends. How many {t} does each friend get?",
        q,
    )


def _together(r: random.Random, n: str, t: str) -> tuple[str, int]:
    m = r.choice([x for x in NAMES if x != n])
    a, b = r.randint(10, 79), r.randint(10, 79)
    return f"{n} has {a} {t} and {m} has {b} {t}. How many {t} do they have together?", a + b


def _more_than(r: random.Random, n: str, t: str) -> tuple[str, int]:
    m = r.choice([x for x in NAMES if x != n])
    a, b = r.randint(30, 99), r.randint(5, 29)
    return f"{n} has {a} {t}. {m} has {b} {t}. How many more {t} does {n} have than {m}?", a - b


def _give_then_get(r: random.Random, n: str, t: str) -> tuple[str, int]:
    a, b, c = r.randint(20, 60), r.randint(2, 19), r.randint(2, 30)
    text = f"{n} has {a} {t}. {n} gives away {b} and then buys {c} more. How many {t} does {n} have now?"
    return text, a - b + c


def _groups_plus(r: random.Random, n: str, t: str) -> tuple[str, int]:
    a, b, c, box = r.randint(2, 6), r.randint(2, 10), r.randint(1, 20), r.choice(CONTAINERS)
    text = f"{n} buys {a} {box} of {t} with {b} in each, and already had {c} {t}. How many {t} does {n} have now?"
    return text, a * b + c


def _groups_minus(r: random.Random, n: str, t: str) -> tuple[str, int]:
    a, b, box = r.randint(2, 6), r.randint(3, 10), r.choice(CONTAINERS)
    c = r.randint(1, a * b - 1)
    text = f"{n} has {a} {box} of {t} with {b} in each. {n} gives away {c} {t}. How many {t} are left?"
    return text, a * b - c


def _double(r: random.Random, n: str, t: str) -> tuple[str, int]:
    m = r.choice([x for x in NAMES if x != n])
    a = r.randint(3, 40)
    return f"{n} has {a} {t}. {m} has twice as many {t} as {n}. How many {t} does {m} have?", 2 * a


TEMPLATES: tuple[Template, ...] = (
    _give,
    _get,
    _groups,
    _share,
    _together,
    _more_than,
    _give_then_get,
    _groups_plus,
    _groups_minus,
    _double,
)
SIZES = {"train": 20_000, "test": 1_000}
EXAMPLE = (
    {"role": "user", "content": "Ben has 34 shells and gets 12 more. How many shells does Ben have now?"},
    {"role": "assistant", "content": "34 + 12 = 46\n\\boxed{46}"},
)


def problem(split: str, index: int) -> tuple[str, int]:
    """The question and answer of problem `index` of `split` (before the held-out check)."""
    r = random.Random(f"word_problems/{split}/{index}")
    template = TEMPLATES[r.randrange(len(TEMPLATES))]
    return template(r, r.choice(NAMES), r.choice(THINGS))


def rows(split: str) -> list[dict]:
    """The rows of `split` (`train` or `test`): `problem`, `answer`, `data_source=word_problems`."""
    example = {EXAMPLE[0]["content"]: 0}
    held_out = _distinct("test", SIZES["test"], example)
    pairs = held_out if split == "test" else _distinct("train", SIZES["train"], held_out | example)
    return [
        {
            "problem": [*EXAMPLE, {"role": "user", "content": text}],
            "question": text,
            "answer": str(answer),
            "data_source": "word_problems",
        }
        for text, answer in pairs.items()
    ]


def _distinct(split: str, size: int, excluded: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    i = 0
    while len(out) < size:
        text, answer = problem(split, i)
        i += 1
        if text not in excluded:
            out.setdefault(text, answer)
    return out
