"""NeMo RL's GRPO configs, read as rlstack's.

A config whose top level has NeMo RL's sections (`policy`, `grpo`, `loss_fn`, `cluster`, `env`,
`checkpointing`, `logger`) is translated before rlstack's config is built, key by key, as
`rlstack.config.compat.easyr1` does for EasyR1's: each key is moved to rlstack's name (a note says so), noted and
dropped where rlstack does the same without it (`Inert` at the values listed), or a problem saying what
rlstack does instead. A few keys need their own rule:

- `grpo.use_leave_one_out_baseline` with `grpo.normalize_rewards` picks the advantage estimator
  (`loo_std`, NeMo RL's default; `rloo`; or `grpo` with or without the division by the std);
- `policy.train_global_batch_size` counts trajectories, rlstack's `global_batch_size` prompts: it is
  divided by `grpo.num_generations_per_prompt`;
- `policy.max_total_sequence_length` bounds prompt and response together; rlstack bounds each
  (`data.max_prompt_length`, `data.max_response_length`), so the split comes from
  `policy.generation.max_new_tokens` or `data.max_input_seq_length`, whichever is below it, and with
  both at the total (NeMo RL's stock setting) the prompt gets a quarter and the response the rest;
- `env.math` / `env.code` / `env.reward_model` choose the reward (`builtin:math` / `builtin:code` /
  `builtin:reward_model`) and its workers; the environments `data.default.env_name` does not pick are noted
  (NeMo RL starts none of them); the reward model's GPUs of its own are reward actors under Ray, one GPU
  each, the policy on the rest of the cluster; `grpo.max_rollout_turns > 1` with `env.code` is rlstack's
  Python tool (`<code>` calls, its output the next turn);
- `data.train.dataset_name` (or `data.dataset_name`): a Hub dataset, or a registry name with a Hub form
  (`DATASETS`: `OpenMathInstruct-2` is `nvidia/OpenMathInstruct-2@train_1M`, answers in
  `expected_answer`, 5% held out to validate; `gsm8k` is `openai/gsm8k:main@train`), `subset` the Hub
  config; none is a problem naming the key and what to set;
- `data.prompt_file` (a text whose `{}` the problem fills) becomes `data.format_prompt`, the same text as
  Jinja (`jinja_of_format`);
- `logger.<tracker>_enabled` (tensorboard, wandb, mlflow, swanlab) lists the tracker in `trainer.logger`;
- `policy.scheduler`: NeMo RL's linear warm-up then constant rate becomes `lr_warmup_steps`.

References `${policy.model_name}` between keys are followed. Keys of these sections (and of
`data.train`, `data.validation`, `data.default`) that remain after translation are problems naming their
file and line.
"""

from __future__ import annotations

import logging
from typing import Any

import rlstack.config.tree as tree
from rlstack.config.compat.easyr1 import ANY, DTYPES, Inert, Moved
from rlstack.config.compat.nemo_rl_rules import RULES
from rlstack.config.compat.nemo_rl_translation import Translation, hashable

log = logging.getLogger(__name__)

SECTIONS = (
    "policy",
    "grpo",
    "loss_fn",
    "cluster",
    "env",
    "checkpointing",
    "logger",
    "reward_penalties",
    "data_plane",
    "on_policy_distillation",
)
"""Top-level sections of a NeMo RL config (rlstack's are data, worker, algorithm, trainer)."""
DATA_SECTIONS = ("data.train", "data.validation", "data.default")
"""NeMo RL's sections under `data` (rlstack's own `data` keys are flat): what the rules leave of them is
named key by key, as the top-level sections' keys."""

PORTS = Inert(ANY, "rlstack picks free ports")
DATA_PLANE_KEYS = (
    "impl",
    "backend",
    "storage_capacity",
    "num_storage_units",
    "claim_meta_poll_interval_s",
    "global_segment_size",
    "local_buffer_size",
    "observability",
)
DRAFT_KEYS = ("model_name", "loss_weight", "num_layers", "aux_layer_indices")
PENALTIES = (
    "penalize_duplicated_reasoning",
    "penalize_empty_final_answer",
    "penalize_unwanted_tokens",
    "penalize_malformed_think_tag",
)
GYM_PENALTIES = (
    "NeMo-Gym's reward-zeroing penalties are not built in rlstack; write them in the reward function"
)

TABLE: dict[str, Moved | Inert] = {
    "policy.precision": Moved("worker.actor.model.dtype", DTYPES),
    "policy.train_micro_batch_size": Moved("worker.actor.micro_batch_size_per_device_for_update"),
    "policy.logprob_batch_size": Moved("worker.actor.micro_batch_size_per_device_for_experience"),
    "policy.max_grad_norm": Moved("worker.actor.max_grad_norm"),
    "policy.generation_batch_size": Inert(ANY, "rlstack's HF engine samples a whole rollout batch at once"),
    "policy.logprob_chunk_size": Inert(
        (None,), "rlstack goes through large vocabularies in blocks by itself"
    ),
    "policy.make_sequence_length_divisible_by": Inert(
        ANY, "rlstack pads for its own sequence parallelism (worker.actor.ulysses_size) by itself"
    ),
    "policy.optimizer.name": Inert(("torch.optim.AdamW",), "rlstack trains with AdamW"),
    "policy.optimizer.kwargs.lr": Moved("worker.actor.optim.lr"),
    "policy.optimizer.kwargs.weight_decay": Moved("worker.actor.optim.weight_decay"),
    "policy.optimizer.kwargs.betas": Moved("worker.actor.optim.betas"),
    "policy.optimizer.kwargs.eps": Inert((1e-8, "1e-8"), "rlstack's AdamW uses eps 1e-8"),
    "policy.optimizer.kwargs.foreach": Inert(ANY, "rlstack picks AdamW's implementation"),
    "policy.optimizer.kwargs.fused": Inert(ANY, "rlstack picks AdamW's implementation"),
    "policy.dtensor_cfg.enabled": Inert((True,), "rlstack shards the policy with FSDP2 (DTensor)"),
    "policy.dtensor_cfg._v2": Inert(ANY, "rlstack shards the policy with FSDP2 (DTensor)"),
    "policy.dtensor_cfg.cpu_offload": Moved("worker.actor.fsdp.offload_params"),
    "policy.dtensor_cfg.activation_checkpointing": Moved("worker.actor.model.enable_gradient_checkpointing"),
    "policy.dtensor_cfg.sequence_parallel": Inert(
        (False,),
        "NeMo RL's sequence_parallel splits activations over its tensor-parallel ranks, which rlstack does "
        "not have; for long sequences use rlstack's Ulysses sequence parallelism (worker.actor.ulysses_size)",
    ),
    "policy.dtensor_cfg.tensor_parallel_size": Inert(
        (1,), "rlstack trains with FSDP2 alone (no tensor parallelism)"
    ),
    "policy.dtensor_cfg.context_parallel_size": Inert((1,), "rlstack has no context parallelism"),
    "policy.dtensor_cfg.custom_parallel_plan": Inert((None,), "rlstack trains with FSDP2 alone"),
    "policy.dynamic_batching.enabled": Moved("worker.actor.dynamic_batching"),
    "policy.dynamic_batching.train_mb_tokens": Inert(
        ANY, "rlstack's budget is worker.actor.max_token_len_per_device_for_update"
    ),
    "policy.dynamic_batching.logprob_mb_tokens": Inert(
        ANY, "rlstack's budget is worker.actor.max_token_len_per_device_for_experience"
    ),
    "policy.dynamic_batching.sequence_length_round": Inert(ANY, "rlstack does not round sequence lengths"),
    "policy.sequence_packing.enabled": Moved("worker.actor.padding_free"),
    "policy.sequence_packing.train_mb_tokens": Inert(ANY, "rlstack packs each micro-batch's rows"),
    "policy.sequence_packing.logprob_mb_tokens": Inert(ANY, "rlstack packs each micro-batch's rows"),
    "policy.sequence_packing.algorithm": Inert(ANY, "rlstack packs each micro-batch's rows in order"),
    "policy.sequence_packing.sequence_length_round": Inert(ANY, "rlstack does not round sequence lengths"),
    "policy.generation.backend": Moved("worker.rollout.name"),
    "policy.generation.temperature": Moved("worker.rollout.temperature"),
    "policy.generation.top_p": Moved("worker.rollout.top_p"),
    "policy.generation.stop_token_ids": Inert(
        (None,), "rlstack stops at the tokenizer's and generation config's EOS"
    ),
    "policy.generation.stop_strings": Inert(
        (None,), "rlstack stops at EOS (and at a tool call's end with tools)"
    ),
    "policy.generation.vllm_cfg.tensor_parallel_size": Moved("worker.rollout.tensor_parallel_size"),
    "policy.generation.vllm_cfg.gpu_memory_utilization": Moved("worker.rollout.gpu_memory_utilization"),
    "policy.generation.vllm_cfg.max_model_len": Moved("worker.rollout.max_model_len"),
    "policy.generation.vllm_cfg.enforce_eager": Moved("worker.rollout.enforce_eager"),
    "policy.generation.vllm_cfg.async_engine": Inert(
        (False,), "rlstack's vLLM engine runs in the rollout worker"
    ),
    "policy.generation.vllm_cfg.pipeline_parallel_size": Inert(
        (1,), "rlstack's vLLM engine has no pipeline stages"
    ),
    "policy.generation.vllm_cfg.expert_parallel_size": Inert(
        (1,), "rlstack's vLLM engine has no expert parallelism"
    ),
    "policy.generation.vllm_cfg.use_deep_gemm": Inert((False,), "not used by rlstack"),
    "policy.generation.vllm_cfg.num_last_layers_in_bf16": Inert((0,), "not used by rlstack"),
    "policy.generation.vllm_cfg.num_first_layers_in_bf16": Inert((0,), "not used by rlstack"),
    "policy.generation.vllm_cfg.precision": Inert(
        ANY, "rlstack's vLLM engine computes in worker.actor.model.dtype"
    ),
    "policy.generation.vllm_kwargs": Inert(({},), "rlstack passes vLLM only its worker.rollout settings"),
    "policy.generation.colocated.enabled": Moved("worker.rollout.colocated"),
    "policy.generation.colocated.resources.gpus_per_node": Moved("worker.rollout.num_ranks"),
    "policy.generation.colocated.resources.num_nodes": Inert((None, 1), "rollout actors are placed by Ray"),
    "grpo.num_prompts_per_step": Moved("data.rollout_batch_size"),
    "grpo.num_generations_per_prompt": Moved("worker.rollout.n"),
    "grpo.max_num_epochs": Moved("trainer.total_epochs"),
    "grpo.max_num_steps": Moved("trainer.step_cap"),  # a cap: the epochs end the run if they come first
    "grpo.overlong_filtering": Moved("algorithm.mask_truncated_responses"),
    "grpo.val_period": Moved("trainer.val_freq", {0: -1}),
    "grpo.val_at_start": Moved("trainer.val_before_train"),
    "grpo.max_val_samples": Moved("data.val_max_samples"),
    "grpo.val_batch_size": Moved("data.val_batch_size"),
    "grpo.seed": Moved("trainer.seed"),
    "grpo.async_grpo.enabled": Moved("algorithm.async_grpo.enabled"),
    "grpo.async_grpo.max_trajectory_age_steps": Moved("algorithm.async_grpo.max_trajectory_age_steps"),
    "grpo.async_grpo.in_flight_weight_updates": Moved("algorithm.async_grpo.in_flight_weight_updates"),
    "loss_fn.ratio_clip_min": Moved("worker.actor.clip_ratio_low"),
    "loss_fn.ratio_clip_max": Moved("worker.actor.clip_ratio_high"),
    "loss_fn.use_on_policy_kl_approximation": Inert(
        (False,), "rlstack's KL term uses the reference's log-probs"
    ),
    "loss_fn.sequence_level_importance_ratios": Moved(
        "worker.actor.loss_type", {True: "gspo", False: "vanilla"}
    ),
    "loss_fn.token_level_loss": Moved(
        "worker.actor.loss_agg_mode", {True: "token-mean", False: "seq-mean-token-mean"}
    ),
    "checkpointing.save_period": Moved("trainer.save_freq"),
    "checkpointing.checkpoint_dir": Moved("trainer.output_dir"),
    "checkpointing.checkpoint_must_save_by": Inert((None,), "rlstack saves every trainer.save_freq steps"),
    "checkpointing.model_save_format": Inert(("safetensors",), "rlstack saves safetensors"),
    "checkpointing.save_consolidated": Inert(ANY, "rlstack's checkpoints hold a Hugging Face model"),
    "data.train.split_validation_size": Moved("data.val_split"),
    "data.train.seed": Moved("data.seed"),
    "data.default.processor": Inert(ANY, "rlstack reads rows by data.format (auto-detected per file)"),
    "data.default.env_name": Inert(ANY, "read with env"),
    "logger.log_dir": Inert(ANY, "rlstack logs in the run directory, trainer.output_dir/project/experiment"),
    "logger.num_val_samples_to_print": Moved("trainer.val_generations_to_log"),
    "logger.monitor_gpus": Inert(ANY, "rlstack logs the GPU memory in use with each step's metrics"),
    "logger.gpu_monitoring": Inert(ANY, "rlstack logs the GPU memory in use with each step's metrics"),
    "logger.wandb": Inert(ANY, "rlstack's W&B tracker reads WANDB_ENTITY and the other WANDB_* variables"),
    "logger.mlflow": Inert(
        ANY, "rlstack's MLflow tracker logs to MLFLOW_TRACKING_URI, else to mlruns/ in the run directory"
    ),
    "logger.swanlab": Inert(ANY, "rlstack's SwanLab tracker reads SWANLAB_MODE (cloud, offline, local)"),
    "logger.tensorboard": Inert(ANY, "rlstack's TensorBoard logs go to the run directory"),
    "cluster.gpus_per_node": Moved("trainer.n_gpus_per_node"),
    "cluster.num_nodes": Moved("trainer.nnodes"),
    "cluster.master_port_range_low": PORTS,
    "cluster.master_port_range_high": PORTS,
    "policy.generation.port_range_low": PORTS,
    "policy.generation.port_range_high": PORTS,
    "policy.hf_config_overrides": Inert(({},), "rlstack loads the model's config as saved"),
    "policy.dtensor_cfg.automodel_kwargs": Inert(
        ({},), "rlstack loads the model with transformers' from_pretrained"
    ),
    "policy.tokenizer.use_fastokens": Inert(ANY, "rlstack tokenizes with the model's Hugging Face tokenizer"),
    "policy.draft.enabled": Inert((False,), "rlstack trains no draft model for speculative decoding"),
    **{f"policy.draft.{k}": Inert(ANY, "read with draft.enabled") for k in DRAFT_KEYS},
    "policy.sequence_packing.microbatch_order": Inert(ANY, "rlstack packs each micro-batch's rows in order"),
    "policy.generation.real_quant_export_cpu_offload": Inert(ANY, "rlstack exports no quantized weights"),
    "policy.generation.refit_cfg": Inert(
        ANY, "NIXL refit transport: rlstack sends weights through its own sync"
    ),
    "policy.generation.mcore_generation_config": Inert(
        ANY, "Megatron's inference engine: rlstack generates with worker.rollout.name (hf or vllm)"
    ),
    "policy.generation.vllm_cfg.use_tqdm": Inert(ANY, "rlstack shows no generation progress bars"),
    "policy.generation.vllm_cfg.enable_vllm_metrics_logger": Inert(
        ANY, "rlstack logs its own rollout metrics"
    ),
    "policy.generation.vllm_cfg.vllm_metrics_logger_interval": Inert(
        ANY, "rlstack logs its own rollout metrics"
    ),
    "data.num_workers": Inert(ANY, "rlstack reads and tokenizes the rows once, before training"),
    "data.use_multiple_dataloader": Inert(
        (False,), "rlstack reads every training file into one set (data.train_files)"
    ),
    **{f"reward_penalties.{k}": Inert((False,), GYM_PENALTIES) for k in PENALTIES},
    "reward_penalties.token_ids": Inert((None,), GYM_PENALTIES),
    "data_plane.enabled": Inert((False,), "rlstack moves batches between its own workers"),
    **{f"data_plane.{k}": Inert(ANY, "read with data_plane.enabled") for k in DATA_PLANE_KEYS},
    "on_policy_distillation": Inert((None,), "on-policy distillation from teachers is not built in rlstack"),
}


def is_nemo_rl(values: dict) -> bool:
    """Whether a merged config has NeMo RL's layout."""
    return any(section in values for section in SECTIONS)


def translate(values: dict, sources: dict[str, str], problems: list[str]) -> list[str]:
    """Read NeMo RL's keys out of `values` (in place) into rlstack's; returns the notes, appends problems."""
    t = Translation(values, sources, problems)
    for rule in RULES:
        rule(t)
    for key, rule in TABLE.items():
        if t.get(key) is tree.MISSING:
            continue
        value = t.take(key)
        if isinstance(rule, Moved):
            if value is None and None not in (rule.values or {}):
                t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, unset: {rule.to} keeps rlstack's default")
            else:
                t.move(key, rule.to, value, rule.values)
        elif rule.ok is ANY or (hashable(value) and value in rule.ok) or value == {}:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: {rule.why}")
        else:
            t.problems.append(f"{key}={value!r}{t.at(key)}: {rule.why}")
    for section in (*SECTIONS, *DATA_SECTIONS):
        _drop_empty(t.values, section)
    unset = []
    for section in (s for s in (*SECTIONS, *DATA_SECTIONS) if t.get(s) is not tree.MISSING):
        for key, value in _leaves(t.get(section), section):
            if value is None:  # NeMo RL's "off" / "not set"
                unset.append(key)
            else:
                t.problems.append(
                    f"{key}{t.at(key)}: NeMo RL's key, which rlstack has no equivalent for; remove it"
                )
        tree.pop(t.values, section)
    if unset:
        t.notes.append(f"NeMo RL's keys left null (unset or off there), nothing to read: {', '.join(unset)}")
    for note in t.notes:
        log.warning("config: %s", note)
    return t.notes


def _drop_empty(values: dict, dotted: str) -> None:
    node = tree.get(values, dotted)
    if isinstance(node, dict):
        for k in list(node):
            _drop_empty(values, f"{dotted}.{k}")
        if not tree.get(values, dotted):
            tree.pop(values, dotted)


def _leaves(node: Any, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf under `node`, None included."""
    if not isinstance(node, dict):
        return [(prefix, node)]
    return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}.{k}")]
