"""Scoring a Batch of responses with the configured reward function."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from rlstack.algos.filters import overlong_penalty
from rlstack.batch import Batch
from rlstack.errors import RLStackError
from rlstack.rewards.loader import RewardFunction


class RewardError(RLStackError, RuntimeError):
    """A reward function that failed or returned something unusable, naming the sample."""


class RewardManager:
    def __init__(
        self,
        reward_fn: RewardFunction,
        kwargs: dict[str, Any] | None = None,
        max_response_length: int = 0,
        overlong_buffer_length: int = 0,
        overlong_penalty_factor: float = 1.0,
    ):
        self.reward_fn = reward_fn
        self.kwargs = kwargs or {}
        self.max_response_length = max_response_length
        self.overlong_buffer_length = overlong_buffer_length
        self.overlong_penalty_factor = overlong_penalty_factor

    def score(self, batch: Batch) -> Batch:
        """Adds `scores` [B] and `reward_components` (name -> list of floats)."""
        inputs = reward_inputs(batch)
        results = self._call(inputs, batch)
        keys = sorted({k for r in results for k in r})
        components = {k: [float(r.get(k, float("nan"))) for r in results] for k in keys}
        scores = torch.tensor(components["overall"], dtype=torch.float32)
        if self.overlong_buffer_length:
            penalty = overlong_penalty(
                batch["response_mask"].sum(-1),
                self.max_response_length,
                self.overlong_buffer_length,
                self.overlong_penalty_factor,
            )
            scores = scores + penalty
            keys.append("overlong")
            components["overlong"] = penalty.tolist()
        batch["scores"] = scores
        batch["reward_components"] = [{k: components[k][i] for k in keys} for i in range(len(batch))]
        return batch

    def _call(self, inputs: list[dict], batch: Batch) -> list[dict]:
        fn, name = self.reward_fn.fn, self.reward_fn.name
        if self.reward_fn.reward_type == "sequential":
            results = []
            for i, x in enumerate(inputs):
                try:
                    results.append(fn(x, **self.kwargs))
                except Exception as e:
                    raise RewardError(
                        f"reward function {name} raised on {_describe(batch, i)}: {type(e).__name__}: {e}"
                    ) from e
        else:
            try:
                results = fn(inputs, **self.kwargs)
            except Exception as e:
                raise RewardError(
                    f"reward function {name} raised on {self._find_culprit(inputs, batch)}"
                ) from e
        if not isinstance(results, list) or len(results) != len(inputs):
            got = (
                f"{type(results).__name__} of length {len(results)}"
                if hasattr(results, "__len__")
                else repr(results)
            )
            raise RewardError(f"reward function {name} must return a list of {len(inputs)} dicts, got {got}")
        for i, r in enumerate(results):
            if not isinstance(r, dict) or "overall" not in r:
                raise RewardError(
                    f"reward function {name} returned {r!r} for {_describe(batch, i)}: each result needs an 'overall' key"
                )
            for k, v in r.items():
                if isinstance(v, torch.Tensor) and v.numel() == 1:
                    r[k] = v = v.item()
                if not isinstance(v, numbers.Real) or isinstance(v, bool):
                    raise RewardError(
                        f"reward function {name}: {k}={v!r} for {_describe(batch, i)} is not a number"
                    )
        return results

    def _find_culprit(self, inputs: list[dict], batch: Batch) -> str:
        """Re-run a failing batch one sample at a time to name the sample that raises."""
        for i, x in enumerate(inputs):
            try:
                self.reward_fn.fn([x], **self.kwargs)
            except Exception as e:
                return f"{_describe(batch, i)}: {type(e).__name__}: {e}"
        return "the whole batch (each sample alone scored fine)"


def reward_inputs(batch: Batch) -> list[dict[str, Any]]:
    lengths = batch["response_mask"].sum(-1).tolist()
    return [
        {
            "response": batch["response_text"][i],
            "response_length": int(lengths[i]),
            "ground_truth": batch["ground_truth"][i],
            "prompt": batch["prompt"][i],
            "data_source": batch["data_source"][i],
            "extra": batch["extra"][i],
        }
        for i in range(len(batch))
    ]


def _describe(batch: Batch, i: int) -> str:
    text = batch["response_text"][i]
    snippet = text if len(text) <= 80 else text[:77] + "..."
    return f"sample {i} (row {batch['where'][i]}, response {snippet!r})"
