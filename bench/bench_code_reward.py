"""Code-reward throughput: unit tests per second through the sandbox, against an unsandboxed baseline.

Baseline: what veRL forks do by default, `subprocess.run([python, "-c", program], input=stdin,
timeout=...)` in the trainer's own environment, one process per test, no isolation. rlstack:
`rlstack.rewards.code.score_code` (a fresh sandbox per test: own uid; new mount, network, IPC and
PID namespaces with a root of its own; rlimits; group kill), sequentially and through the reward
manager with `num_workers` threads, each run started by a launcher process
(`rlstack.rewards.launcher`); and sequentially with each run started by the caller itself
(`sandbox_in_process`, the behaviour before the launchers). The same problems, solutions and tests
on each side, in ABBA order.

The caller holds `--ballast-mb` of touched memory (default 600, a small trainer's model and
optimizer) for every side: starting a run from the caller forks it, and a fork costs more the
more memory the caller maps; a launcher is a small process whatever the caller holds.

Workload: 3 competitive-programming problems (sum of pairs, reverse a line, count primes below n)
with a correct solution each; each problem has `--tests` stdin/stdout tests.

Hanging program: a program that sleeps forever, scored on 5 tests with `--hang-test-s` per test,
once running every test to its limit (`stop_at_first_timeout=False`, the behaviour before it
existed) and once with the default (the tests stop at the first timeout).

    .venv/bin/python bench/bench_code_reward.py          # writes bench/results/code_reward.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from rlstack.batch import Batch
from rlstack.config import RewardConfig
from rlstack.rewards import sandbox
from rlstack.rewards.code import outputs_match, score_code
from rlstack.rewards.loader import RewardFunction
from rlstack.rewards.manager import RewardManager
from rlstack.rewards.sandbox import probe, runs

PROBLEMS = {
    "sum_pair": (
        "a, b = map(int, input().split())\nprint(a + b)\n",
        lambda i: (f"{i} {3 * i}\n", f"{4 * i}\n"),
    ),
    "reverse": (
        "print(input()[::-1])\n",
        lambda i: (f"abc{i}xyz\n", f"zyx{str(i)[::-1]}cba\n"),
    ),
    "count_primes": (
        "n = int(input())\nsieve = [True] * max(n, 2)\nsieve[0] = sieve[1] = False\n"
        "for p in range(2, int(n ** 0.5) + 1):\n"
        "    if sieve[p]:\n        sieve[p * p :: p] = [False] * len(sieve[p * p :: p])\n"
        "print(sum(sieve[:n]))\n",
        lambda i: (f"{1000 + i}\n", f"{_count_primes(1000 + i)}\n"),
    ),
}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _count_primes(n: int) -> int:
    return sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, n))


def _tests(name: str, n: int) -> dict[str, list[str]]:
    pairs = [PROBLEMS[name][1](i) for i in range(n)]
    return {"inputs": [p[0] for p in pairs], "outputs": [p[1] for p in pairs]}


def baseline_python() -> str:
    """The baseline's interpreter: the system's `python3` (what the sandbox used to run here, so the
    ratios stay comparable with earlier runs), else this one."""
    return shutil.which("python3", path=runs._SANDBOX_PATH) or sys.executable


def run_baseline(n_tests: int) -> tuple[int, float]:
    """Unsandboxed: one `python -c` per test in the caller's environment."""
    python = baseline_python()
    passed, start = 0, time.perf_counter()
    for name, (program, _) in PROBLEMS.items():
        tests = _tests(name, n_tests)
        for stdin, expected in zip(tests["inputs"], tests["outputs"]):
            out = subprocess.run(
                [python, "-c", program], input=stdin, capture_output=True, text=True, timeout=10
            )
            passed += out.returncode == 0 and outputs_match(out.stdout, expected)
    return passed, time.perf_counter() - start


def run_sandboxed(n_tests: int, in_process: bool = False) -> tuple[int, float]:
    runner = sandbox.run_python_here if in_process else sandbox.run_python
    passed, start = 0, time.perf_counter()
    for name, (program, _) in PROBLEMS.items():
        result = score_code(f"```python\n{program}```", _tests(name, n_tests), runner=runner)
        passed += result["passed"]
    return passed, time.perf_counter() - start


def run_hanging(test_time_s: float, stop_at_first_timeout: bool) -> float:
    """Seconds to score a program that never finishes on 5 stdin/stdout tests."""
    tests = {"inputs": [f"{i}\n" for i in range(5)], "outputs": [f"{i}\n" for i in range(5)]}
    start = time.perf_counter()
    out = score_code(
        "```python\nimport time\ntime.sleep(3600)\n```",
        tests,
        test_time_s=test_time_s,
        stop_at_first_timeout=stop_at_first_timeout,
    )
    elapsed = time.perf_counter() - start
    assert (out["passed"], out["total"], out["status"]) == (0, 5, "time_limit"), out
    return elapsed


def run_manager(n_tests: int, workers: int) -> tuple[int, float]:
    """The reward manager with `workers` threads, one response per problem split into chunks of tests."""
    chunks = max(1, workers * 2)
    rows, truths = [], []
    for name, (program, _) in PROBLEMS.items():
        tests = _tests(name, n_tests)
        for c in range(chunks):
            rows.append(f"```python\n{program}```")
            truths.append({k: v[c::chunks] for k, v in tests.items()})

    def sequential(x: dict) -> dict:
        s = score_code(x["response"], x["ground_truth"])
        return {"overall": s["overall"], "passed": float(s["passed"])}

    n = len(rows)
    batch = Batch(
        {
            "response_text": rows,
            "response_mask": torch.ones(n, 1, dtype=torch.long),
            "ground_truth": truths,
            "prompt": [""] * n,
            "data_source": ["bench"] * n,
            "extra": [{} for _ in range(n)],
            "where": [f"bench:{i}" for i in range(n)],
        }
    )
    manager = RewardManager(
        RewardConfig(num_workers=workers, timeout_s=60), [RewardFunction(sequential, "sequential", "bench")]
    )
    start = time.perf_counter()
    out = manager.score(batch)
    elapsed = time.perf_counter() - start
    return int(sum(c["passed"] for c in out["reward_components"])), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tests", type=int, default=20, help="tests per problem (3 problems)")
    parser.add_argument("--workers", type=int, default=2, help="reward manager threads")
    parser.add_argument(
        "--hang-test-s", type=float, default=5.0, help="test_time_s of the hanging program (config default 5)"
    )
    parser.add_argument(
        "--ballast-mb", type=int, default=600, help="memory the caller holds (a trainer's model)"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "code_reward.json"))
    args = parser.parse_args()
    ballast = torch.ones(args.ballast_mb * 2**20 // 4)  # touched: resident, like a model's weights
    total = 3 * args.tests
    sides = ("baseline", "sandbox", "sandbox_in_process", "sandbox_workers")
    times: dict[str, list[float]] = {side: [] for side in sides}
    for order in (sides, sides[::-1]):
        for side in order:
            if side == "baseline":
                passed, t = run_baseline(args.tests)
            elif side == "sandbox":
                passed, t = run_sandboxed(args.tests)
            elif side == "sandbox_in_process":
                passed, t = run_sandboxed(args.tests, in_process=True)
            else:
                passed, t = run_manager(args.tests, args.workers)
            assert passed == total, f"{side}: {passed} of {total} tests passed"
            times[side].append(t)
    rate = {k: total / (sum(v) / len(v)) for k, v in times.items()}
    hanging = {
        "every_test_to_its_limit": run_hanging(args.hang_test_s, stop_at_first_timeout=False),
        "stop_at_first_timeout": run_hanging(args.hang_test_s, stop_at_first_timeout=True),
    }
    result = {
        "tests": total,
        "tests_per_s": {k: round(v, 2) for k, v in rate.items()},
        "sandbox_vs_baseline": round(rate["sandbox"] / rate["baseline"], 3),
        "sandbox_workers_vs_baseline": round(rate["sandbox_workers"] / rate["baseline"], 3),
        "launcher_vs_in_process": round(rate["sandbox"] / rate["sandbox_in_process"], 3),
        "hanging_program": {
            "tests": 5,
            "test_time_s": args.hang_test_s,
            "seconds": {k: round(v, 2) for k, v in hanging.items()},
        },
        "workers": args.workers,
        "baseline_python": baseline_python(),
        "sandbox_python": probe._interpreter(),
        "caller_ballast_mb": ballast.numel() * 4 // 2**20,
        "caller_rss_mb": round(_rss_mb()),
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "root": os.geteuid() == 0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
