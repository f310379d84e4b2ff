"""Loading a reward function named by `path/to/file.py:fn`, `package.module:fn` or `builtin:<name>`."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlstack.errors import RLStackError
from rlstack.rewards import builtin


class RewardLoadError(RLStackError, ValueError):
    """A reward function reference that cannot be resolved, with how to fix it."""


@dataclass
class RewardFunction:
    fn: Callable
    reward_type: str
    """`batch`: fn(list[dict]) -> list[dict]; `sequential`: fn(dict) -> dict."""
    name: str


def load_reward_function(ref: str) -> RewardFunction:
    if ref.startswith("builtin:"):
        name = ref.removeprefix("builtin:")
        if name not in builtin.BUILTINS:
            raise RewardLoadError(
                f"worker.reward.reward_function={ref!r}: no such built-in; built-ins are "
                + ", ".join(f"builtin:{k}" for k in builtin.BUILTINS)
            )
        return RewardFunction(builtin.BUILTINS[name], "batch", ref)
    if ":" not in ref:
        raise RewardLoadError(
            f"worker.reward.reward_function={ref!r} must be path/to/file.py:function_name or package.module:function_name"
        )
    target, fn_name = ref.rsplit(":", 1)
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise RewardLoadError(f"worker.reward.reward_function: file {target!r} does not exist")
        module_name = f"rlstack_user_reward_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise RewardLoadError(f"importing reward file {target!r} failed: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise RewardLoadError(
                f"worker.reward.reward_function: cannot import module {target!r}: {e}"
            ) from e
    fn = getattr(module, fn_name, None)
    if fn is None or not callable(fn):
        names = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        raise RewardLoadError(f"{target!r} has no function {fn_name!r}; functions there: {names}")
    reward_type = getattr(module, "REWARD_TYPE", "batch")
    if reward_type not in ("batch", "sequential"):
        raise RewardLoadError(f"{target}: REWARD_TYPE must be 'batch' or 'sequential', got {reward_type!r}")
    return RewardFunction(fn, reward_type, ref)
