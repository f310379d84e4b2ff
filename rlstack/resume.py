"""Resume that says what changed. A run that finds its checkpoint compares the config it was saved with
(`checkpoints/global_step_N/config.yaml`, else the run's `config.yaml`) with the one it is started with.
Keys declared `field(..., resume=True)` (how long it runs, what it logs, validates and saves, how the work
is cut into micro-batches, where the judge is) may change and are listed; any other change stops the run
at load, before a model is loaded, unless `trainer.resume_mode=accept_changes`. Either way the new values
are the ones trained with (`config.yaml` holds them) and every resume that changed something appends a
line to `config_history.jsonl`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlstack import checkpoint
from rlstack.config import Config, ConfigError, describe, to_yaml
from rlstack.config.fields import resumable_keys
from rlstack.config.schema import MASK, hide_secrets, is_secret

HISTORY = "config_history.jsonl"
"""The run directory's record of each resume that changed a setting."""

HOW = ("trainer.resume_mode", "trainer.find_last_checkpoint", "trainer.load_checkpoint_path")
"""Keys that say how this run resumes, not what it trains: not compared."""


def _secret(key: str) -> bool:
    """Keys whose values a resume never prints: a secret (`is_secret`; config.yaml holds it masked, so its
    changes are not seen) and every `trainer.env_vars` mapping."""
    return key.startswith("trainer.env_vars") or is_secret(key.rsplit(".", 1)[-1])


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any
    free: bool
    """The key may change on resume (declared `resume=True`)."""

    def __str__(self) -> str:
        old, new = (_masked(self.old), _masked(self.new)) if _secret(self.key) else (self.old, self.new)
        return f"{self.key}: {_show(old)} -> {_show(new)}"


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    """The checkpoint directory the run resumes from."""
    changes: list[Change]
    """What differs from the config the checkpoint was saved with (empty: nothing, or no saved config)."""

    @property
    def accepted(self) -> list[Change]:
        """Changes of keys that may not change on resume, accepted with `trainer.resume_mode=accept_changes`."""
        return [c for c in self.changes if not c.free]


def _masked(value: Any) -> Any:
    """A secret as shown: *** where it is set, its emptiness where it is not (a key given, then left out)."""
    return MASK if value not in ("", None, {}, []) else value


def _show(value: Any) -> str:
    return (
        "null" if value is None else json.dumps(value) if isinstance(value, (str, list, dict)) else str(value)
    )


def _new_run(cfg: Config) -> str:
    """The first way out of a refused resume: a run of its own (without the checkpoint it was pointed at)."""
    if cfg.trainer.load_checkpoint_path:
        return "start a new run: drop trainer.load_checkpoint_path and give it a trainer.experiment_name of its own"
    return "start a new run (trainer.experiment_name=<a new name>)"


def checkpoint_to_resume(cfg: Config) -> Path | None:
    """`trainer.load_checkpoint_path`, else (`trainer.find_last_checkpoint`) the newest complete checkpoint
    of the run directory, else None."""
    t = cfg.trainer
    if t.load_checkpoint_path:
        path = Path(t.load_checkpoint_path)
        if not (path / "trainer_state.pt").is_file():
            raise ConfigError(
                [
                    f"trainer.load_checkpoint_path = {t.load_checkpoint_path}: not an rlstack checkpoint "
                    f"(no trainer_state.pt in {path.resolve()}); point it at a run's checkpoints/global_step_N"
                ]
            )
        return path
    if t.find_last_checkpoint:
        return checkpoint.latest_checkpoint(cfg.run_dir / "checkpoints")
    return None


def saved_config(path: Path) -> dict | None:
    """The config a checkpoint was saved with: its own copy, else its run directory's `config.yaml` (older
    checkpoints); None when neither is there."""
    for candidate in (path / "config.yaml", path.parent.parent / "config.yaml"):
        if candidate.is_file():
            return yaml.safe_load(candidate.read_text()) or {}
    return None


def changes(saved: dict, cfg: Config) -> list[Change]:
    """Every leaf key whose value differs between `saved` (a config as written to YAML) and `cfg`. A key the
    saved config does not have (written by an older rlstack) is not compared, nor are secrets: both sides
    are compared masked (a config.yaml written before rlstack masked them holds them in the clear)."""
    saved, now = hide_secrets(saved), yaml.safe_load(to_yaml(cfg))
    free = resumable_keys(Config)
    out = []
    missing = object()
    for key, *_ in describe():
        old, new = _get(saved, key, missing), _get(now, key, missing)
        if old is not missing and old != new and key not in HOW:
            out.append(Change(key, old, new, key in free))
    return out


def _get(tree: dict, key: str, default: Any) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return default
        tree = tree[part]
    return tree


def check_resume(cfg: Config, kind: str = "train") -> ResumePoint | None:
    """The checkpoint the run resumes from and what changed since it was saved; a `ConfigError` listing
    each change that may not happen on resume (old -> new) and the two ways on, unless
    `trainer.resume_mode=accept_changes`; one for a checkpoint another command wrote (`kind`: train, sft)
    or that this run's ranks cannot read. Runs at load: no model is read."""
    path = checkpoint_to_resume(cfg)
    if path is None:
        return None
    import torch

    written_by = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False).get(
        "kind", "train"
    )
    if written_by != kind:
        raise ConfigError(
            [
                f"the run resumes from {path}, which `rlstack {written_by}` wrote, and this is `rlstack {kind}`: "
                f"{_new_run(cfg)}, or start it from that model (worker.actor.model.model_path={path / 'model'})"
            ]
        )
    t = cfg.trainer
    ranks = t.nnodes * t.n_gpus_per_node if t.backend == "ray" else 1
    if ranks > 1 and not (path / "actor_dcp").is_dir():
        raise ConfigError(
            [
                f"the run resumes on {ranks} ranks from {path}, which a one-process run wrote (no actor_dcp/): "
                "resume it with trainer.backend=local, or start this run from its model "
                f"(worker.actor.model.model_path={path / 'model'}) under a new trainer.experiment_name"
            ]
        )
    saved = saved_config(path)
    found = changes(saved, cfg) if saved is not None else []
    fixed = [c for c in found if not c.free]
    if fixed and cfg.trainer.resume_mode != "accept_changes":
        listed = "\n      ".join(str(c) for c in fixed)
        raise ConfigError(
            [
                f"the run resumes from {path}, which was trained with other settings than this command's "
                f"({len(fixed)} that a resume may not change):\n      {listed}\n"
                f"    {_new_run(cfg)[:1].upper()}{_new_run(cfg)[1:]} instead, or go on from this "
                f"checkpoint with the new settings: trainer.resume_mode=accept_changes (recorded in "
                f"{cfg.run_dir / HISTORY})"
            ]
        )
    return ResumePoint(path, found)


def record(cfg: Config, point: ResumePoint, step: int) -> None:
    """Say what changed on resume, and append it to the run's `config_history.jsonl`."""
    if not point.changes:
        return
    for c in point.changes:
        how = "accepted: trainer.resume_mode=accept_changes" if not c.free else "may change on resume"
        print(f"[rlstack] resume at step {step}: {c}  ({how})", flush=True)
    line = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "step": step,
        "checkpoint": str(point.path),
        "resume_mode": cfg.trainer.resume_mode,
        "changes": {
            c.key: ([_masked(c.old), _masked(c.new)] if _secret(c.key) else [c.old, c.new])
            for c in point.changes
        },
    }
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    with open(cfg.run_dir / HISTORY, "a") as f:
        f.write(json.dumps(line) + "\n")
