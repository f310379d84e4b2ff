"""What a step reports of its batch: score, advantage, length, reward-component and agent metrics (veRL's
names, each in docs/metrics.md), the rows of generations/ and the trackers' tables, and its token count."""

from __future__ import annotations

from typing import Any

from rlstack.batch import Batch


def batch_metrics(batch: Batch) -> dict[str, float]:
    """Score, advantage and length statistics of a training batch (veRL names)."""
    resp_mask = batch["response_mask"].bool()
    resp_len = resp_mask.sum(-1).float()
    prompt_len = (batch["attention_mask"].sum(-1) - resp_mask.sum(-1)).float()
    scores = batch["scores"]
    adv = batch["advantages"][resp_mask]
    m = {
        "critic/score/mean": scores.mean(),
        "critic/score/max": scores.max(),
        "critic/score/min": scores.min(),
        "critic/advantages/mean": adv.mean() if len(adv) else 0.0,
        "critic/advantages/max": adv.max() if len(adv) else 0.0,
        "critic/advantages/min": adv.min() if len(adv) else 0.0,
        "response_length/mean": resp_len.mean(),
        "response_length/max": resp_len.max(),
        "response_length/min": resp_len.min(),
        "response_length/clip_ratio": batch["truncated"].float().mean(),
        "prompt_length/mean": prompt_len.mean(),
        "prompt_length/max": prompt_len.max(),
        "prompt_length/min": prompt_len.min(),
    }
    if "values" in batch:
        m["critic/values/mean"] = batch["values"][resp_mask].mean()
        m["critic/returns/mean"] = batch["returns"][resp_mask].mean()
    m |= agent_metrics(batch)
    m |= reward_component_means(batch)
    return {k: float(v) for k, v in m.items()}


def reward_component_means(batch: Batch) -> dict[str, float]:
    """`reward/<key>`: the mean of each component the reward functions returned, over the rows that have it
    (with `worker.reward.reward_function_by_source`, each data source's function returns its own)."""
    sums: dict[str, list[float]] = {}
    for c in batch["reward_components"]:
        for key, value in c.items():
            sums.setdefault(key, []).append(value)
    return {f"reward/{key}": sum(v) / len(v) for key, v in sums.items()}


def agent_metrics(batch: Batch) -> dict[str, float]:
    """Turns, tool calls, tool success and end reasons of the agent loop's trajectories ({} otherwise)."""
    if "num_turns" not in batch:
        return {}
    calls = batch["tool_calls"].float()
    total_calls = float(calls.sum())
    m = {
        "agent/num_turns/mean": float(batch["num_turns"].float().mean()),
        **(
            {"agent/feedback_turns/mean": float(batch["feedback_turns"].float().mean())}
            if "feedback_turns" in batch
            else {}
        ),
        "agent/tool_calls/mean": float(calls.mean()),
        "agent/called_tool": float((calls > 0).float().mean()),
        "agent/tool_errors/mean": float(batch["tool_errors"].float().mean()),
        "agent/tool_success_rate": 1.0 - float(batch["tool_errors"].float().sum()) / total_calls
        if total_calls > 0
        else 0.0,
    }
    for reason in ("done", "max_turns", "over_length", "tool_error", "max_images"):  # timeouts are dropped
        m[f"agent/end_reason/{reason}"] = sum(r == reason for r in batch["end_reason"]) / len(batch)
    return m


def generation_rows(batch: Batch, limit: int, step: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(min(limit, len(batch))):
        rows.append(
            {
                "step": step,
                "uid": batch["uid"][i],
                "prompt": batch["prompt"][i],
                "response": batch["response_text"][i],
                "ground_truth": batch["ground_truth"][i],
                "score": float(batch["scores"][i]),
                "reward_components": batch["reward_components"][i],
                "reward_info": batch["reward_info"][i] if "reward_info" in batch else {},
                "end_reason": batch["end_reason"][i],
                **({"data_source": batch["data_source"][i]} if "data_source" in batch else {}),
                **({"images": list(batch["images"][i])} if "images" in batch and batch["images"][i] else {}),
                **(
                    {
                        "num_turns": int(batch["num_turns"][i]),
                        "tool_calls": int(batch["tool_calls"][i]),
                        "tool_errors": int(batch["tool_errors"][i]),
                        "num_images": int(batch["num_images"][i]),
                        "turns": batch["turns"][i],
                        "tool_images": list(batch["tool_images"][i]),
                    }
                    if "num_turns" in batch
                    else {}
                ),
            }
        )
    return rows


def total_tokens(batch: Batch) -> int:
    return int(batch["attention_mask"].sum())
