"""Short Python functions to write (`builtin:functions`), the real-model code demo's task.

Each problem asks for one small function over numbers, lists or strings ("Write a Python function
`add_seven(xs)` that returns a new list with 7 added to every number in `xs`."), scored by
`builtin:code` with assert-style tests (`{"asserts": [...]}`: four calls with their expected values,
run in the sandbox's test process, never in the program's). A kind is a template with a parameter
(the 7 above), a name for the function and a reference solution that computes the expected values.

Held out two ways: `test` holds problems of the training kinds with a parameter `train` never uses
for that kind (`add_k` with k = 4, say), and every problem of the kinds in `HELD_OUT_KINDS`, which
`train` never shows. Every problem's tests tell its k from every other k and are not all one value.
The prompt is a chat: one worked example (a kind of neither split), then the problem; the answer is a
fenced ```python block. Problems and tests are drawn by a generator seeded with the split and index,
so a split is the same on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NUMBER_WORDS = {
    2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten",
}  # fmt: skip


@dataclass(frozen=True)
class Kind:
    name: str
    text: str
    """The task, with `{f}` for the function's name and `{k}` for the parameter."""
    signature: str
    """The argument list, e.g. `xs`."""
    solve: Callable[[Any, int], Any]
    """(arguments, k) -> the expected value; arguments a tuple."""
    inputs: Callable[[random.Random, int, int], tuple]
    """(generator, k, the test's index) -> its arguments, chosen so that a program with another k, or one
    that returns a constant, fails at least one of the four."""
    names: tuple[str, ...]
    """Function names, `{k}` for the parameter's word."""


def _ints(r: random.Random) -> list[int]:
    return [r.randint(-9, 20) for _ in range(r.randint(2, 6))]


def _around(r: random.Random, k: int, spread: int) -> list[int]:
    """3 to 7 whole numbers within `spread` of k, k itself among them."""
    xs = [r.randint(k - spread, k + spread) for _ in range(r.randint(2, 6))] + [k]
    r.shuffle(xs)
    return xs


def _counted(r: random.Random, hits: list[int], misses: list[int], i: int) -> list[int]:
    """`i` numbers drawn from `hits` and 2 to 4 from `misses`, shuffled: test i's answer is i."""
    xs = [r.choice(hits) for _ in range(i)] + [r.choice(misses) for _ in range(r.randint(2, 4))]
    r.shuffle(xs)
    return xs


def _multiple_or_not(r: random.Random, k: int, i: int) -> int:
    """A multiple of k for even test indices, a number that is not for odd ones."""
    return k * r.randint(0, 12) + (0 if i % 2 == 0 else r.randint(1, k - 1))


def _word(r: random.Random, shortest: int = 3) -> str:
    return "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(shortest, shortest + 5)))


KINDS: tuple[Kind, ...] = (
    Kind(
        "add_k",
        "returns a new list with {k} added to every number in `xs`",
        "xs",
        lambda a, k: [x + k for x in a[0]],
        lambda r, k, i: (_ints(r),),
        ("add_{w}", "plus_{w}", "shift_by_{w}"),
    ),
    Kind(
        "times_k",
        "returns a new list with every number in `xs` multiplied by {k}",
        "xs",
        lambda a, k: [x * k for x in a[0]],
        lambda r, k, i: (_ints(r),),
        ("times_{w}", "scale_by_{w}", "multiply_by_{w}"),
    ),
    Kind(
        "count_above",
        "returns how many numbers in `xs` are greater than {k}",
        "xs",
        lambda a, k: sum(x > k for x in a[0]),
        lambda r, k, i: (_counted(r, list(range(k + 1, k + 7)), list(range(k - 6, k + 1)), i),),
        ("count_above_{w}", "how_many_over_{w}", "count_greater_{w}"),
    ),
    Kind(
        "keep_below",
        "returns a new list of the numbers in `xs` that are less than {k}, in their order",
        "xs",
        lambda a, k: [x for x in a[0] if x < k],
        lambda r, k, i: (_around(r, k, 6),),
        ("keep_below_{w}", "under_{w}", "filter_below_{w}"),
    ),
    Kind(
        "sum_plus_k",
        "returns the sum of the numbers in `xs` plus {k}",
        "xs",
        lambda a, k: sum(a[0]) + k,
        lambda r, k, i: (_ints(r),),
        ("sum_plus_{w}", "total_plus_{w}", "add_{w}_to_sum"),
    ),
    Kind(
        "repeat_k",
        "returns the string `s` repeated {k} times",
        "s",
        lambda a, k: a[0] * k,
        lambda r, k, i: (_word(r),),
        ("repeat_{w}", "{w}_times", "echo_{w}"),
    ),
    Kind(
        "first_k",
        "returns the first {k} characters of the string `s`",
        "s",
        lambda a, k: a[0][:k],
        lambda r, k, i: (_word(r, k + 1),),
        ("first_{w}", "head_{w}", "take_{w}"),
    ),
    Kind(
        "mod_k",
        "returns True if the number `n` is divisible by {k}, else False",
        "n",
        lambda a, k: a[0] % k == 0,
        lambda r, k, i: (_multiple_or_not(r, k, i),),
        ("divisible_by_{w}", "is_multiple_of_{w}", "by_{w}"),
    ),
    # held out: `test` only
    Kind(
        "minus_k",
        "returns a new list with {k} subtracted from every number in `xs`",
        "xs",
        lambda a, k: [x - k for x in a[0]],
        lambda r, k, i: (_ints(r),),
        ("minus_{w}", "subtract_{w}", "lower_by_{w}"),
    ),
    Kind(
        "last_k",
        "returns the last {k} characters of the string `s`",
        "s",
        lambda a, k: a[0][-k:],
        lambda r, k, i: (_word(r, k + 1),),
        ("last_{w}", "tail_{w}", "end_{w}"),
    ),
    Kind(
        "count_equal",
        "returns how many numbers in `xs` are equal to {k}",
        "xs",
        lambda a, k: sum(x == k for x in a[0]),
        lambda r, k, i: (_counted(r, [k], [k - 2, k - 1, k + 1, k + 2], i),),
        ("count_{w}s", "how_many_{w}s", "occurrences_of_{w}"),
    ),
)
HELD_OUT_KINDS = ("minus_k", "count_equal")
"""Kinds only `test` has: whether what GRPO teaches carries over to a kind it never saw."""
ARGUMENTS = {
    "xs": ("xs", "nums", "values", "items"),
    "s": ("s", "text", "word", "string"),
    "n": ("n", "x", "num", "value"),
}
"""The argument's name in a problem, by the kind's own (its text names `xs`, `s` or `n`)."""
TEST_SIZE = 500
TESTS_PER_PROBLEM = 4
EXAMPLE = (
    {"role": "user", "content": "Write a Python function `square_all(xs)` that returns a new list with every number in `xs` squared."},
    {"role": "assistant", "content": "```python\ndef square_all(xs):\n    return [x * x for x in xs]\n```"},
)  # fmt: skip
"""The worked example: a kind of neither split."""


@dataclass(frozen=True)
class Instance:
    kind: Kind
    name: str
    k: int
    argument: str

    @property
    def question(self) -> str:
        text = self.kind.text.format(k=self.k).replace(f"`{self.kind.signature}`", f"`{self.argument}`")
        return f"Write a Python function `{self.name}({self.argument})` that {text}."

    @property
    def held_out(self) -> bool:
        """In `test`: a held-out kind, or one of `HELD_OUT_KS` values of k of its kind, which `train` never
        shows for that kind: a held-out instance differs from every training one in its parameter."""
        return self.kind.name in HELD_OUT_KINDS or self.k in held_out_ks(self.kind)

    def asserts(self) -> list[str]:
        """`TESTS_PER_PROBLEM` calls with the reference's values, drawn by a generator seeded with the
        instance, redrawn until they tell this k from every other (`NUMBER_WORDS`) and are not all the
        same value (a program that ignores its input, or uses another k, fails at least one)."""
        r = random.Random(f"functions/{self.kind.name}/{self.name}/{self.k}/{self.argument}")
        for _ in range(1000):
            calls = [self.kind.inputs(r, self.k, i) for i in range(TESTS_PER_PROBLEM)]
            want = [self.kind.solve(args, self.k) for args in calls]
            others = [[self.kind.solve(args, k) for args in calls] for k in NUMBER_WORDS if k != self.k]
            if len({repr(v) for v in want}) > 1 and want not in others:
                return [
                    f"assert {self.name}({', '.join(repr(a) for a in args)}) == {value!r}"
                    for args, value in zip(calls, want)
                ]
        raise RuntimeError(f"no discriminating tests for {self}")  # the kind's inputs are too narrow


HELD_OUT_KS = 3
"""Values of k per training kind that only `test` has."""


def held_out_ks(kind: Kind) -> list[int]:
    """The kind's held-out values of k, drawn once by a generator seeded with its name."""
    return random.Random(f"functions/held_out/{kind.name}").sample(sorted(NUMBER_WORDS), HELD_OUT_KS)


def instances() -> list[Instance]:
    """Every problem: each kind x parameter x function name x argument name."""
    return [
        Instance(kind, name.format(w=NUMBER_WORDS[k]), k, argument)
        for kind in KINDS
        for k in NUMBER_WORDS
        for name in kind.names
        for argument in ARGUMENTS[kind.signature]
    ]


def rows(split: str) -> list[dict]:
    """The rows of `split`: `problem` (the chat), `question`, `answer` (the tests, as `builtin:code` reads
    them), `data_source=functions`, `extra` (kind, name, k). `train`: every instance not held out;
    `test`: `TEST_SIZE` of the held-out ones, drawn once by a fixed seed."""
    chosen = [i for i in instances() if i.held_out == (split == "test")]
    if split == "test":
        chosen = random.Random("functions/test").sample(chosen, TEST_SIZE)
    else:
        random.Random("functions/train").shuffle(chosen)
    return [
        {
            "problem": [*EXAMPLE, {"role": "user", "content": i.question}],
            "question": i.question,
            "answer": {"asserts": i.asserts()},
            "data_source": "functions",
            "extra": {"kind": i.kind.name, "name": i.name, "k": i.k},
        }
        for i in chosen
    ]
