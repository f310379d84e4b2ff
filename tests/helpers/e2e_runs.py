"""Shared pieces of the end-to-end runs on the tiny model: overrides, metrics readers, reward files."""

from __future__ import annotations

import json
from pathlib import Path

from rlstack.config import load_config
from rlstack.trainer import Trainer

NON_DETERMINISTIC = ("timestamp", "timing_s/", "perf/throughput", "perf/time_per_step", "perf/max_")


def _overrides(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"worker.actor.model.model_path={model}",
        f"trainer.output_dir={out}",
        "data.rollout_batch_size=4",
        "worker.actor.global_batch_size=4",
        "worker.rollout.n=4",
        "worker.actor.micro_batch_size_per_device_for_update=8",
        "data.max_response_length=6",
        "data.val_max_samples=16",
        "worker.actor.optim.lr=1e-3",
        "trainer.logger=[file,tensorboard]",
        "trainer.num_threads=1",
        *extra,
    ]


def _metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(NON_DETERMINISTIC)}


def _two_steps(model: Path, out: Path, *extra: str) -> dict[int, dict]:
    cfg = load_config(
        _overrides(
            model,
            out,
            "trainer.max_steps=2",
            "trainer.val_before_train=false",
            "data.val_files=",
            "trainer.logger=[file]",
            "trainer.save_model_only=true",
            *extra,
        )
    )
    Trainer(cfg).fit()
    return _metrics(cfg.run_dir)


PARITY_REWARD = """
REWARD_TYPE = "batch"

def compute_score(reward_inputs):
    # deterministic, and mixed within most groups of a random model's samples
    return [{"overall": float(len(x["response"]) % 2), "parity": float(len(x["response"]) % 2)} for x in reward_inputs]
"""


def _digits_reward(folder: Path) -> str:
    """An override scoring the share of digits in a response: a reward with signal for the random
    tiny model (exact match is always 0), so that the policy moves."""
    reward = folder / "digits.py"
    reward.write_text(
        "REWARD_TYPE = 'sequential'\n\n"
        "def compute_score(x):\n"
        "    return {'overall': sum(c.isdigit() for c in x['response']) / max(1, len(x['response']))}\n"
    )
    return f"worker.reward.reward_function={reward}:compute_score"
