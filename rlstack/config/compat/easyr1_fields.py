"""EasyR1's config fields that rlstack has no key of its own for, at EasyR1's defaults, as a reference to one
reads them there.

EasyR1 builds its config as OmegaConf's structured form of its dataclasses (`PPOConfig` in
verl/trainer/config.py and the worker configs in verl/workers/{actor,critic,reward,rollout}/config.py, at
EasyR1 b44b311), merges the file and the command line over it, and only then resolves `${...}`. So in an
EasyR1 file `${algorithm.disable_kl}` is false where the file leaves `disable_kl` out, and an auto field
(one EasyR1 fills in after resolving, e.g. `worker.rollout.prompt_length`) reads its declared default.
`easyr1.dialect_defaults` lays these under an EasyR1 file's interpolations, with `EASYR1_DEFAULTS` for the
keys rlstack has. The values are EasyR1's own spellings (`bf16`, LoRA's modules as one string): what the
reference gives there. The keys rlstack translates or accepts (`easyr1.FOREIGN`, `easyr1.OWN_RULES`) are
all here, with those of older EasyR1 versions that its forks still ship (VPPO's `reward_type`, ...).
"""

from __future__ import annotations

from typing import Any

_FSDP = {
    "enable_full_shard": True,
    "enable_cpu_offload": False,
    "enable_rank0_init": True,
    "use_orig_params": False,
    "torch_dtype": None,
    "fsdp_size": -1,
    "mp_param_dtype": "bf16",
    "mp_reduce_dtype": "fp32",
    "mp_buffer_dtype": "fp32",
}
"""EasyR1's FSDPConfig (the actor's, the reference's and the critic's)."""
_OFFLOAD = {"offload_params": False, "offload_optimizer": False}
"""EasyR1's OffloadConfig."""
_MODEL = {
    "tokenizer_path": None,
    "override_config": {},
    "enable_gradient_checkpointing": True,
    "freeze_vision_tower": False,
    "lora.rank": 0,
    "lora.alpha": 64,
    "lora.target_modules": "all-linear",
    "lora.exclude_modules": None,
}
"""EasyR1's ModelConfig and LoraConfig, less model_path and trust_remote_code (the critic's; rlstack's actor
has the others)."""


def _under(section: str, fields: dict[str, Any], *leave_out: str) -> dict[str, Any]:
    return {f"{section}.{k}": v for k, v in fields.items() if k not in leave_out}


EASYR1_FIELDS: dict[str, Any] = {
    # DataConfig
    "data.video_key": "videos",
    "data.video_fps": 2.0,
    "data.mini_rollout_batch_size": None,
    "data.override_chat_template": None,
    "data.filter_overlong_prompts_workers": 16,
    # WorkerConfig
    "worker.hybrid_engine": True,
    # ActorConfig (the last five: auto fields, filled from the algorithm's after resolving)
    "worker.actor.strategy": "fsdp",
    "worker.actor.loss_avg_mode": "token",
    "worker.actor.use_torch_compile": True,
    "worker.actor.tau_positive": 1.0,
    "worker.actor.tau_negative": 1.05,
    "worker.actor.model.override_config": {},
    "worker.actor.model.freeze_vision_tower": False,
    "worker.actor.optim.training_steps": -1,
    **_under("worker.actor.fsdp", _FSDP, "mp_param_dtype"),  # rlstack's key (EASYR1_DEFAULTS)
    **_under("worker.actor.offload", _OFFLOAD),
    "worker.actor.global_batch_size_per_device": -1,
    "worker.actor.disable_kl": False,
    "worker.actor.use_kl_loss": False,
    "worker.actor.kl_penalty": "kl",
    "worker.actor.kl_coef": 0.0,
    # RefConfig (padding_free and the three after it: auto fields, copied from the actor's after resolving)
    "worker.ref.strategy": "fsdp",
    **_under("worker.ref.fsdp", _FSDP),
    **_under("worker.ref.offload", _OFFLOAD),
    "worker.ref.padding_free": False,
    "worker.ref.dynamic_batching": False,
    "worker.ref.ulysses_size": 1,
    "worker.ref.use_torch_compile": True,
    # CriticConfig
    "worker.critic.strategy": "fsdp",
    "worker.critic.loss_avg_mode": "token",
    "worker.critic.ulysses_size": 1,
    **_under("worker.critic.model", _MODEL),
    "worker.critic.optim.training_steps": -1,
    **_under("worker.critic.fsdp", _FSDP),
    **_under("worker.critic.offload", _OFFLOAD),
    "worker.critic.global_batch_size_per_device": -1,
    # RewardConfig
    "worker.reward.skip_special_tokens": True,
    "worker.reward.num_cpus": 1,
    "worker.reward.reward_function_name": None,
    # RolloutConfig (the last three: auto fields)
    "worker.rollout.limit_images": 0,
    "worker.rollout.dtype": "bf16",
    "worker.rollout.enable_chunked_prefill": False,
    "worker.rollout.disable_log_stats": True,
    "worker.rollout.disable_tqdm": False,
    "worker.rollout.val_override_config": {},
    "worker.rollout.prompt_length": -1,
    "worker.rollout.response_length": -1,
    "worker.rollout.trust_remote_code": False,
    # AlgorithmConfig, TrainerConfig
    "algorithm.disable_kl": False,
    "trainer.max_try_make_batch": 20,
    "trainer.save_checkpoint_path": None,
    "trainer.ray_timeline": None,
    # older EasyR1's, which forks (VPPO) still ship: each at the default of the last version that had it
    "worker.actor.ulysses_sequence_parallel_size": 1,
    "worker.reward.reward_type": "batch",
    "worker.reward.score_function": None,
    "trainer.total_episodes": 10,
}
"""Every field of EasyR1's config dataclasses that rlstack has no key of its own for (dotted key -> EasyR1's
default)."""
