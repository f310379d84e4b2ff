"""The whole configuration: `Config` and its sections, the one `config_problems` over every section's rules,
and the listings read from the fields' docstrings (`describe`, for `rlstack config-keys` and the docs)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlstack.config.actor import ActorConfig, actor_rules
from rlstack.config.algorithm import AlgorithmConfig, algorithm_rules
from rlstack.config.critic import CriticConfig, RefConfig, critic_rules
from rlstack.config.data import DataConfig, data_rules
from rlstack.config.fields import choices, field, range_problems, type_name
from rlstack.config.machine import machine_rules
from rlstack.config.model import model_rules
from rlstack.config.reward import RewardConfig, reward_rules
from rlstack.config.rollout import RolloutConfig, rollout_rules
from rlstack.config.trainer import TrainerConfig, trainer_rules
from rlstack.errors import RLStackError


@dataclass
class WorkerConfig:
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The trained policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling of responses."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (built only for `algorithm.adv_estimator=gae`)."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The frozen reference policy (built only when a KL term is used)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring of responses."""


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    """Training and validation rows."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages, KL."""
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    """Actor, rollout, reference, reward."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, validation, checkpoints, tracking."""

    @property
    def run_dir(self) -> Path:
        t = self.trainer
        return Path(t.output_dir) / t.project_name / t.experiment_name


RULES = (
    data_rules,
    model_rules,
    actor_rules,
    rollout_rules,
    critic_rules,
    reward_rules,
    algorithm_rules,
    trainer_rules,
    machine_rules,
)
"""Each section's cross-field rules, in the order their problems are reported (what the machine cannot run last)."""


class ConfigError(RLStackError, ValueError):
    """Every problem found in a configuration, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s) in the configuration:\n{lines}")


def config_problems(cfg: Config, machine: bool = True) -> list[str]:
    """Every problem of a built config: values out of their fields' ranges, then each section's rules,
    then (`machine`) what this machine cannot run. Each says what, why and how to fix it."""
    p = range_problems(cfg)
    for rules in RULES:
        if machine or rules is not machine_rules:
            rules(cfg, p)
    return p


def machine_problems(cfg: Config) -> list[str]:
    """What this machine cannot run of a built config (packages, GPUs, the sandbox)."""
    p: list[str] = []
    machine_rules(cfg, p)
    return p


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            docs[stmt.target.id] = str(nxt.value.value)
    return docs


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, doc) for every leaf field."""
    rows = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            rows += describe(hints[f.name], key + ".")
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            rows.append((key, type_name(hints[f.name]), default, docs.get(f.name, "")))
    return rows


def key_rules(cls: type = Config, prefix: str = "") -> dict[str, str]:
    """For every leaf key with a rule: its choices, its range and whether it may change on resume, as
    `config-keys` prints them (`one of: grpo, rloo; may change on resume`)."""
    rules: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        if dataclasses.is_dataclass(tp):
            rules |= key_rules(tp, key + ".")
            continue
        said = []
        if options := [str(c) for c in choices(tp) if c is not None]:
            said.append("one of: " + ", ".join(options))
        if (rng := f.metadata.get("range")) is not None:
            said.append(rng.rule(type(None) in typing.get_args(tp)))
        if f.metadata.get("resume"):
            said.append("may change on resume")
        if said:
            rules[key] = "; ".join(said)
    return rules


SECRET_NAMES = ("api_key", "apikey", "token", "secret", "secret_key", "password", "access_key", "private_key")
"""A key (a field, or a name inside a mapping such as `trainer.env_vars` or a reward's kwargs) whose name
ends in one of these holds a secret, when its value is text: written files and trackers show `MASK`."""
NOT_SECRET = ("eos_token", "bos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")
NOT_SECRET += ("stop_token", "end_token", "start_token", "image_token", "video_token", "special_token")
NOT_SECRET += ("max_token", "implicit_token")
"""Names ending in `token` that name a tokenizer's tokens or a setting (HF_HUB_DISABLE_IMPLICIT_TOKEN)."""
MASK = "***"


def is_secret(name: str) -> bool:
    name = str(name).lower()
    return name.endswith(SECRET_NAMES) and not name.endswith(NOT_SECRET)


def hide_secrets(value: Any, name: str = "") -> Any:
    """`value` (plain dicts and lists, as a config is written) with each secret's text as `MASK`."""
    if isinstance(value, dict):
        return {k: hide_secrets(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [hide_secrets(v, name) for v in value]
    return MASK if isinstance(value, str) and value and is_secret(name) else value


def to_dict(cfg: Any, masked: bool = True) -> dict:
    """The config as plain values, secrets (`is_secret`) masked unless `masked=False`: what config.yaml,
    `--print-config` and the trackers get. An API key travels in the Config object the processes share,
    never in a file."""
    values = dataclasses.asdict(cfg)
    return hide_secrets(values) if masked else values


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def masked_secrets(values: Any, prefix: str = "") -> list[str]:
    """The keys of `values` (a config as loaded) whose secret is `MASK`: a config.yaml rlstack wrote, loaded
    again as a config."""
    if isinstance(values, dict):
        return [k for name, v in values.items() for k in masked_secrets(v, f"{prefix}{name}.")]
    if isinstance(values, list):
        return [k for i, v in enumerate(values) for k in masked_secrets(v, f"{prefix.rstrip('.')}[{i}].")]
    key = prefix.rstrip(".")
    return [key] if values == MASK and is_secret(key.rsplit(".", 1)[-1].split("[")[0]) else []
