"""Loading a reward function named by `path/to/file.py:fn`, `package.module:fn` or `builtin:<name>`.

A function with a parameter named `judge` is called with the run's LLM judge (`RewardManager.ask_judge`:
`judge([(question, reference, response[, images]), ...]) -> [score, ...]`), in any of the three
interfaces (EasyR1's batch and sequential ones, veRL's `compute_score`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from rlstack.config.reward import DEFAULT_FUNCTIONS, default_function, names_a_file_alone, no_default_function
from rlstack.errors import RLStackError
from rlstack.extensions import load_function, load_module, source_file
from rlstack.rewards import builtin


class RewardLoadError(RLStackError, ValueError):
    """A reward function reference that cannot be resolved, with how to fix it."""


@dataclass
class RewardFunction:
    fn: Callable
    reward_type: str
    """`batch`: fn(list[dict]) -> list[dict]; `sequential`: fn(dict) -> dict."""
    name: str
    file: str | None = None
    """The user's file that defines the function (its frames are shown when it raises); None: a built-in."""
    wants_judge: bool = False
    """The function has a parameter named `judge`: it is called with the judge (`RewardManager.ask_judge`)."""


def load_reward_function(ref: str, key: str = "worker.reward.reward_function") -> RewardFunction:
    """The function `ref` names; `key` is the config key that named it (for the errors)."""
    if ref.startswith("builtin:"):
        name = ref.removeprefix("builtin:")
        if name not in builtin.BUILTINS:
            raise RewardLoadError(
                f"{key}={ref!r}: no such built-in; built-ins are "
                + ", ".join(f"builtin:{k}" for k in builtin.BUILTINS)
            )
        fn = builtin.BUILTINS[name].fn
        return RewardFunction(fn, "batch", ref, wants_judge=_takes_judge(fn))
    if names_a_file_alone(ref):
        module = load_module(ref, key, "reward file", RewardLoadError)
        name = default_function([n for n in DEFAULT_FUNCTIONS if callable(getattr(module, n, None))])
        if name is None:
            functions = [
                n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
            ]
            raise RewardLoadError(no_default_function(key, ref, functions))
        ref = f"{ref}:{name}"
    module, fn = load_function(ref, key, "reward file", RewardLoadError)
    target, file = ref.rsplit(":", 1)[0], source_file(fn)
    reward_type = getattr(module, "REWARD_TYPE", None)
    if reward_type is None and VERL_RESPONSE_NAMES & set(inspect.signature(fn).parameters):
        return RewardFunction(_from_verl(fn, ref), "sequential", ref, file, _takes_judge(fn))
    reward_type = reward_type or "batch"
    if reward_type not in ("batch", "sequential"):
        raise RewardLoadError(f"{target}: REWARD_TYPE must be 'batch' or 'sequential', got {reward_type!r}")
    return RewardFunction(fn, reward_type, ref, file, _takes_judge(fn))


def _takes_judge(fn: Callable) -> bool:
    """Whether `fn` asks for the judge: a parameter named `judge` (a `**kwargs` alone does not ask)."""
    return "judge" in inspect.signature(fn).parameters


VERL_RESPONSE_NAMES = {"solution_str", "predict_str"}
"""The response's parameter name in veRL's reward functions (`compute_score(data_source, solution_str,
ground_truth, extra_info)`) and in forks of it (DeepEyes: `compute_score(predict_str, ground_truth, extra_info)`)."""


def _from_verl(fn: Callable, ref: str) -> Callable[..., dict]:
    """A veRL-style reward function (called with the keyword arguments of veRL's it names: data_source,
    solution_str / predict_str, ground_truth, extra_info; returns a number, or a dict whose `score` is the
    reward) as a sequential one: `fn(reward_input) -> {"overall": ..., ...}`."""
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def per_sample(x: dict, **kwargs) -> dict:
        given = {
            "data_source": x["data_source"],
            "solution_str": x["response"],
            "predict_str": x["response"],
            "ground_truth": x["ground_truth"],
            "extra_info": x["extra"],
        }
        value = fn(**{k: v for k, v in given.items() if k in params or takes_any}, **kwargs)
        if isinstance(value, dict):
            if "score" not in value:
                raise RewardLoadError(
                    f"{ref} returned a dict without 'score' ({sorted(value)}): a veRL-style reward function "
                    "returns a number or a dict whose 'score' is the reward"
                )
            return {"overall": value["score"], **{k: v for k, v in value.items() if k != "score"}}
        return {"overall": float(value)}

    return per_sample
