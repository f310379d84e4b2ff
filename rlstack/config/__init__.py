"""The run configuration: nested dataclasses, loaded as defaults <- `config=file.yaml` <- `a.b=c`.

Namespaces follow EasyR1 (`data.*`, `algorithm.*`, `worker.actor.*`, `worker.rollout.*`,
`worker.ref.*`, `worker.reward.*`, `trainer.*`). Every field carries a docstring right below it;
`describe()` reads them back for `--help`-style listings and the docs.

One module per section holds its dataclasses, with each number's range beside its field
(`field(1.0e-6, ge=0)`, `fields.py`), and the section's cross-field rules. Validation runs once, in
`load_config` (`load.py`), and reports every problem together: unknown keys (with the closest valid key),
values of the wrong type or out of range, choices not offered, and cross-field rules (batch sizes that
must divide, group estimators that need `n >= 2`, files that must exist); what the machine cannot run
(no GPU, a package not installed) is asked in `machine.py` only. `compat/` reads EasyR1's and NeMo RL's
keys as rlstack's.
"""

from rlstack.config.actor import DEFINED_AGG_MODES, ActorConfig, FSDPConfig, OptimConfig
from rlstack.config.algorithm import GROUP_ESTIMATORS, AlgorithmConfig, AsyncGRPOConfig
from rlstack.config.critic import CriticConfig, CriticModelConfig, RefConfig
from rlstack.config.data import DataConfig
from rlstack.config.load import load_config
from rlstack.config.machine import cpu_supports_bfloat16, resolve_device
from rlstack.config.model import LoraConfig, ModelConfig
from rlstack.config.paths import (
    BUILTIN_DIRS,
    BUILTIN_MODEL,
    BUILTIN_MODELS,
    BUILTIN_VISION_MODEL,
    BUILTIN_WARM_MODEL,
    chat_template_text,
    is_template_text,
    local_reason,
)
from rlstack.config.reward import (
    AgentRewardConfig,
    CodeRewardConfig,
    CodevRewardConfig,
    JudgeConfig,
    MathRewardConfig,
    RewardConfig,
    RewardModelConfig,
)
from rlstack.config.rollout import AgentConfig, RolloutConfig
from rlstack.config.schema import (
    Config,
    ConfigError,
    WorkerConfig,
    config_problems,
    describe,
    field_docs,
    to_dict,
    to_yaml,
)
from rlstack.config.trainer import TrainerConfig

__all__ = [
    "BUILTIN_DIRS",
    "BUILTIN_MODEL",
    "BUILTIN_MODELS",
    "BUILTIN_VISION_MODEL",
    "BUILTIN_WARM_MODEL",
    "DEFINED_AGG_MODES",
    "GROUP_ESTIMATORS",
    "ActorConfig",
    "AgentConfig",
    "AgentRewardConfig",
    "AlgorithmConfig",
    "AsyncGRPOConfig",
    "CodeRewardConfig",
    "CodevRewardConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "CriticModelConfig",
    "DataConfig",
    "FSDPConfig",
    "JudgeConfig",
    "LoraConfig",
    "MathRewardConfig",
    "ModelConfig",
    "OptimConfig",
    "RefConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "TrainerConfig",
    "WorkerConfig",
    "chat_template_text",
    "config_problems",
    "cpu_supports_bfloat16",
    "describe",
    "field_docs",
    "is_template_text",
    "load_config",
    "local_reason",
    "resolve_device",
    "to_dict",
    "to_yaml",
]
