"""Metrics and generations: console progress bar, metrics.jsonl, generations/, TensorBoard, W&B.

Metric names follow veRL/EasyR1; every one is described in docs/metrics.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rlstack.batch import Batch
from rlstack.errors import RLStackError

CONSOLE_KEYS = {
    "critic/score/mean": "score",
    "val/reward_score": "val",
    "actor/pg_loss": "pg_loss",
    "response_length/mean": "resp_len",
}


class Tracker:
    def __init__(
        self,
        run_dir: Path,
        loggers: list[str],
        config: dict,
        project: str,
        experiment: str,
        total_steps: int,
        start_step: int = 0,
    ):
        self.run_dir = run_dir
        self.loggers = set(loggers)
        self.metrics_file = run_dir / "metrics.jsonl"
        self.gen_dir = run_dir / "generations"
        self.gen_dir.mkdir(parents=True, exist_ok=True)
        if "file" in self.loggers:
            _truncate_after(self.metrics_file, start_step)
        self.tb = None
        if "tensorboard" in self.loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(
                str(run_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None
            )
        self.wandb = None
        if "wandb" in self.loggers:
            try:
                import wandb
            except ImportError as e:
                raise RLStackError(
                    "trainer.logger includes wandb, but the wandb package is not installed: "
                    "pip install 'rlstack[wandb]' (or drop wandb from trainer.logger)"
                ) from e

            self.wandb = wandb.init(
                project=project, name=experiment, config=config, dir=str(run_dir), resume="allow"
            )
        self.bar = None
        if "console" in self.loggers:
            self.bar = tqdm(
                total=total_steps, initial=start_step, desc=experiment, unit="step", dynamic_ncols=True
            )

    def log(self, metrics: dict[str, float], step: int, advance: bool = True) -> None:
        metrics = {k: float(v) for k, v in sorted(metrics.items())}
        if "file" in self.loggers:
            with self.metrics_file.open("a") as f:
                f.write(json.dumps({"step": step, **{k: _json_safe(v) for k, v in metrics.items()}}) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.bar is not None:
            shown = {name: f"{metrics[k]:.3g}" for k, name in CONSOLE_KEYS.items() if k in metrics}
            shown.update(
                {
                    k: f"{v:.3f}"
                    for k, v in metrics.items()
                    if k.startswith("val/") and k.endswith("/accuracy")
                }
            )
            if shown:
                self.bar.set_postfix(shown, refresh=False)
            if advance:
                self.bar.update(1)
            else:
                self.bar.refresh()

    def log_generations(self, rows: list[dict[str, Any]], step: int, kind: str) -> None:
        """`generations/<kind>_step_<step>.jsonl`, one row per trajectory; its images (`images`: the
        prompt's, `tool_images`: the tools') are saved once each under `images/` and referenced there by
        their path in the run directory."""
        rows = [self._with_image_files(r) for r in rows]
        with (self.gen_dir / f"{kind}_step_{step}.jsonl").open("w") as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")

    def _with_image_files(self, row: dict[str, Any]) -> dict[str, Any]:
        out = dict(row)
        for key in ("images", "tool_images"):
            if row.get(key):
                out[key] = [save_image_once(image, self.run_dir) for image in row[key]]
        return out

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def save_image_once(image, run_dir: Path) -> str:
    """`image` as `images/<hash of its pixels>.png` under `run_dir` (written only if not there yet); its path
    relative to `run_dir`."""
    import hashlib

    digest = hashlib.sha1(f"{image.mode}{image.size}".encode() + image.tobytes()).hexdigest()[:20]
    path = Path("images") / f"{digest}.png"
    if not (run_dir / path).is_file():
        (run_dir / "images").mkdir(exist_ok=True)
        tmp = run_dir / "images" / f".{digest}.tmp.png"
        image.save(tmp)
        tmp.replace(run_dir / path)
    return str(path)


def _json_safe(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def _truncate_after(path: Path, step: int) -> None:
    """Drop metric lines past `step` (written by a run that was killed before its next checkpoint)."""
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    kept = [ln for ln in lines if ln.strip() and json.loads(ln).get("step", 0) <= step]
    path.write_text("".join(ln + "\n" for ln in kept))


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
    components = batch["reward_components"]
    for key in components[0]:
        m[f"reward/{key}"] = sum(c[key] for c in components) / len(components)
    return {k: float(v) for k, v in m.items()}


def agent_metrics(batch: Batch) -> dict[str, float]:
    """Turns, tool calls, tool success and end reasons of the agent loop's trajectories ({} otherwise)."""
    if "num_turns" not in batch:
        return {}
    calls = batch["tool_calls"].float()
    total_calls = float(calls.sum())
    m = {
        "agent/num_turns/mean": float(batch["num_turns"].float().mean()),
        "agent/tool_calls/mean": float(calls.mean()),
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
