"""`builtin:code`: short programming problems with stdin/stdout tests, in Nemotron-RL's row format.

Each problem asks for a few lines of Python that read one input line and print one result:
"Read an integer n. Print n times 7 plus 3." -> `n=int(input())` / `print(n*7+3)`. A family
fixes the input (an integer, two integers, a word, a list of integers) and the operation, named
in words ("plus", "times", "reversed", "the largest"); most families take one or two constants
(digits 2-9) that appear in the statement and must be copied into the program. A tiny model can
learn which program each statement asks for, which is what the code demo (`rlstack demo --task
code`) trains with the sandboxed unit-test reward: a short warm start teaches the programs' shapes,
and a program with a wrong constant passes no test, so reading the constants is left to RL.

Rows are raw Nemotron-RL competitive-coding rows (`responses_create_params.input`,
`verifier_metadata.unit_tests.inputs/outputs`, `data_source`), so they go through the same
`nemotron_code` normaliser as a user's file. Every problem has `TESTS` tests whose inputs are
drawn from a generator seeded by the problem's statement, and whose outputs are its reference
program's (run here, in process: it is our own code, not a model's).

Each family's problems are split once by a fixed hash of the statement (the half with the lowest
sha256 is `test`), so no test statement appears in training and every family is in both. Families without a constant are in `train` only (a
held-out one could never be learned from the rest). `code_sft` is the train split with the
reference program as the answer (a fenced ```python block): the supervised warm start.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
import string
from dataclasses import dataclass

TESTS = 3
"""Unit tests per problem."""
INSTRUCTION = "Write a Python program."


@dataclass(frozen=True)
class Family:
    """Problems of one shape: a statement and a program with the same `{k}` / `{m}` constants."""

    statement: str
    program: str
    """The program's last line; the first line reads the input (`READ[input_kind]`)."""
    input_kind: str
    ks: tuple[int, ...] = ()
    ms: tuple[int, ...] = ()


READ = {
    "int": "n=int(input())",
    "two": "a,b=map(int,input().split())",
    "word": "s=input()",
    "list": "x=list(map(int,input().split()))",
}
_STATEMENT_START = {
    "int": "Read an integer n.",
    "two": "Read two integers a and b.",
    "word": "Read a word s.",
    "list": "Read a list of integers x.",
}
_K = tuple(range(2, 10))

FAMILIES = (
    Family("Print n plus {k}.", "print(n+{k})", "int", _K),
    Family("Print n minus {k}.", "print(n-{k})", "int", _K),
    Family("Print n times {k}.", "print(n*{k})", "int", _K),
    Family("Print n modulo {k}.", "print(n%{k})", "int", _K),
    Family("Print a plus b plus {k}.", "print(a+b+{k})", "two", _K),
    Family("Print a times b plus {k}.", "print(a*b+{k})", "two", _K),
    Family("Print the sum of x times {k}.", "print(sum(x)*{k})", "list", _K),
    Family("Print the first {k} letters of s.", "print(s[:{k}])", "word", _K),
    Family("Print the last {k} letters of s.", "print(s[-{k}:])", "word", _K),
    Family("Print s repeated {k} times.", "print(s*{k})", "word", _K),
    Family("Print n times {k} plus {m}.", "print(n*{k}+{m})", "int", _K, _K),
    Family("Print n times {k} minus {m}.", "print(n*{k}-{m})", "int", _K, _K),
    Family("Print n plus {k}, times {m}.", "print((n+{k})*{m})", "int", _K, _K),
    Family("Print n minus {k}, times {m}.", "print((n-{k})*{m})", "int", _K, _K),
    Family("Print a times {k} plus b times {m}.", "print(a*{k}+b*{m})", "two", _K, _K),
    Family("Print the sum of x times {k} plus {m}.", "print(sum(x)*{k}+{m})", "list", _K, _K),
    Family("Print the first {k} letters of s, {m} times.", "print(s[:{k}]*{m})", "word", _K, _K),
    Family("Print n squared.", "print(n*n)", "int"),
    Family("Print the absolute value of n.", "print(abs(n))", "int"),
    Family("Print a plus b.", "print(a+b)", "two"),
    Family("Print a minus b.", "print(a-b)", "two"),
    Family("Print a times b.", "print(a*b)", "two"),
    Family("Print the larger of a and b.", "print(max(a,b))", "two"),
    Family("Print the smaller of a and b.", "print(min(a,b))", "two"),
    Family("Print s reversed.", "print(s[::-1])", "word"),
    Family("Print s in upper case.", "print(s.upper())", "word"),
    Family("Print the length of s.", "print(len(s))", "word"),
    Family("Print the sum of x.", "print(sum(x))", "list"),
    Family("Print the largest number in x.", "print(max(x))", "list"),
    Family("Print the smallest number in x.", "print(min(x))", "list"),
    Family("Print x sorted, separated by spaces.", "print(*sorted(x))", "list"),
)


def _draw_input(kind: str, rng: random.Random) -> str:
    if kind == "int":
        return str(rng.randint(-20, 120))
    if kind == "two":
        return f"{rng.randint(-20, 60)} {rng.randint(-20, 60)}"
    if kind == "word":
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 12)))
    return " ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(2, 6)))


def reference_output(program: str, stdin: str) -> str:
    """What our own reference `program` prints for `stdin` (trusted code, run in process)."""
    out = io.StringIO()
    lines = iter(stdin.splitlines())
    with contextlib.redirect_stdout(out):
        exec(program, {"input": lambda: next(lines), "__builtins__": __builtins__})  # noqa: S102
    return out.getvalue()


@dataclass(frozen=True)
class Problem:
    statement: str
    program: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def row(self) -> dict:
        """The Nemotron-RL row of this problem."""
        return {
            "responses_create_params": {
                "input": [{"role": "user", "content": f"{self.statement} {INSTRUCTION}"}]
            },
            "verifier_metadata": {"unit_tests": {"inputs": list(self.inputs), "outputs": list(self.outputs)}},
            "data_source": "code",
        }


def _problem(family: Family, k: int | None, m: int | None) -> Problem:
    statement = f"{_STATEMENT_START[family.input_kind]} {family.statement.format(k=k, m=m)}"
    program = f"{READ[family.input_kind]}\n{family.program.format(k=k, m=m)}"
    rng = random.Random(f"code:{statement}")
    inputs = tuple(_draw_input(family.input_kind, rng) + "\n" for _ in range(TESTS))
    outputs = tuple(reference_output(program, i) for i in inputs)
    return Problem(statement, program, inputs, outputs)


def problems(split: str) -> list[Problem]:
    """The problems of `split`, in a fixed order."""
    out = []
    for f in FAMILIES:
        family = [_problem(f, k, m) for k in f.ks or (None,) for m in f.ms or (None,)]
        test = _held_out(family) if f.ks else set()
        out += [p for p in family if (p.statement in test) == (split == "test")]
    return out


def _held_out(family: list[Problem]) -> set[str]:
    """Half of a family's statements, the first by a fixed hash (so every family is in both splits)."""
    ranked = sorted((p.statement for p in family), key=lambda s: hashlib.sha256(s.encode()).hexdigest())
    return set(ranked[: len(ranked) // 2])


def solution(problem: Problem) -> str:
    """The reference answer as a model should write it."""
    return f"```python\n{problem.program}\n```"


def rows(split: str) -> list[dict]:
    """`builtin:code@<split>`: Nemotron-RL rows."""
    return [p.row() for p in problems(split)]


def sft_rows(split: str) -> list[dict]:
    """`builtin:code_sft@<split>`: the same problems with the reference program as the answer."""
    return [
        {"problem": f"{p.statement} {INSTRUCTION}", "answer": solution(p), "data_source": "code"}
        for p in problems(split)
    ]
