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
import sys
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
        raise error(f"{where}: importing {kind} {target!r} failed: {type(e).__name__}: {e}") from e
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
