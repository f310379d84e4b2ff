"""Code reward: run the program in a response against unit tests, in the sandbox (`rewards/sandbox.py`).

The program is the last ```python (or ```py / bare ```) fenced block, else the last `<code>…</code>`.
Tests (a dict, or its JSON string in `ground_truth`) come in two styles:

- stdin/stdout pairs, as in Nemotron-RL competitive coding rows:
  `{"verifier_metadata": {"unit_tests": {"inputs": [...], "outputs": [...]}}}` (or the inner
  `{"inputs": [...], "outputs": [...]}`). An output matches when the token sequences agree, numeric
  tokens within 1e-6 (absolute or relative), so trailing whitespace and `2.50` vs `2.5` do not matter.
- assert-style: `{"asserts": ["assert add(1, 2) == 3", ...]}`, each appended to the program and run
  on its own; a test passes when the program exits cleanly.

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
from typing import Any

from rlstack.rewards.sandbox import SandboxLimits, SandboxResult, run_python

REWARD_TYPE = "batch"

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_CODE_TAG = re.compile(r"<code>(.*?)</code>", re.DOTALL)
_TOL = 1e-6

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
    """Token-wise equality; numeric tokens equal within 1e-6 absolute or relative."""
    a, b = got.split(), expected.split()
    return len(a) == len(b) and all(_tokens_match(x, y) for x, y in zip(a, b))


def _tokens_match(x: str, y: str) -> bool:
    if x == y:
        return True
    try:
        fx, fy = float(x), float(y)
    except ValueError:
        return False
    return math.isclose(fx, fy, rel_tol=_TOL, abs_tol=_TOL)


def _parse_tests(tests: dict[str, Any] | str) -> list[tuple[str, str | None, str]]:
    """(program suffix, expected stdout or None for assert-style, stdin) per test."""
    if isinstance(tests, str):
        tests = json.loads(tests)
    if "verifier_metadata" in tests:
        tests = tests["verifier_metadata"]["unit_tests"]
    if "asserts" in tests:
        return [("\n\n" + a + "\n", None, "") for a in tests["asserts"]]
    inputs, outputs = tests["inputs"], tests["outputs"]
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} test inputs but {len(outputs)} outputs")
    return [("", str(out), str(inp)) for inp, out in zip(inputs, outputs)]


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
    `total`, `status` (`passed`,
    `wrong_answer`, a sandbox status of the first failing test, `no_code` or `bad_tests`) and `reason`.
    Tests not run (after the first failure with `stop_at_first_failure`, the first `time_limit` with
    `stop_at_first_timeout`, or once `total_time_s` is spent) count as failed.
    """
    if mode not in ("fraction", "all_or_nothing"):
        raise ValueError(f"worker.reward.code.mode must be 'fraction' or 'all_or_nothing', got {mode!r}")
    code = extract_code(response)
    if code is None:
        return _score(0, 0, mode, "no_code", "no code")
    try:
        cases = _parse_tests(tests)
    except (ValueError, KeyError, TypeError) as e:
        return _score(0, 0, mode, "bad_tests", f"unusable tests: {type(e).__name__}: {e}")
    limits = SandboxLimits(wall_s=test_time_s, cpu_s=test_time_s, memory_mb=memory_mb)
    deadline = time.monotonic() + total_time_s
    passed, status, reason = 0, "passed", ""
    for i, (suffix, expected, stdin) in enumerate(cases):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if not reason:
                status, reason = "time_limit", f"total time limit of {total_time_s:g}s spent before test {i}"
            reason += _not_run(i, len(cases))
            break
        result = runner(code + suffix, stdin, limits._replace(wall_s=min(test_time_s, remaining)))
        if result.status == "ok" and (expected is None or outputs_match(result.stdout, expected)):
            passed += 1
            continue
        if not reason:
            status = "wrong_answer" if result.status == "ok" else result.status
            reason = f"test {i}: " + (result.error_line or "wrong answer")
        if stop_at_first_failure or (stop_at_first_timeout and result.status == "time_limit"):
            reason += _not_run(i + 1, len(cases))
            break
    return _score(passed, len(cases), mode, status, reason)


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
        code, tests = extract_code(str(x["response"])), x["ground_truth"]
        key = (code, _tests_key(tests))
        if code is None or key not in seen:
            s = score_code(str(x["response"]), tests, **settings)
            seen[key] = {k: s[k] for k in ("overall", "pass_rate", "accuracy", "status", "reason")}
        out.append(dict(seen[key]))
    return out
