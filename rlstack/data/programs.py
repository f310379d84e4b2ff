"""`builtin:code`: short word problems to solve with a program, with stdin/stdout tests, in
Nemotron-RL's row format.

Every problem reads two integers n and k from one input line and prints one number; a short story
says which number: "Read two integers n and k. Tom has n apples and gives k away. How many apples
are left? Write a Python program." -> `n,k=map(int,input().split())` / `print(n-k)`. Five
operations (plus, minus, times, floor division, remainder) are told by two stories each, with
a name and a noun drawn from eight each; the verbs and the question name the operation ("buys k
more", "shares ... among k friends ... each", "... left over"), the name and the noun do not.

What a model has to learn is which operation a story asks for: the programs differ in one
character. The code demo (`rlstack demo --task code`) leaves exactly that to RL: its warm start,
`code_guess_sft`, is a weak teacher's answers — the input line and the program's form right, the
operation right for about 40% of the statements and a decoy otherwise (`DECOYS`) — so
the warm start writes well-formed programs that mostly pick the decoy, and GRPO with the sandboxed
unit-test reward has to find which story means which operation. `code_sft` holds the reference
answers (a teacher that is always right).

Rows are raw Nemotron-RL competitive-coding rows (`responses_create_params.input`,
`verifier_metadata.unit_tests.inputs/outputs`, `data_source`), so they go through the same
`nemotron_code` normaliser as a user's file. Each problem has `TESTS` tests whose inputs are drawn
from a generator seeded by its statement, and whose outputs are its reference program's (run here,
in process: it is our own code, not a model's); the tests always tell the five operations apart.

Problems are split once by a fixed hash of the statement (sha256 modulo 5 below 2 is `test`, about
40%): a held-out statement never appears in training, while every story, name and noun is in both
splits.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
from dataclasses import dataclass

TESTS = 3
"""Unit tests per problem."""
INSTRUCTION = "Write a Python program."
READ = "n,k=map(int,input().split())"
START = "Read two integers n and k."

OPERATIONS = {
    "plus": "print(n+k)",
    "minus": "print(n-k)",
    "times": "print(n*k)",
    "divide": "print(n//k)",
    "remainder": "print(n%k)",
}
"""The last line of each operation's program."""
STORIES = (
    ("plus", "{name} has n {noun} and buys k more. How many {noun} does {name} have now?"),
    ("plus", "{name} had n {noun} and found k more. How many {noun} are there in all?"),
    ("minus", "{name} has n {noun} and gives k away. How many {noun} are left?"),
    ("minus", "{name} had n {noun} and lost k of them. How many {noun} does {name} still have?"),
    ("times", "{name} has n boxes with k {noun} in each box. How many {noun} are there in all?"),
    ("times", "{name} buys n bags of k {noun}. How many {noun} did {name} buy?"),
    ("divide", "{name} shares n {noun} equally among k friends. How many {noun} does each friend get?"),
    ("divide", "{name} packs n {noun} into bags of k. How many full bags are there?"),
    ("remainder", "{name} shares n {noun} equally among k friends. How many {noun} are left over?"),
    ("remainder", "{name} packs n {noun} into bags of k. How many {noun} do not fit in a full bag?"),
)
NAMES = ("Tom", "Ana", "Raj", "Mia", "Leo", "Eva", "Sam", "Zoe")
NOUNS = ("apples", "pens", "cards", "eggs", "shells", "coins", "books", "stamps")


def reference_output(program: str, stdin: str) -> str:
    """What our own reference `program` prints for `stdin` (trusted code, run in process)."""
    out = io.StringIO()
    lines = iter(stdin.splitlines())
    with contextlib.redirect_stdout(out):
        exec(program, {"input": lambda: next(lines), "__builtins__": __builtins__})  # noqa: S102
    return out.getvalue()


def program_of(operation: str) -> str:
    return f"{READ}\n{OPERATIONS[operation]}"


@dataclass(frozen=True)
class Problem:
    statement: str
    operation: str
    story: int
    """Index into `STORIES`."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def program(self) -> str:
        """The reference program."""
        return program_of(self.operation)

    @property
    def prompt(self) -> str:
        return f"{self.statement} {INSTRUCTION}"

    def row(self) -> dict:
        """The Nemotron-RL row of this problem."""
        return {
            "responses_create_params": {"input": [{"role": "user", "content": self.prompt}]},
            "verifier_metadata": {"unit_tests": {"inputs": list(self.inputs), "outputs": list(self.outputs)}},
            "data_source": "code",
        }


def _problem(story: int, statement: str) -> Problem:
    """The problem with `TESTS` inputs on which the five operations print five different results."""
    operation = STORIES[story][0]
    rng = random.Random(f"code:{statement}")
    while True:
        inputs = tuple(f"{rng.randint(10, 99)} {rng.randint(2, 9)}\n" for _ in range(TESTS))
        outputs = {op: tuple(reference_output(program_of(op), i) for i in inputs) for op in OPERATIONS}
        if len(set(outputs.values())) == len(OPERATIONS):
            return Problem(statement, operation, story, inputs, outputs[operation])


def held_out(statement: str) -> bool:
    """The fixed split: about 40% of statements are `test`."""
    return int(hashlib.sha256(statement.encode()).hexdigest(), 16) % 5 < 2


def problems(split: str) -> list[Problem]:
    """The problems of `split`, in a fixed order."""
    out = []
    for story, (_, text) in enumerate(STORIES):
        for name in NAMES:
            for noun in NOUNS:
                statement = f"{START} {text.format(name=name, noun=noun)}"
                if held_out(statement) == (split == "test"):
                    out.append(_problem(story, statement))
    return out


def solution(program: str) -> str:
    """A program as a model should write it: one fenced ```python block."""
    return f"```python\n{program}\n```"


DECOYS = {"plus": "minus", "minus": "times", "times": "divide", "divide": "remainder", "remainder": "plus"}
"""The operation the weak teacher mistakes each one for: one cycle through all five, so that no two
operations swap and the teacher's mix of answers differs for every operation (a model that fits
it has to tell the stories apart)."""
TEACHER_RIGHT = 0.4
"""How often the weak teacher writes the right operation; otherwise it writes the decoy."""


def guessed_operation(problem: Problem) -> str:
    """The weak teacher's operation for `problem`: the right one with probability `TEACHER_RIGHT`,
    else its decoy (`DECOYS`), drawn once per statement."""
    right = random.Random(f"guess:{problem.statement}").random() < TEACHER_RIGHT
    return problem.operation if right else DECOYS[problem.operation]


def rows(split: str) -> list[dict]:
    """`builtin:code@<split>`: Nemotron-RL rows."""
    return [p.row() for p in problems(split)]


def sft_rows(split: str) -> list[dict]:
    """`builtin:code_sft@<split>`: the same problems with the reference program as the answer."""
    return [
        {"problem": p.prompt, "answer": solution(p.program), "data_source": "code"} for p in problems(split)
    ]


def guess_sft_rows(split: str) -> list[dict]:
    """`builtin:code_guess_sft@<split>`: the same problems with the weak teacher's program as the
    answer (`guessed_operation`): the warm start of the code demo."""
    return [
        {"problem": p.prompt, "answer": solution(program_of(guessed_operation(p))), "data_source": "code"}
        for p in problems(split)
    ]
