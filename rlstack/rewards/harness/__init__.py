"""How an assert-style or HumanEval test runs against a program: in another process than the program.

A program under RL is hostile, and a test that shares its interpreter can be forged (read the test
from the caller's frame, patch the comparison, fork a child that runs the test to learn what it
expects). So one sandboxed run (`rewards/sandbox/`) holds two processes:

- the test's process (`judge.py`, the run's `main.py`): it reads the job on stdin, makes itself
  non-dumpable, starts the program's process, runs the row's fixed code and the test with stand-ins
  for the program's names, compares real values and writes the verdict on its own stdout;
- the program's process (`answers.py`, forked by the test's process before that has read its job,
  so before anything of the test is in memory): it runs the program and answers calls, with arguments, results and raised exceptions
  crossing as plain data only (`plain.py`: None, bool, int, float, complex, str, bytes, list, tuple,
  dict, set, recursively; anything else stays there as a handle the test may call, read and iterate
  over, and one used as a value fails the test with status `not_plain_data`).

The program never holds the test's text, the verdict's descriptor, or a way into the test's
process: it was forked before the test was read, the test's process is non-dumpable (no
ptrace, no `/proc/<pid>/mem` or `fd/` for a process without CAP_SYS_PTRACE), they share no memory,
and both stay inside the run's limits. There is no secret: the verdict is whatever the test's
process writes, and only it writes there. The test process is no more trusted than the dataset the
test comes from.

The scripts are self-contained (the standard library only), so they run the same in the local
sandbox and on a SandboxFusion server: `JUDGE` is the program a runner runs, `job(...)` its stdin,
`verdict(result)` the (status, reason) of its result.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import json
import marshal
import sys
from pathlib import Path

from rlstack.rewards.sandbox import SandboxResult

_HERE = Path(__file__).parent
STATUSES = frozenset(
    ("passed", "wrong_answer", "runtime_error", "early_exit", "not_plain_data", "time_limit", "bad_tests")
)
"""What the test's process can say of a test (the run's own status, e.g. `memory_limit`, comes first)."""


def _script() -> str:
    """The test's process's program: `plain.py` and `answers.py` made importable as `plain` and
    `answers`, then `judge.py` run as `__main__`. Each file travels as its source and as its code
    compiled here: an interpreter with this one's bytecode (the local sandbox runs this interpreter)
    loads the code instead of compiling the source, ~4 ms less per run."""
    lines = [
        "import marshal as _marshal, sys as _sys",
        f"_same = _sys.modules['_frozen_importlib_external'].MAGIC_NUMBER == {importlib.util.MAGIC_NUMBER!r}",
        "def _code(source, code, name):",
        "    return _marshal.loads(code) if _same else compile(source, name, 'exec')",
    ]
    for name in ("plain", "answers", "judge"):
        source = (_HERE / f"{name}.py").read_text()
        code = marshal.dumps(compile(source, f"{name}.py", "exec"))
        namespace = "globals()"
        if name != "judge":
            lines.append(f"_module = _sys.modules[{name!r}] = type(_sys)({name!r})")
            namespace = "_module.__dict__"
        lines.append(f"exec(_code({source!r}, {code!r}, {name + '.py'!r}), {namespace})")
    return "\n".join(lines) + "\n"


JUDGE = _script()
"""The test's process, run as `main.py` (it forks the program's); its stdin is `job(...)`."""


def job(program: str, test: str, fixed: str = "", keep: str = "") -> str:
    """The test's process's stdin: run `test` against `program`. `fixed`: code (a HumanEval prompt's
    helpers) run in the test's process, whose definitions the test sees instead of the program's,
    except `keep` (the function under test)."""
    return json.dumps(
        {
            "program": program,
            "test": test,
            "fixed": fixed,
            "keep": keep,
            "names": list(program_names(test, keep)),
            "modules": list(used_module_names(test)),
        }
    )


def verdict(result: SandboxResult) -> tuple[str, str]:
    """(status, reason) of a run of `JUDGE`: the run's own status when it did not end normally (a time
    or memory limit), else the verdict the test's process wrote."""
    if result.status != "ok":
        return result.status, result.error_line
    lines = result.stdout.strip().splitlines()
    try:
        said = json.loads(lines[-1])
        status, reason = said["status"], said["reason"]
    except (IndexError, ValueError, KeyError, TypeError):
        return "sandbox_error", "the test's process ended without a verdict"
    if status not in STATUSES or not isinstance(reason, str):
        return "sandbox_error", f"the test's process gave an unknown verdict {status!r}"
    return status, reason


@functools.lru_cache(maxsize=4096)
def program_names(test: str, keep: str = "") -> tuple[str, ...]:
    """The names `test` reads that the program may define for it: every name it loads but the builtins'
    (a program's `abs = lambda x: 0` is not the test's `abs`), and `keep`."""
    tree = _parse(test)
    loaded = set() if tree is None else _loaded(tree)
    names = {name for name in loaded if not hasattr(builtins, name)}
    return tuple(sorted(names | ({keep} if keep else set())))


@functools.lru_cache(maxsize=4096)
def used_module_names(code: str) -> tuple[str, ...]:
    """Standard-library module names `code` reads attributes of (`math.isclose(...)`, with or without
    an import: a test may rely on the program's `import math`). The test gets its own modules under
    them, never the program's object of that name (a `class math` with an `isclose` that says True);
    a name only called (`copy(x)`) stays the program's."""
    tree = _parse(code)
    if tree is None:
        return ()
    bases = {
        node.value.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    return tuple(
        sorted(name for name in bases if name in sys.stdlib_module_names and not name.startswith("_"))
    )


def _loaded(tree: ast.Module) -> set[str]:
    return {
        node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None
