"""NeMo RL's keys that need a rule of their own (`rlstack.config.compat.nemo_rl` has the table of the
others): each rule reads its keys out of the values being translated, and moves them to rlstack's."""

from __future__ import annotations

import copy
import re
from typing import Any

import rlstack.config.tree as tree

REWARDS = {"math": "builtin:math", "code": "builtin:code"}
"""NeMo RL's environments -> rlstack's built-in rewards."""

_REFERENCE = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


class Translation:
    """One config's translation: the values being rewritten, where each key was set, and what it finds."""

    def __init__(self, values: dict, sources: dict[str, str], problems: list[str]):
        self.values, self.sources, self.problems = values, sources, problems
        self.notes: list[str] = []
        self.original = copy.deepcopy(values)

    def at(self, key: str) -> str:
        return tree.where_set(self.sources, key)

    def get(self, key: str) -> Any:
        """rlstack's (or a not yet translated NeMo RL) key's value as it stands, or `tree.MISSING`."""
        return tree.get(self.values, key)

    def take(self, key: str) -> Any:
        """Remove a NeMo RL key; its value, following `${other.key}` references."""
        tree.pop(self.values, key)
        value, seen = tree.get(self.original, key), set()
        while isinstance(value, str) and (m := _REFERENCE.match(value)) and m.group(1) not in seen:
            seen.add(m.group(1))
            value = tree.get(self.original, m.group(1))
        return value

    def move(self, key: str, to: str, value: Any, spellings: dict | None = None) -> None:
        """Set rlstack's `to` from NeMo RL's `key` (the command line's own `to` wins)."""
        if self.get(to) is not tree.MISSING:
            if self.sources.get(to, "").startswith("command-line"):
                self.notes.append(f"{key}{self.at(key)}: NeMo RL's key for {to}, which the command line sets")
            else:
                self.problems.append(
                    f"{key}{self.at(key)} is NeMo RL's name for {to}, which is set too: keep {to} only"
                )
            return
        if spellings is not None and hashable(value) and value in spellings:
            value = spellings[value]
        tree.set(self.values, to, value)
        self.notes.append(f"{key}{self.at(key)}: NeMo RL's key, read as {to}={value}")


def _advantages(t: Translation) -> None:
    loo, norm = t.take("grpo.use_leave_one_out_baseline"), t.take("grpo.normalize_rewards")
    if loo is tree.MISSING and norm is tree.MISSING:
        return
    loo, norm = loo is not tree.MISSING and bool(loo), norm is tree.MISSING or bool(norm)
    key = "grpo.use_leave_one_out_baseline" if loo else "grpo.normalize_rewards"
    estimator = ("loo_std" if norm else "rloo") if loo else "grpo"
    t.move(key, "algorithm.adv_estimator", estimator)
    if not loo:
        t.move("grpo.normalize_rewards", "algorithm.norm_adv_by_std_in_grpo", norm)


def _global_batch(t: Translation) -> None:
    key = "policy.train_global_batch_size"
    total = t.take(key)
    if total is tree.MISSING:
        return
    n = t.take("grpo.num_generations_per_prompt")
    if n is not tree.MISSING:
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
    step = prompts if prompts is not tree.MISSING else t.get("grpo.num_prompts_per_step")
    if isinstance(step, int) and total // n > step:
        t.problems.append(
            f"{key}={total}{t.at(key)} is {total // n} prompts of {n} trajectories, more than the {step} prompts "
            f"a step generates (grpo.num_prompts_per_step): set it to at most {step * n}, one optimizer step per "
            "rollout (or a divisor of it for several)"
        )
        tree.set(t.values, "worker.actor.global_batch_size", step)  # no second problem about the same setting
        return
    t.move(key, "worker.actor.global_batch_size", total // n)


def _lengths(t: Translation) -> None:
    """Prompt and response bounds from NeMo RL's total (prompt + response) bound."""
    key = "policy.max_total_sequence_length"
    total = t.take(key)
    new_tokens = t.take("policy.generation.max_new_tokens")
    prompt = t.take("data.max_input_seq_length")
    if total is tree.MISSING:
        if new_tokens is not tree.MISSING:
            t.move("policy.generation.max_new_tokens", "data.max_response_length", new_tokens)
        if prompt is not tree.MISSING:
            t.move("data.max_input_seq_length", "data.max_prompt_length", prompt)
        return
    own = [t.get(k) is not tree.MISSING for k in ("data.max_prompt_length", "data.max_response_length")]
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
    tree.set(t.values, "data.max_prompt_length", prompt)
    tree.set(t.values, "data.max_response_length", response)
    t.notes.append(
        f"{key}={total}{t.at(key)}: NeMo RL's bound on prompt + response, read as data.max_prompt_length={prompt}, "
        f"data.max_response_length={response}"
    )


def _kl(t: Translation) -> None:
    key = "loss_fn.reference_policy_kl_penalty"
    coef = t.take(key)
    if coef is tree.MISSING:
        return
    t.move(key, "algorithm.use_kl_loss", bool(coef))
    if coef:
        t.move(key, "algorithm.kl_coef", coef)
        t.move(key, "algorithm.kl_penalty", "low_var_kl")  # NeMo RL's k3 estimator


def _env(t: Translation) -> None:
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
    if t.get("worker.reward.reward_function") is tree.MISSING:
        t.move(f"env.{n}", "worker.reward.reward_function", REWARDS[n])
    own = settings.get(n, {}) if isinstance(settings.get(n), dict) else {}
    for k, v in own.items():
        if k == "num_workers":
            t.move(f"env.{n}.num_workers", "worker.reward.num_workers", v)
        else:
            t.notes.append(
                f"env.{n}.{k}={v!r}{t.at(f'env.{n}.{k}')}: NeMo RL's environment setting, not used"
            )


def _datasets(t: Translation) -> None:
    """NeMo RL's per-split data section (`data.train`) over its older single `data.dataset_name`; a Hub
    dataset (`org/name`) is read from the Hub, a name of NeMo RL's registry is a problem."""
    name, held_out = t.get("data.train.dataset_name"), t.get("data.train.split_validation_size")
    if name is not tree.MISSING:
        key = "data.train.dataset_name"
        t.take(key)
        if isinstance(name, str) and "/" in name:
            t.move(key, "data.train_files", name)
        elif t.get("data.train.data_path") is tree.MISSING:
            t.problems.append(
                f"{key}={name!r}{t.at(key)}: a NeMo RL registry name, not rlstack's: set data.train_files (a file, "
                "builtin:<task>, or a Hub dataset as org/name@split), or data.train.data_path"
            )
    if name is not tree.MISSING and t.get("data.dataset_name") is not tree.MISSING:
        old = t.take("data.dataset_name")
        t.notes.append(
            f"data.dataset_name={old!r}{t.at('data.dataset_name')}: NeMo RL's key, not used: data.train is set"
        )
    if held_out is not tree.MISSING and held_out and t.get("data.val_files") is tree.MISSING:
        t.move(
            "data.train.split_validation_size", "data.val_files", ""
        )  # the held-out rows are the validation set


def _scheduler(t: Translation) -> None:
    key = "policy.scheduler"
    steps = t.take(key)
    if steps is tree.MISSING or steps is None:
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


def _loggers(t: Translation) -> None:
    wandb, tensorboard = t.take("logger.wandb_enabled"), t.take("logger.tensorboard_enabled")
    if wandb is tree.MISSING and tensorboard is tree.MISSING:
        return
    if t.get("trainer.logger") is not tree.MISSING:
        t.notes.append(f"logger.*_enabled{t.at('logger')}: NeMo RL's keys, not used: trainer.logger is set")
        return
    loggers = (
        ["console", "file"] + ["tensorboard"] * bool(tensorboard is True) + ["wandb"] * bool(wandb is True)
    )
    tree.set(t.values, "trainer.logger", loggers)
    t.notes.append(f"logger.*_enabled{t.at('logger')}: NeMo RL's keys, read as trainer.logger={loggers}")


def _checkpoints(t: Translation) -> None:
    enabled = t.take("checkpointing.enabled")
    if enabled is False and t.get("trainer.save_model_only") is not tree.MISSING:
        t.notes.append(
            f"checkpointing.enabled=false{t.at('checkpointing')}: NeMo RL's key, trainer.save_model_only is set"
        )
    elif enabled is False:
        tree.pop(t.values, "checkpointing.save_period")
        tree.set(t.values, "trainer.save_model_only", True)
        t.notes.append(
            f"checkpointing.enabled=false{t.at('checkpointing')}: NeMo RL's key, read as trainer.save_model_only=true "
            "(no checkpoints to resume from; the trained model is still written to huggingface/)"
        )


def _megatron(t: Translation) -> None:
    key = "policy.megatron_cfg"
    cfg = t.take(key)
    if cfg is tree.MISSING:
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


def _tokenizer(t: Translation) -> None:
    key = "policy.tokenizer"
    name, model = t.take(f"{key}.name"), t.take("policy.model_name")
    template, kwargs = t.take(f"{key}.chat_template"), t.take(f"{key}.chat_template_kwargs")
    _ = t.take(key)
    if model is not tree.MISSING:
        t.move("policy.model_name", "worker.actor.model.model_path", model)
    if name in (None, model):
        t.notes.append(f"{key}.name{t.at(key + '.name')}: NeMo RL's key, the model's own tokenizer")
    elif name is not tree.MISSING:
        t.move(f"{key}.name", "worker.actor.model.tokenizer_path", name)
    if template == "default":
        t.notes.append(
            f"{key}.chat_template{t.at(key + '.chat_template')}: NeMo RL's key, the tokenizer's own template"
        )
    elif template is None:  # NeMo RL's passthrough template
        t.move(f"{key}.chat_template", "worker.actor.model.chat_template", PASSTHROUGH_TEMPLATE)
    elif template is not tree.MISSING:
        t.move(f"{key}.chat_template", "worker.actor.model.chat_template", template)
    if kwargs not in (tree.MISSING, None, {}):
        t.problems.append(
            f"{key}.chat_template_kwargs={kwargs!r}{t.at(key + '.chat_template_kwargs')}: rlstack renders templates "
            "without extra arguments; put their effect into worker.actor.model.chat_template"
        )


def _turns(t: Translation) -> None:
    key = "grpo.max_rollout_turns"
    turns = t.take(key)
    if turns is tree.MISSING or turns == 1:
        if turns == 1:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, 1: single-turn rollouts")
        return
    t.move(key, "worker.rollout.agent.max_turns", turns)
    agent = "worker.rollout.agent"
    if t.get(f"{agent}.feedback") in (tree.MISSING, None) and t.get(f"{agent}.tools") in (
        tree.MISSING,
        [],
        None,
    ):
        t.problems.append(
            f"{key}={turns}{t.at(key)}: between NeMo RL's turns its environment replies; rlstack's replies come from "
            f"{agent}.feedback (file.py:fn, returning the next user message or None) or from tools ({agent}.tools)"
        )


def _top_k(t: Translation) -> None:
    value = t.take("policy.generation.top_k")
    if value is not tree.MISSING:
        t.move("policy.generation.top_k", "worker.rollout.top_k", -1 if value is None else value)


def _ratio_clip_c(t: Translation) -> None:
    value = t.take("loss_fn.ratio_clip_c")
    if value is not tree.MISSING:  # NeMo RL's null: no dual clip (rlstack's default clips at 3)
        t.move(
            "loss_fn.ratio_clip_c", "worker.actor.clip_ratio_dual", float("inf") if value is None else value
        )


def hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


RULES = (
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
)
"""The rules, in the order they run (before the table)."""
