"""The code reward on small competitive-programming problems: correct, wrong, slow and crashing solutions."""

from __future__ import annotations

import json
import time

import pytest

from rlstack.rewards.code import compute_score, extract_code, outputs_match, score_code
from rlstack.rewards.sandbox import run_python

SUM_TESTS = {
    "verifier_metadata": {
        "unit_tests": {
            "inputs": ["1 2\n", "5 0\n", "-1000000000 -1000000000\n"],
            "outputs": ["3\n", "5\n", "-2000000000\n"],
        }
    }
}
REVERSE_TESTS = {
    "inputs": ["hello world\n", "a b c\n", "single\n"],
    "outputs": ["world hello\n", "c b a\n", "single\n"],
}
PRIMES_TESTS = {"inputs": ["10\n", "1\n", "100\n", "100000\n"], "outputs": ["4\n", "0\n", "25\n", "9592\n"]}
DIVIDE_TESTS = {"inputs": ["1 3\n", "10 4\n"], "outputs": ["0.333333333\n", "2.5\n"]}
ASSERT_TESTS = {
    "asserts": [
        "assert gcd(12, 18) == 6",
        "assert gcd(7, 13) == 1",
        "assert gcd(0, 5) == 5",
        "assert gcd(48, 36) == 12",
    ]
}

SUM_OK = "a, b = map(int, input().split())\nprint(a + b)"
SUM_WRONG = "a, b = map(int, input().split())\nprint(a - b)"
REVERSE_OK = "print(' '.join(input().split()[::-1]))   "
PRIMES_OK = """
n = int(input())
sieve = bytearray([1]) * (n + 1)
sieve[:2] = b"\\x00\\x00"[: n + 1]
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
print(sum(sieve))
"""
PRIMES_SLOW = """
n = int(input())
count = 0
for k in range(2, n + 1):
    if all(k % d for d in range(2, k)):
        count += 1
print(count)
"""
PRIMES_CRASH = "n = int(input())\nprint([0] * 3)[n]"
DIVIDE_OK = "a, b = map(int, input().split())\nprint(a / b)"
DIVIDE_ROUNDED = "a, b = map(int, input().split())\nprint(f'{a / b:.2f}')"
GCD_OK = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a"
GCD_WRONG = "def gcd(a, b):\n    return a if b == 0 else (b if a == 0 else 1)"


def _fence(code: str, lang: str = "python") -> str:
    return f"Let me think.\n```{lang}\n{code}\n```\nDone."


@pytest.mark.parametrize(
    ("code", "tests", "pass_rate", "status"),
    [
        (SUM_OK, SUM_TESTS, 1.0, "passed"),
        (SUM_WRONG, SUM_TESTS, 1 / 3, "wrong_answer"),
        (REVERSE_OK, REVERSE_TESTS, 1.0, "passed"),
        (PRIMES_OK, PRIMES_TESTS, 1.0, "passed"),
        (PRIMES_SLOW, PRIMES_TESTS, 0.75, "time_limit"),
        (PRIMES_CRASH, PRIMES_TESTS, 0.0, "runtime_error"),
        (DIVIDE_OK, DIVIDE_TESTS, 1.0, "passed"),
        (DIVIDE_ROUNDED, DIVIDE_TESTS, 0.5, "wrong_answer"),
        (GCD_OK, ASSERT_TESTS, 1.0, "passed"),
        (GCD_WRONG, ASSERT_TESTS, 0.5, "runtime_error"),
    ],
)
def test_solutions(code, tests, pass_rate, status):
    out = score_code(_fence(code), tests, test_time_s=1.0)
    assert out["pass_rate"] == pytest.approx(pass_rate)
    assert out["overall"] == pytest.approx(pass_rate)
    assert out["status"] == status, out
    if status == "runtime_error" and tests is PRIMES_TESTS:
        assert "TypeError" in out["reason"]
    if status == "runtime_error" and tests is ASSERT_TESTS:
        assert "AssertionError" in out["reason"]


def test_all_or_nothing_and_stop_at_first_failure():
    out = score_code(_fence(SUM_WRONG), SUM_TESTS, mode="all_or_nothing")
    assert out["overall"] == 0.0 and out["pass_rate"] == pytest.approx(1 / 3)
    assert score_code(_fence(SUM_OK), SUM_TESTS, mode="all_or_nothing")["overall"] == 1.0
    out = score_code(_fence(SUM_WRONG), SUM_TESTS, stop_at_first_failure=True)
    assert out["passed"] == 0 and out["total"] == 3 and out["reason"].startswith("test 0")
    with pytest.raises(ValueError, match="mode"):
        score_code(_fence(SUM_OK), SUM_TESTS, mode="best_of")


def test_total_time_limit():
    out = score_code(
        _fence("import time\ntime.sleep(0.6)\nprint(3)"), SUM_TESTS, test_time_s=2.0, total_time_s=1.0
    )
    assert out["status"] == "time_limit" and out["passed"] < 3


def test_no_code_and_bad_tests():
    out = score_code("I would just add the numbers.", SUM_TESTS)
    assert (out["overall"], out["status"], out["reason"]) == (0.0, "no_code", "no code")
    out = score_code(_fence(SUM_OK), {"inputs": ["1 2"], "outputs": []})
    assert out["overall"] == 0.0 and out["status"] == "bad_tests"
    assert score_code(_fence(SUM_OK), "not json")["status"] == "bad_tests"


def test_extract_code():
    assert extract_code("```python\nfirst\n```\ntext\n```python\nsecond\n```") == "second\n"
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("<code>print(1)</code>") == "print(1)"
    assert extract_code("```python\n```") is None
    assert extract_code("no code here") is None


@pytest.mark.parametrize(
    ("got", "expected", "same"),
    [
        ("3\n", "3", True),
        ("3   \n\n\n", "3\n", True),
        ("1 2\n3", "1 2 3", True),
        ("0.3333333333", "0.333333333", True),
        ("2.50", "2.5", True),
        ("1e9", "1000000000", True),
        ("2.51", "2.5", False),
        ("YES", "yes", False),
        ("1 2", "1 2 3", False),
        ("nan", "3", False),
    ],
)
def test_outputs_match(got, expected, same):
    assert outputs_match(got, expected) is same


def test_compute_score_batch_interface():
    rows = [
        {"response": _fence(SUM_OK), "ground_truth": json.dumps(SUM_TESTS)},
        {"response": _fence(SUM_WRONG), "ground_truth": SUM_TESTS},
        {"response": "no code", "ground_truth": SUM_TESTS},
    ]
    out = compute_score(rows)
    assert [r["overall"] for r in out] == pytest.approx([1.0, 1 / 3, 0.0])
    assert all(set(r) == {"overall", "pass_rate", "accuracy", "status", "reason"} for r in out)
    assert [r["status"] for r in out] == ["passed", "wrong_answer", "no_code"]


def test_same_program_for_same_tests_runs_once():
    """A group's identical programs (any fencing) run once per call; each copy gets the full result."""
    calls = []

    def counting(program, stdin, limits):
        calls.append((program, stdin))
        return run_python(program, stdin, limits)

    rows = [
        {"response": _fence(SUM_OK), "ground_truth": SUM_TESTS},
        {"response": "Here:\n" + _fence(SUM_OK), "ground_truth": json.dumps(SUM_TESTS)},
        {"response": _fence(SUM_WRONG), "ground_truth": SUM_TESTS},
        {"response": _fence(SUM_OK), "ground_truth": REVERSE_TESTS},
    ]
    out = compute_score(rows, runner=counting)
    assert (
        len(calls) == 3 + 3 + 3
    )  # SUM_OK on SUM_TESTS once (in dict or JSON form), SUM_WRONG, SUM_OK on other tests
    assert [r["overall"] for r in out] == pytest.approx([1.0, 1.0, 1 / 3, 0.0])
    assert [r["accuracy"] for r in out] == [1.0, 1.0, 0.0, 0.0]
    out[0]["status"] = "changed"
    assert out[1]["status"] == "passed"  # copies, not one shared dict


def test_throughput():
    tests = {"inputs": [f"{i} {i}\n" for i in range(40)], "outputs": [f"{2 * i}\n" for i in range(40)]}
    start = time.perf_counter()
    out = score_code(_fence(SUM_OK), tests)
    elapsed = time.perf_counter() - start
    assert out["pass_rate"] == 1.0
    print(f"\ncode reward throughput: {40 / elapsed:.1f} tests/s (sequential, one sandbox per test)")


HANG = "import time\ntime.sleep(3600)"
FIVE_TESTS = {"inputs": [f"{i}\n" for i in range(5)], "outputs": [f"{i}\n" for i in range(5)]}


def test_hanging_program_costs_one_test_time():
    start = time.monotonic()
    out = score_code(_fence(HANG), FIVE_TESTS, test_time_s=0.5)
    elapsed = time.monotonic() - start
    assert (out["passed"], out["total"], out["overall"], out["status"]) == (0, 5, 0.0, "time_limit")
    assert out["reason"].endswith("tests 1-4 not run (counted as failed)"), out
    assert elapsed < 1.5  # five tests run to their limit would take 2.5 s


def test_tests_not_run_count_as_failed():
    """A program that passes tests 0-1 and hangs on test 2: the stop is at 2, the score 2 of 5."""
    code = "n = int(input())\nwhile n == 2:\n    pass\nprint(n)"
    calls = []
    real = run_python

    def counting(program, stdin, limits):
        calls.append(stdin)
        return real(program, stdin, limits)

    out = score_code(_fence(code), FIVE_TESTS, test_time_s=0.5, runner=counting)
    assert calls == ["0\n", "1\n", "2\n"]
    assert (out["passed"], out["pass_rate"], out["status"]) == (2, 0.4, "time_limit")
    assert out["reason"].startswith("test 2: ") and out["reason"].endswith(
        "tests 3-4 not run (counted as failed)"
    )
    calls.clear()
    out = score_code(_fence(code), FIVE_TESTS, test_time_s=0.5, runner=counting, stop_at_first_timeout=False)
    assert (
        len(calls) == 5
        and out["passed"] == 4
        and out["reason"] == "test 2: wall-clock limit of 0.5s exceeded"
    )
