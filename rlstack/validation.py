"""Validation: every held-out prompt generated with the `val_*` sampling settings and scored; accuracy
per data source (pass@k with several samples), test statuses, reward components, agent metrics."""

from __future__ import annotations

from collections import Counter, defaultdict

from rlstack.algos.groups import pass_at_k_means
from rlstack.batch import Batch
from rlstack.batch_metrics import agent_metrics, reward_component_means
from rlstack.collection import seed_prompts
from rlstack.data.dataset import PromptDataset
from rlstack.rewards.manager import Rewards
from rlstack.workers.rollout import GroupSampling, RolloutWorker


def validate(
    val_set: PromptDataset,
    rollout: RolloutWorker,
    rewards: Rewards,
    batch_size: int,
    seed: int,
    val_n: int,
    sampling: GroupSampling | None = None,
) -> tuple[dict[str, float], Batch]:
    """The validation metrics (`val/...`) and the scored trajectories. `batch_size`: prompts per
    generation call (<= 0: all at once); `seed`: the rollout seed; `sampling`: other settings than the
    `val_*` ones (`rlstack eval`)."""
    scored = []
    size = batch_size if batch_size > 0 else max(1, len(val_set))
    for start in range(0, len(val_set), size):
        idx = list(range(start, min(start + size, len(val_set))))
        prompts = seed_prompts(val_set.batch(idx), seed, -1, idx)
        scored.append(rewards.score(rollout.generate(prompts, for_validation=True, sampling=sampling)))
    val = Batch.concat(scored)
    per_source: dict[str, list[float]] = defaultdict(list)
    uids: dict[str, list[str]] = defaultdict(list)
    for comp, source, uid in zip(val["reward_components"], val["data_source"], val["uid"]):
        per_source[source].append(comp.get("accuracy", comp["overall"]))
        uids[source].append(uid)
    metrics = {f"val/{s}/accuracy": sum(v) / len(v) for s, v in per_source.items()}
    if val_n > 1:  # several samples per prompt: pass@k (accuracy 1 = solved)
        for source, accuracy in per_source.items():
            solved = [a >= 1 for a in accuracy]
            metrics |= {f"val/{source}/pass@{k}": v for k, v in pass_at_k_means(solved, uids[source]).items()}
    statuses = Counter(
        (source, info["status"])
        for info, source in zip(val["reward_info"], val["data_source"])
        if isinstance(info.get("status"), str)
    )
    metrics |= {f"val/{s}/status/{st}": n / len(per_source[s]) for (s, st), n in statuses.items()}
    metrics |= {f"val/{k}": v for k, v in reward_component_means(val).items()}
    metrics["val/reward_score"] = float(val["scores"].mean())
    metrics["val/response_length/mean"] = float(val["response_mask"].sum(-1).float().mean())
    metrics |= {f"val/{k}": v for k, v in rewards.pop_metrics().items()}
    metrics |= {f"val/{k}": v for k, v in agent_metrics(val).items()}
    return metrics, val
