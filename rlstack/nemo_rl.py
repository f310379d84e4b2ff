"""NeMo RL's GRPO configs, read as rlstack's.

A config whose top level has NeMo RL's sections (`policy`, `grpo`, `loss_fn`, `cluster`, `env`,
`checkpointing`, `logger`) is translated before rlstack's config is built, key by key, as
`rlstack.foreign_keys` does for EasyR1's: each key is moved to rlstack's name (a note says so), noted and
dropped where rlstack does the same without it (`Inert` at the values listed), or a problem saying what
rlstack does instead. A few keys need their own rule:

- `grpo.use_leave_one_out_baseline` with `grpo.normalize_rewards` picks the advantage estimator
  (`loo_std`, NeMo RL's default; `rloo`; or `grpo` with or without the division by the std);
- `policy.train_global_batch_size` counts trajectories, rlstack's `global_batch_size` prompts: it is
  divided by `grpo.num_generations_per_prompt`;
- `policy.max_total_sequence_length` bounds prompt and response together; rlstack bounds each
  (`data.max_prompt_length`, `data.max_response_length`), so the split comes from
  `policy.generation.max_new_tokens` or `data.max_input_seq_length`, whichever is below it;
- `env.math` / `env.code` choose the reward (`builtin:math` / `builtin:code`) and its workers;
- `policy.scheduler`: NeMo RL's linear warm-up then constant rate becomes `lr_warmup_steps`.

References `${policy.model_name}` between keys are followed. Keys of these sections that remain after
translation are problems naming their file and line.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

from rlstack.foreign_keys import _MISSING, ANY, DTYPES, Inert, Moved, _get, _pop, _set, where_set

log = logging.getLogger(__name__)

SECTIONS = ("policy", "grpo", "loss_fn", "cluster", "env", "checkpointing", "logger")
"""Top-level sections of a NeMo RL config (rlstack's are data, worker, algorithm, trainer)."""

TABLE: dict[str, Moved | Inert] = {
    "policy.precision": Moved("worker.actor.model.dtype", DTYPES),
    "policy.train_micro_batch_size": Moved("worker.actor.micro_batch_size_per_device_for_update"),
    "policy.logprob_batch_size": Moved("worker.actor.micro_batch_size_per_device_for_experience"),
    "policy.max_grad_norm": Moved("worker.actor.max_grad_norm"),
    "policy.generation_batch_size": Inert(ANY, "rlstack's HF engine samples a whole rollout batch at once"),
    "policy.logprob_chunk_size": Inert(
        (None,), "rlstack goes through large vocabularies in blocks by itself"
    ),
    "policy.make_sequence_length_divisible_by": Inert(ANY, "rlstack has no sequence parallelism to pad for"),
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
    "policy.dtensor_cfg.sequence_parallel": Inert((False,), "rlstack has no sequence parallelism"),
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
    "grpo.max_num_steps": Moved("trainer.max_steps"),
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
    "loss_fn.use_importance_sampling_correction": Moved(
        "worker.actor.rollout_correction", {True: "tis", False: None}
    ),
    "loss_fn.sequence_level_importance_ratios": Moved(
        "worker.actor.loss_type", {True: "gspo", False: "vanilla"}
    ),
    "loss_fn.token_level_loss": Moved(
        "worker.actor.loss_agg_mode", {True: "token-mean", False: "seq-mean-token-mean"}
    ),
    "checkpointing.save_period": Moved("trainer.save_freq"),
    "checkpointing.checkpoint_dir": Moved("trainer.output_dir"),
    "checkpointing.keep_top_k": Moved("trainer.save_limit"),
    "checkpointing.metric_name": Inert(
        ANY, "rlstack keeps the latest trainer.save_limit checkpoints, not the best"
    ),
    "checkpointing.higher_is_better": Inert(ANY, "rlstack keeps the latest checkpoints, not the best"),
    "checkpointing.checkpoint_must_save_by": Inert((None,), "rlstack saves every trainer.save_freq steps"),
    "checkpointing.model_save_format": Inert(("safetensors",), "rlstack saves safetensors"),
    "checkpointing.save_consolidated": Inert(ANY, "rlstack's checkpoints hold a Hugging Face model"),
    "data.prompt_file": Inert(
        (None,),
        "NeMo RL formats the problem into a text file's {}; rlstack's data.format_prompt is a Jinja file "
        "rendered with the problem as {{ content }}: write one and set data.format_prompt",
    ),
    "data.system_prompt_file": Moved("worker.rollout.agent.system_prompt"),
    "data.dataset_name": Inert(
        (None,),
        "NeMo RL's dataset registry is not rlstack's: set data.train_files (a file, builtin:<task>, or a "
        "Hub dataset as name@split) and data.val_files",
    ),
    "data.train_data_path": Moved("data.train_files"),
    "data.val_data_path": Moved("data.val_files"),
    "data.input_key": Moved("data.prompt_key"),
    "data.output_key": Moved("data.answer_key"),
    "data.train.data_path": Moved("data.train_files"),
    "data.validation.data_path": Moved("data.val_files"),
    "data.train.split_validation_size": Moved("data.val_split"),
    "data.default.processor": Inert(ANY, "rlstack reads rows by data.format (auto-detected per file)"),
    "data.default.env_name": Inert(ANY, "read with env"),
    "logger.log_dir": Inert(ANY, "rlstack logs in the run directory, trainer.output_dir/project/experiment"),
    "logger.num_val_samples_to_print": Moved("trainer.val_generations_to_log"),
    "logger.monitor_gpus": Inert(ANY, "rlstack logs the GPU memory in use with each step's metrics"),
    "logger.gpu_monitoring": Inert(ANY, "rlstack logs the GPU memory in use with each step's metrics"),
    "logger.mlflow_enabled": Inert((False,), "rlstack's trackers are console, file, tensorboard and wandb"),
    "logger.swanlab_enabled": Inert((False,), "rlstack's trackers are console, file, tensorboard and wandb"),
    "logger.mlflow": Inert(ANY, "rlstack's trackers are console, file, tensorboard and wandb"),
    "logger.swanlab": Inert(ANY, "rlstack's trackers are console, file, tensorboard and wandb"),
    "logger.tensorboard": Inert(ANY, "rlstack's TensorBoard logs go to the run directory"),
    "logger.wandb.project": Moved("trainer.project_name"),
    "logger.wandb.name": Moved("trainer.experiment_name"),
    "cluster.gpus_per_node": Moved("trainer.n_gpus_per_node"),
    "cluster.num_nodes": Moved("trainer.nnodes"),
}

REWARDS = {"math": "builtin:math", "code": "builtin:code"}
"""NeMo RL's environments -> rlstack's built-in rewards."""

_REFERENCE = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


def is_nemo_rl(values: dict) -> bool:
    """Whether a merged config has NeMo RL's layout."""
    return any(section in values for section in SECTIONS)


class _Translation:
    """One config's translation: the values being rewritten, where each key was set, and what it finds."""

    def __init__(self, values: dict, sources: dict[str, str], problems: list[str]):
        self.values, self.sources, self.problems = values, sources, problems
        self.notes: list[str] = []
        self.original = copy.deepcopy(values)

    def at(self, key: str) -> str:
        return where_set(self.sources, key)

    def get(self, key: str) -> Any:
        """rlstack's (or a not yet translated NeMo RL) key's value as it stands, or `_MISSING`."""
        return _get(self.values, key)

    def take(self, key: str) -> Any:
        """Remove a NeMo RL key; its value, following `${other.key}` references."""
        _pop(self.values, key)
        value, seen = _get(self.original, key), set()
        while isinstance(value, str) and (m := _REFERENCE.match(value)) and m.group(1) not in seen:
            seen.add(m.group(1))
            value = _get(self.original, m.group(1))
        return value

    def move(self, key: str, to: str, value: Any, spellings: dict | None = None) -> None:
        """Set rlstack's `to` from NeMo RL's `key` (the command line's own `to` wins)."""
        if self.get(to) is not _MISSING:
            if self.sources.get(to, "").startswith("command-line"):
                self.notes.append(f"{key}{self.at(key)}: NeMo RL's key for {to}, which the command line sets")
            else:
                self.problems.append(
                    f"{key}{self.at(key)} is NeMo RL's name for {to}, which is set too: keep {to} only"
                )
            return
        if spellings is not None and _hashable(value) and value in spellings:
            value = spellings[value]
        _set(self.values, to, value)
        self.notes.append(f"{key}{self.at(key)}: NeMo RL's key, read as {to}={value}")


def translate(values: dict, sources: dict[str, str], problems: list[str]) -> list[str]:
    """Read NeMo RL's keys out of `values` (in place) into rlstack's; returns the notes, appends problems."""
    t = _Translation(values, sources, problems)
    for rule in (
        _advantages,
        _global_batch,
        _lengths,
        _kl,
        _env,
        _datasets,
        _scheduler,
        _loggers,
        _checkpoints,
        _megatron,
        _tokenizer,
        _top_k,
        _ratio_clip_c,
        _turns,
    ):
        rule(t)
    for key, rule in TABLE.items():
        if t.get(key) is _MISSING:
            continue
        value = t.take(key)
        if isinstance(rule, Moved):
            if value is None and None not in (rule.values or {}):
                t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, unset: {rule.to} keeps rlstack's default")
            else:
                t.move(key, rule.to, value, rule.values)
        elif rule.ok is ANY or (_hashable(value) and value in rule.ok) or value == {}:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: {rule.why}")
        else:
            t.problems.append(f"{key}={value!r}{t.at(key)}: {rule.why}")
    for section in (*SECTIONS, "data.train", "data.default"):
        _drop_empty(t.values, section)
    for section in SECTIONS:
        for key in _leaves(t.values.get(section), section):
            t.problems.append(
                f"{key}{t.at(key)}: NeMo RL's key, which rlstack has no equivalent for; remove it"
            )
        t.values.pop(section, None)
    for note in t.notes:
        log.warning("config: %s", note)
    return t.notes


def _advantages(t: _Translation) -> None:
    loo, norm = t.take("grpo.use_leave_one_out_baseline"), t.take("grpo.normalize_rewards")
    if loo is _MISSING and norm is _MISSING:
        return
    loo, norm = loo is not _MISSING and bool(loo), norm is _MISSING or bool(norm)
    key = "grpo.use_leave_one_out_baseline" if loo else "grpo.normalize_rewards"
    estimator = ("loo_std" if norm else "rloo") if loo else "grpo"
    t.move(key, "algorithm.adv_estimator", estimator)
    if not loo:
        t.move("grpo.normalize_rewards", "algorithm.norm_adv_by_std_in_grpo", norm)


def _global_batch(t: _Translation) -> None:
    key = "policy.train_global_batch_size"
    total = t.take(key)
    if total is _MISSING:
        return
    n = t.take("grpo.num_generations_per_prompt")
    if n is not _MISSING:
        t.move("grpo.num_generations_per_prompt", "worker.rollout.n", n)
    n = t.get("worker.rollout.n")  # the command line's, if it set it
    n = n if isinstance(n, int) and n > 0 else 1
    if not isinstance(total, int) or total % n:
        t.problems.append(
            f"{key}={total!r}{t.at(key)}: NeMo RL counts trajectories, rlstack's worker.actor.global_batch_size "
            f"prompts; it must be a multiple of grpo.num_generations_per_prompt ({n})"
        )
        return
    prompts = t.get("data.rollout_batch_size")
    step = prompts if prompts is not _MISSING else t.get("grpo.num_prompts_per_step")
    if isinstance(step, int) and total // n > step:
        t.problems.append(
            f"{key}={total}{t.at(key)} is {total // n} prompts of {n} trajectories, more than the {step} prompts "
            f"a step generates (grpo.num_prompts_per_step): set it to at most {step * n}, one optimizer step per "
            "rollout (or a divisor of it for several)"
        )
        _set(t.values, "worker.actor.global_batch_size", step)  # no second problem about the same setting
        return
    t.move(key, "worker.actor.global_batch_size", total // n)


def _lengths(t: _Translation) -> None:
    """Prompt and response bounds from NeMo RL's total (prompt + response) bound."""
    key = "policy.max_total_sequence_length"
    total = t.take(key)
    new_tokens = t.take("policy.generation.max_new_tokens")
    prompt = t.take("data.max_input_seq_length")
    if total is _MISSING:
        if new_tokens is not _MISSING:
            t.move("policy.generation.max_new_tokens", "data.max_response_length", new_tokens)
        if prompt is not _MISSING:
            t.move("data.max_input_seq_length", "data.max_prompt_length", prompt)
        return
    own = [t.get(k) is not _MISSING for k in ("data.max_prompt_length", "data.max_response_length")]
    if all(own):
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's key, not used: data.max_prompt_length and max_response_length are set"
        )
        return
    response = new_tokens if isinstance(new_tokens, int) and new_tokens < total else None
    prompt = prompt if isinstance(prompt, int) and prompt < total else None
    if own[0]:  # a bound set in rlstack's name stays; the other is what is left of the total
        prompt, response = t.get("data.max_prompt_length"), None
    elif own[1]:
        prompt, response = None, t.get("data.max_response_length")
    if response is None and prompt is None:
        t.problems.append(
            f"{key}={total}{t.at(key)}: NeMo RL bounds prompt and response together, rlstack each on its own; with "
            "policy.generation.max_new_tokens and data.max_input_seq_length both at the total there is no split to "
            f"read: set data.max_prompt_length and data.max_response_length (their sum at most {total})"
        )
        return
    if response is None:
        response = total - prompt
    if prompt is None:
        prompt = total - response
    prompt = min(prompt, total - response) if not own[0] else prompt
    _set(t.values, "data.max_prompt_length", prompt)
    _set(t.values, "data.max_response_length", response)
    t.notes.append(
        f"{key}={total}{t.at(key)}: NeMo RL's bound on prompt + response, read as data.max_prompt_length={prompt}, "
        f"data.max_response_length={response}"
    )


def _kl(t: _Translation) -> None:
    key = "loss_fn.reference_policy_kl_penalty"
    coef = t.take(key)
    if coef is _MISSING:
        return
    t.move(key, "algorithm.use_kl_loss", bool(coef))
    if coef:
        t.move(key, "algorithm.kl_coef", coef)
        t.move(key, "algorithm.kl_penalty", "low_var_kl")  # NeMo RL's k3 estimator


def _env(t: _Translation) -> None:
    """The reward from NeMo RL's environment (`env.<name>`, or the one `data.default.env_name` picks)."""
    env = t.get("env")
    name = t.get("data.default.env_name")
    if not isinstance(env, dict) or not env:
        return
    names = [name] if isinstance(name, str) else list(env)
    settings = {n: t.take(f"env.{n}") or {} for n in list(env)}
    if len(names) > 1:
        t.problems.append(
            f"env{t.at('env')}: NeMo RL's environments {names}, and no data.default.env_name picks one; for one "
            "reward per data source use worker.reward.reward_function_by_source"
        )
        return
    (n,) = names
    if n not in REWARDS:
        t.problems.append(
            f"env.{n}{t.at(f'env.{n}')}: NeMo RL's environment, which rlstack has no built-in for; write a reward "
            "function (worker.reward.reward_function) or use env math / code"
        )
        return
    if t.get("worker.reward.reward_function") is _MISSING:
        t.move(f"env.{n}", "worker.reward.reward_function", REWARDS[n])
    own = settings.get(n, {}) if isinstance(settings.get(n), dict) else {}
    for k, v in own.items():
        if k == "num_workers":
            t.move(f"env.{n}.num_workers", "worker.reward.num_workers", v)
        else:
            t.notes.append(
                f"env.{n}.{k}={v!r}{t.at(f'env.{n}.{k}')}: NeMo RL's environment setting, not used"
            )


def _datasets(t: _Translation) -> None:
    """NeMo RL's per-split data section (`data.train`) over its older single `data.dataset_name`; a Hub
    dataset (`org/name`) is read from the Hub, a name of NeMo RL's registry is a problem."""
    name, held_out = t.get("data.train.dataset_name"), t.get("data.train.split_validation_size")
    if name is not _MISSING:
        key = "data.train.dataset_name"
        t.take(key)
        if isinstance(name, str) and "/" in name:
            t.move(key, "data.train_files", name)
        elif t.get("data.train.data_path") is _MISSING:
            t.problems.append(
                f"{key}={name!r}{t.at(key)}: a NeMo RL registry name, not rlstack's: set data.train_files (a file, "
                "builtin:<task>, or a Hub dataset as org/name@split), or data.train.data_path"
            )
    if name is not _MISSING and t.get("data.dataset_name") is not _MISSING:
        old = t.take("data.dataset_name")
        t.notes.append(
            f"data.dataset_name={old!r}{t.at('data.dataset_name')}: NeMo RL's key, not used: data.train is set"
        )
    if held_out is not _MISSING and held_out and t.get("data.val_files") is _MISSING:
        t.move(
            "data.train.split_validation_size", "data.val_files", ""
        )  # the held-out rows are the validation set


def _scheduler(t: _Translation) -> None:
    key = "policy.scheduler"
    steps = t.take(key)
    if steps is _MISSING or steps is None:
        return
    kinds = (
        [s.get("name") for s in steps if isinstance(s, dict) and "name" in s]
        if isinstance(steps, list)
        else []
    )
    linear = "torch.optim.lr_scheduler.LinearLR"
    constant = "torch.optim.lr_scheduler.ConstantLR"
    factors = [
        s.get("kwargs", {}).get("factor", 1.0)
        for s in steps
        if isinstance(s, dict) and s.get("name") == constant
    ]
    if all(f == 1.0 for f in factors):
        if kinds and kinds[0] == linear and all(k == constant for k in kinds[1:]):
            kwargs = steps[0].get("kwargs", {})
            warmup, start = kwargs.get("total_iters"), kwargs.get("start_factor", 1 / 3)
            if isinstance(warmup, int):
                t.move(key, "worker.actor.optim.lr_warmup_steps", warmup)
                t.notes.append(
                    f"{key}{t.at(key)}: NeMo RL warms up from {start} x lr, rlstack from 0 (its first step is at "
                    "lr / warm-up steps)"
                )
                return
        if kinds and all(k == constant for k in kinds):
            return
    t.problems.append(
        f"{key}{t.at(key)}: rlstack's schedules are a linear warm-up then constant or cosine "
        "(worker.actor.optim.lr_warmup_steps, lr_scheduler_type); set those instead"
    )


def _loggers(t: _Translation) -> None:
    wandb, tensorboard = t.take("logger.wandb_enabled"), t.take("logger.tensorboard_enabled")
    if wandb is _MISSING and tensorboard is _MISSING:
        return
    if t.get("trainer.logger") is not _MISSING:
        t.notes.append(f"logger.*_enabled{t.at('logger')}: NeMo RL's keys, not used: trainer.logger is set")
        return
    loggers = (
        ["console", "file"] + ["tensorboard"] * bool(tensorboard is True) + ["wandb"] * bool(wandb is True)
    )
    _set(t.values, "trainer.logger", loggers)
    t.notes.append(f"logger.*_enabled{t.at('logger')}: NeMo RL's keys, read as trainer.logger={loggers}")


def _checkpoints(t: _Translation) -> None:
    enabled = t.take("checkpointing.enabled")
    if enabled is False and t.get("trainer.save_model_only") is not _MISSING:
        t.notes.append(
            f"checkpointing.enabled=false{t.at('checkpointing')}: NeMo RL's key, trainer.save_model_only is set"
        )
    elif enabled is False:
        _pop(t.values, "checkpointing.save_period")
        _set(t.values, "trainer.save_model_only", True)
        t.notes.append(
            f"checkpointing.enabled=false{t.at('checkpointing')}: NeMo RL's key, read as trainer.save_model_only=true "
            "(no checkpoints to resume from; the trained model is still written to huggingface/)"
        )


def _megatron(t: _Translation) -> None:
    key = "policy.megatron_cfg"
    cfg = t.take(key)
    if cfg is _MISSING:
        return
    if isinstance(cfg, dict) and cfg.get("enabled"):
        t.problems.append(
            f"{key}.enabled=true{t.at(key)}: rlstack trains with FSDP2, not Megatron; use dtensor_cfg"
        )
    else:
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's Megatron settings, not used (megatron_cfg.enabled is false)"
        )


PASSTHROUGH_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
"""NeMo RL's `chat_template: null`: the messages' contents joined, no role markers or special tokens."""


def _tokenizer(t: _Translation) -> None:
    key = "policy.tokenizer"
    name, model = t.take(f"{key}.name"), t.take("policy.model_name")
    template, kwargs = t.take(f"{key}.chat_template"), t.take(f"{key}.chat_template_kwargs")
    _ = t.take(key)
    if model is not _MISSING:
        t.move("policy.model_name", "worker.actor.model.model_path", model)
    if name in (None, model):
        t.notes.append(f"{key}.name{t.at(key + '.name')}: NeMo RL's key, the model's own tokenizer")
    elif name is not _MISSING:
        t.move(f"{key}.name", "worker.actor.model.tokenizer_path", name)
    if template == "default":
        t.notes.append(
            f"{key}.chat_template{t.at(key + '.chat_template')}: NeMo RL's key, the tokenizer's own template"
        )
    elif template is None:  # NeMo RL's passthrough template
        t.move(f"{key}.chat_template", "worker.actor.model.chat_template", PASSTHROUGH_TEMPLATE)
    elif template is not _MISSING:
        t.move(f"{key}.chat_template", "worker.actor.model.chat_template", template)
    if kwargs not in (_MISSING, None, {}):
        t.problems.append(
            f"{key}.chat_template_kwargs={kwargs!r}{t.at(key + '.chat_template_kwargs')}: rlstack renders templates "
            "without extra arguments; put their effect into worker.actor.model.chat_template"
        )


def _turns(t: _Translation) -> None:
    key = "grpo.max_rollout_turns"
    turns = t.take(key)
    if turns is _MISSING or turns == 1:
        if turns == 1:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, 1: single-turn rollouts")
        return
    t.move(key, "worker.rollout.agent.max_turns", turns)
    agent = "worker.rollout.agent"
    if t.get(f"{agent}.feedback") in (_MISSING, None) and t.get(f"{agent}.tools") in (
        _MISSING,
        [],
        None,
    ):
        t.problems.append(
            f"{key}={turns}{t.at(key)}: between NeMo RL's turns its environment replies; rlstack's replies come from "
            f"{agent}.feedback (file.py:fn, returning the next user message or None) or from tools ({agent}.tools)"
        )


def _top_k(t: _Translation) -> None:
    value = t.take("policy.generation.top_k")
    if value is not _MISSING:
        t.move("policy.generation.top_k", "worker.rollout.top_k", -1 if value is None else value)


def _ratio_clip_c(t: _Translation) -> None:
    value = t.take("loss_fn.ratio_clip_c")
    if value is not _MISSING:  # NeMo RL's null: no dual clip (rlstack's default clips at 3)
        t.move(
            "loss_fn.ratio_clip_c", "worker.actor.clip_ratio_dual", float("inf") if value is None else value
        )


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _drop_empty(values: dict, dotted: str) -> None:
    node = _get(values, dotted)
    if isinstance(node, dict):
        for k in list(node):
            _drop_empty(values, f"{dotted}.{k}")
        if not _get(values, dotted):
            _pop(values, dotted)


def _leaves(node: Any, prefix: str) -> list[str]:
    if not isinstance(node, dict):
        return [] if node is None else [prefix]
    return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}.{k}")]
