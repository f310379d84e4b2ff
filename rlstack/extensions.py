"""Loading user code that the config names: `package.module:attr` or `path/to/file.py:attr`.

Shared by reward functions (`rewards/loader.py`), agent tools (`tools/registry.py`) and environment
feedback (`rollout/agent.py`). A file is
imported once per process under a name derived from its resolved path, so naming the same file
twice (a reward and an extra reward, or two tools) gives the same module.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


def load_module(target: str, where: str, kind: str, error: type[Exception]) -> ModuleType:
    """The module `target` (a `.py` path or an importable name); `error(message)` says what failed,
    prefixed with `where` (the config key), `kind` naming the file in messages ("reward file")."""
    if not target.endswith(".py"):
        try:
            return importlib.import_module(target)
        except ImportError as e:
            raise error(
                f"{where}: cannot import module {target!r} ({e}); is it installed or on PYTHONPATH?"
            ) from e
    path = Path(target).resolve()
    if not path.is_file():
        raise error(f"{where}: file {target!r} does not exist (relative paths start at {Path.cwd()})")
    name = f"rlstack_user_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise error(f"{where}: importing {kind} {target!r} failed: {user_error(e, str(path))}") from e
    return module


def load_function(ref: str, where: str, kind: str, error: type[Exception]) -> tuple[ModuleType, Callable]:
    """The module and function of `ref` (`path/to/file.py:fn` or `package.module:fn`), as `load_module`."""
    if ":" not in ref:
        raise error(f"{where}={ref!r} must be path/to/file.py:function_name or package.module:function_name")
    target, name = ref.rsplit(":", 1)
    module = load_module(target, where, kind, error)
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        names = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        raise error(f"{target!r} has no function {name!r}; functions there: {names}")
    return module, fn


def source_file(fn: Callable) -> str | None:
    """The file a user's function is defined in; None for one without Python source (a builtin)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return code.co_filename if code is not None else None


def user_error(e: BaseException, file: str | None) -> str:
    """`Type: message` of an exception raised in user code, with where in the user's `file`: each of its
    frames (path, line, function and the line's text), outermost first, then where the exception was raised
    when that is elsewhere (a library the file calls). No frame in `file`: `Type: message` alone."""
    what = f"{type(e).__name__}: {e}"
    if file is None:
        return what
    target = os.path.realpath(file)
    if isinstance(e, SyntaxError) and e.filename and os.path.realpath(e.filename) == target:
        text = (e.text or "").strip()
        return f"{type(e).__name__}: {e.msg} at {_shown(e.filename)}:{e.lineno}" + (
            f": `{text}`" if text else ""
        )
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if os.path.realpath(f.filename) == target]
    own = [f for i, f in enumerate(own) if i == 0 or f.lineno != own[i - 1].lineno]  # a comprehension's frame
    if not own:
        return what
    where = [
        f"{_shown(f.filename)}:{f.lineno} in {f.name}" + (f": `{f.line.strip()}`" if f.line else "")
        for f in own
    ]
    if frames[-1] is not own[-1]:
        where.append(f"raised in {_shown(frames[-1].filename)}:{frames[-1].lineno}")
    return f"{what} at {' -> '.join(where)}"


def _shown(path: str) -> str:
    """`path` relative to the working directory where it lies below it, else as it is."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
