"""NeMo RL's algorithm keys that need a rule of their own: the advantage estimator, where the KL goes and how
it is estimated, dynamic sampling, reward shaping and scaling, the loss's switches, LoRA, and validation's
sampling. Each rule reads its keys out of the values being translated (`nemo_rl_translation.Translation`);
a value rlstack cannot mean is a problem naming the key and what to use instead."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import rlstack.config.tree as tree
from rlstack.config.compat.nemo_rl_translation import Translation
from rlstack.config.rollout import RolloutConfig

MISSING = tree.MISSING
ROLLOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RolloutConfig)}
"""rlstack's rollout defaults: the training sampling of a NeMo RL file that leaves policy.generation's out."""


def _taken(t: Translation, prefix: str, *names: str) -> dict[str, Any]:
    """`prefix.name` for each name that is set, read out."""
    return {n: t.take(f"{prefix}.{n}") for n in names if t.get(f"{prefix}.{n}") is not MISSING}


def _section(t: Translation, section: str, *names: str) -> dict[str, Any]:
    """The keys `names` of `section` that are set, read out with the section; any other key in it is a
    problem naming it (a key of a newer NeMo RL that rlstack does not know yet)."""
    own = _taken(t, section, *names)
    rest = t.get(section)  # what is left of it (`take` answers from the config as written)
    t.take(section)
    for k in rest if isinstance(rest, dict) else ():
        t.problems.append(
            f"{section}.{k}{t.at(f'{section}.{k}')}: NeMo RL's key, which rlstack does not read; remove it"
        )
    return own


def advantages(t: Translation) -> None:
    """`grpo.adv_estimator` (NeMo RL's current layout, over the older `grpo.normalize_rewards` /
    `grpo.use_leave_one_out_baseline`): grpo with or without the std and the leave-one-out baseline
    (`grpo`, `loo_std`, `rloo`), or REINFORCE++ with (`minus_baseline`) or without the group mean."""
    section = "grpo.adv_estimator"
    own = _section(t, section, "name", "normalize_rewards", "use_leave_one_out_baseline", "minus_baseline")
    legacy = _taken(t, "grpo", "normalize_rewards", "use_leave_one_out_baseline")
    name = own.get("name", "grpo")
    if name == "reinforce_plus_plus":
        baseline = own.get("minus_baseline", True)
        estimator = "reinforce_plus_plus_baseline" if baseline else "reinforce_plus_plus"
        t.move(f"{section}.name", "algorithm.adv_estimator", estimator)
        for k in ("normalize_rewards", "use_leave_one_out_baseline"):
            if k in own or k in legacy:
                t.notes.append(
                    f"{section}.{k}: NeMo RL's grpo estimator's key, not used by reinforce_plus_plus"
                )
        return
    if name != "grpo":
        t.problems.append(
            f"{section}.name={name!r}{t.at(section + '.name')}: rlstack reads NeMo RL's grpo and "
            "reinforce_plus_plus; for another estimator set algorithm.adv_estimator (gae, grpo, rloo, "
            "reinforce_plus_plus, remax, grpo_passk, loo_std)"
        )
        return
    if "minus_baseline" in own:
        key = f"{section}.minus_baseline"
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: REINFORCE++'s, and the estimator is grpo")
    if own.keys() - {"name", "minus_baseline"}:
        for k in legacy:  # NeMo RL reads grpo.adv_estimator when it is there
            t.notes.append(f"grpo.{k}{t.at('grpo.' + k)}: NeMo RL's older key, not used: {section} is set")
    if not own.keys() - {"name", "minus_baseline"} and not legacy:
        if "name" in own:
            t.move(f"{section}.name", "algorithm.adv_estimator", "grpo")
        return
    loo = bool(own.get("use_leave_one_out_baseline", legacy.get("use_leave_one_out_baseline", False)))
    norm = bool(own.get("normalize_rewards", legacy.get("normalize_rewards", True)))
    prefix = section if own.keys() - {"name", "minus_baseline"} else "grpo"
    key = f"{prefix}.use_leave_one_out_baseline" if loo else f"{prefix}.normalize_rewards"
    t.move(key, "algorithm.adv_estimator", ("loo_std" if norm else "rloo") if loo else "grpo")
    if not loo:
        t.move(f"{prefix}.normalize_rewards", "algorithm.norm_adv_by_std_in_grpo", norm)
    else:
        t.notes.append(
            f"{prefix}.normalize_rewards={norm}{t.at(prefix + '.normalize_rewards')}: with the leave-one-out baseline, "
            f"{'loo_std divides by the group std' if norm else 'rloo does not divide by the group std'}"
        )
    if "name" in own:
        t.notes.append(
            f"{section}.name=grpo{t.at(section + '.name')}: NeMo RL's group advantages, read as above"
        )


KL_TYPES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
"""NeMo RL's KL estimators (Schulman's k1, k2, k3) -> rlstack's `algorithm.kl_penalty`."""
KL_CLAMPS = {"loss_fn.kl_input_clamp_value": 20.0, "loss_fn.kl_output_clamp_value": 10.0}
"""rlstack's KL clamps (`algos/kl.py`): the log-ratio to [-20, 20] before exp, the estimate to [-10, 10]."""


def kl(t: Translation) -> None:
    """`loss_fn.reference_policy_kl_penalty` (the coefficient; 0: no KL) as a loss, or in the reward with
    `loss_fn.use_kl_in_reward`; `reference_policy_kl_type` (k1, k2, k3) as rlstack's estimator."""
    key = "loss_fn.reference_policy_kl_penalty"
    coef, kind = t.take(key), t.take("loss_fn.reference_policy_kl_type")
    in_reward = t.take("loss_fn.use_kl_in_reward")
    k3 = kind is MISSING or kind == "k3"  # rlstack clamps its low_var_kl (k3) only, and always
    for clamp, value in KL_CLAMPS.items():
        got = t.take(clamp)
        if got is MISSING:
            continue
        if k3 and got is not None and float(got) == value:
            t.notes.append(
                f"{clamp}{t.at(clamp)}: NeMo RL's key, not used: rlstack clamps k3 the same ({value:g})"
            )
        elif not k3 and got is None:
            t.notes.append(
                f"{clamp}{t.at(clamp)}: NeMo RL's key, null: rlstack does not clamp k1 / k2 either"
            )
        else:
            said = "k3" if kind is MISSING else kind
            t.problems.append(
                f"{clamp}={got!r}{t.at(clamp)} with loss_fn.reference_policy_kl_type={said}: rlstack clamps the k3 "
                f"estimate (low_var_kl) at {value:g} always and k1 / k2 never; set it to {value:g} with k3, or null "
                "with k1 / k2"
            )
    if kind is not MISSING and kind not in KL_TYPES:
        t.problems.append(
            f"loss_fn.reference_policy_kl_type={kind!r}{t.at('loss_fn.reference_policy_kl_type')}: NeMo RL's are "
            f"{', '.join(KL_TYPES)}"
        )
        return
    if coef is MISSING:
        return
    if in_reward is False:
        where = t.at("loss_fn.use_kl_in_reward")
        t.notes.append(f"loss_fn.use_kl_in_reward{where}: NeMo RL's key, false: the KL is a loss term")
    where = "algorithm.use_kl_in_reward" if in_reward is True else "algorithm.use_kl_loss"
    t.move(key, where, bool(coef))
    if in_reward is True:
        t.move("loss_fn.use_kl_in_reward", "algorithm.use_kl_loss", False)
    if coef:
        t.move(key, "algorithm.kl_coef", coef)
        kind_key = key if kind is MISSING else "loss_fn.reference_policy_kl_type"  # k3 where it is not set
        t.move(kind_key, "algorithm.kl_penalty", KL_TYPES["k3" if kind is MISSING else kind])
    elif kind is not MISSING:
        where = t.at("loss_fn.reference_policy_kl_type")
        t.notes.append(
            f"loss_fn.reference_policy_kl_type{where}: NeMo RL's key, not used: {key} is 0 (no KL)"
        )


def dynamic_sampling(t: Translation) -> None:
    """`grpo.use_dynamic_sampling` keeps the groups whose rewards are not all equal and samples on, at most
    `dynamic_sampling_max_gen_batches` batches, `batch_multiplier` batches of prompts at a time: rlstack's
    online filtering with the group mean strictly between 0 and 1 (the same test for rewards of 0 or 1)."""
    key = "grpo.use_dynamic_sampling"
    on = t.take(key)
    tries, multiplier = t.take("grpo.dynamic_sampling_max_gen_batches"), t.take("grpo.batch_multiplier")
    if on is not True:
        for k, v in (("grpo.dynamic_sampling_max_gen_batches", tries), ("grpo.batch_multiplier", multiplier)):
            if v is not MISSING:
                t.notes.append(f"{k}{t.at(k)}: NeMo RL's key, not used: {key} is false")
        if on is False:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, false: every group trains")
        return
    t.move(key, "algorithm.online_filtering", True)
    for to, value in (
        ("algorithm.filter_key", "overall"),
        ("algorithm.filter_low", 0.0),
        ("algorithm.filter_high", 1.0),
    ):
        t.move(key, to, value)
    t.notes.append(
        f"{key}=true{t.at(key)}: groups whose rewards are all equal are dropped; rlstack tests the group mean "
        "strictly between 0 and 1, the same for rewards of 0 or 1 (set algorithm.filter_low / filter_high for others)"
    )
    if tries is not MISSING:
        t.move("grpo.dynamic_sampling_max_gen_batches", "algorithm.max_try_make_batch", tries)
    if multiplier is not MISSING:
        t.move("grpo.batch_multiplier", "algorithm.oversample_factor", multiplier)


def reward_shaping(t: Translation) -> None:
    """`grpo.reward_shaping` (DAPO's overlong penalty) as `worker.reward.overlong_buffer_length` /
    `overlong_penalty_factor`; `grpo.reward_scaling` (a linear map of the reward) is not built."""
    section = "grpo.reward_shaping"
    shaping = _section(
        t,
        section,
        "enabled",
        "overlong_buffer_length",
        "overlong_buffer_penalty",
        "max_response_length",
        "stop_properly_penalty_coef",
    )
    if shaping.get("enabled") is True:
        t.move(
            f"{section}.overlong_buffer_length",
            "worker.reward.overlong_buffer_length",
            shaping.get("overlong_buffer_length", 128),
        )
        t.move(
            f"{section}.overlong_buffer_penalty",
            "worker.reward.overlong_penalty_factor",
            shaping.get("overlong_buffer_penalty", 1),
        )
        t.notes.append(
            f"{section}.max_response_length{t.at(section)}: rlstack penalizes up to data.max_response_length"
        )
        if shaping.get("stop_properly_penalty_coef") is not None:
            t.problems.append(
                f"{section}.stop_properly_penalty_coef{t.at(section)}: not built in rlstack; write the penalty for a "
                "response that did not end in your reward function (reward_inputs carry response_length)"
            )
    elif shaping:
        t.notes.append(f"{section}{t.at(section)}: NeMo RL's keys, not used: reward_shaping.enabled is false")
    section = "grpo.reward_scaling"
    scaling = _section(t, section, "enabled", "source_min", "source_max", "target_min", "target_max")
    if scaling.get("enabled") is True:
        t.problems.append(
            f"{section}.enabled=true{t.at(section)}: rlstack does not rescale rewards; scale them in the reward "
            "function (worker.reward.reward_function_kwargs can pass the bounds)"
        )
    elif scaling:
        t.notes.append(f"{section}{t.at(section)}: NeMo RL's keys, not used: reward_scaling.enabled is false")


OFF_VALUES: dict[str, tuple[Any, str]] = {
    "loss_fn.force_on_policy_ratio": (
        False,
        "rlstack skips the old log-prob pass by itself when the update is on-policy",
    ),
    "loss_fn.disable_ppo_ratio": (False, "rlstack's losses use the ratio to the sampling policy"),
    "loss_fn.positive_example_nll_weight": (0.0, "VAPO's NLL term on right samples is not built in rlstack"),
    "grpo.val_start_at": (-1, "rlstack validates every trainer.val_freq steps from the first"),
    "grpo.async_grpo.max_generation_failures": (0, "rlstack stops at a rollout worker's first failure"),
    "grpo.async_grpo.recompute_kv_cache_after_weight_updates": (False, "rlstack's engines keep their cache"),
    "policy.offload_optimizer_for_logprob": (False, "rlstack keeps the optimizer state where it is"),
    "checkpointing.save_optimizer": (
        True,
        "rlstack's checkpoints hold the optimizer state, so that a resume is exact",
    ),
    "policy.generation.vllm_cfg.kv_cache_dtype": (
        "auto",
        "rlstack's vLLM engine caches keys and values in the model's dtype",
    ),
    "policy.generation.vllm_cfg.reset_encoder_cache_after_weight_update": (
        False,
        "rlstack's vLLM engine keeps its encoder cache",
    ),
    "policy.generation.vllm_cfg.logprobs_mode": (
        "processed_logprobs",
        "rlstack's engines return the log-probs of the distribution they sample from (after temperature and top-p)",
    ),
}
"""NeMo RL keys that change nothing here at their shipped value (`value`) and have no rlstack equivalent
otherwise: a note at that value, a problem (`why`) at another."""


def switches(t: Translation) -> None:
    """The loss's switches (`use_cispo`), and the keys of `OFF_VALUES`."""
    key = "loss_fn.use_cispo"
    cispo = t.take(key)
    if cispo is True:
        seq = "loss_fn.sequence_level_importance_ratios"
        if t.take(seq) is True:
            t.problems.append(
                f"{key}=true{t.at(key)} with {seq}=true: CISPO's ratios are per token; keep one"
            )
            return
        t.notes.append(f"{seq}{t.at(seq)}: NeMo RL's key, false: CISPO's ratios are per token")
        t.move(key, "worker.actor.loss_type", "cispo")
    elif cispo is not MISSING:
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, false: the loss is worker.actor.loss_type's")
    for key, (off, why) in OFF_VALUES.items():
        value = t.take(key)
        if value is MISSING:
            continue
        if value == off:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used at {off!r}: {why}")
        else:
            t.problems.append(f"{key}={value!r}{t.at(key)}: {why}; set it to {off!r} or remove it")


def lora(t: Translation) -> None:
    """`policy.dtensor_cfg.lora_cfg` as `worker.actor.model.lora` (peft's LoRA: dropout on the adapter's
    input, A initialized by peft's Kaiming-uniform, B at zero, so that training starts from the base)."""
    section = "policy.dtensor_cfg.lora_cfg"
    cfg = t.take(section)
    if cfg is MISSING:
        return
    cfg = cfg if isinstance(cfg, dict) else {}
    if cfg.get("enabled") is not True:
        t.notes.append(
            f"{section}{t.at(section)}: NeMo RL's LoRA settings, not used (lora_cfg.enabled is false)"
        )
        return
    lora = "worker.actor.model.lora"
    t.move(f"{section}.dim", f"{lora}.rank", cfg.get("dim", 8))
    t.move(f"{section}.alpha", f"{lora}.alpha", cfg.get("alpha", 32))
    t.move(f"{section}.dropout", f"{lora}.dropout", cfg.get("dropout", 0.0))
    targets = ["all-linear"] if cfg.get("match_all_linear", True) else list(cfg.get("target_modules") or [])
    t.move(f"{section}.target_modules", f"{lora}.target_modules", targets)
    excluded = list(cfg.get("exclude_modules") or [])
    if excluded:  # NeMo RL's names match a module's name or its end
        pattern = "|".join(f"(?:.*\\.)?{re.escape(m)}" for m in excluded)
        t.move(f"{section}.exclude_modules", f"{lora}.exclude_modules", pattern)
    known = {"enabled", "dim", "alpha", "dropout", "target_modules", "exclude_modules", "match_all_linear"}
    known |= {"dropout_position", "lora_A_init", "use_triton"}
    for k in sorted(cfg.keys() - known):
        t.problems.append(
            f"{section}.{k}{t.at(section)}: NeMo RL's LoRA key, which rlstack does not read; remove it"
        )
    t.notes.append(
        f"{section}{t.at(section)}: dropout_position, lora_A_init and use_triton not used: peft applies dropout to "
        "the adapter's input and initializes A Kaiming-uniform (B at zero either way: training starts from the base)"
    )


def validation_sampling(t: Translation) -> None:
    """`policy.generation.val_temperature` / `val_top_p` / `val_top_k` and `grpo.val_num_generations_per_prompt`
    as rlstack's `worker.rollout.val_*`. NeMo RL validates by sampling at the training values: its `validate()`
    generates with `greedy=False` (nemo_rl/algorithms/grpo.py), which its vLLM worker samples at
    policy.generation.temperature / top_p / top_k (`_build_sampling_params` in
    nemo_rl/models/generation/vllm/vllm_worker.py). The val_* keys came later (NeMo RL #3401) and follow the
    training values too (`${.temperature}` in its example files; its setup refuses other values but on the
    NeMo-Gym path), so a file that leaves them out validates at its training values here as well, not at
    rlstack's greedy default."""
    followed = []
    for name, to in (("temperature", "val_temperature"), ("top_p", "val_top_p"), ("top_k", "val_top_k")):
        key = f"policy.generation.val_{name}"
        value = t.take(key)
        if value is MISSING:
            if t.get(f"worker.rollout.{to}") is MISSING:  # else the command line's own
                value = _training_sampling(t, name)
                if value is not MISSING:
                    tree.set(t.values, f"worker.rollout.{to}", value)
                    followed.append(f"worker.rollout.{to}={value}")
            continue
        if name == "top_k" and value is None:
            value = -1
        t.move(key, f"worker.rollout.{to}", value)
    if followed:
        section = "policy.generation"
        t.notes.append(
            f"{section}{t.at(section)} sets no val_temperature / val_top_p / val_top_k: NeMo RL validates by "
            f"sampling at the training temperature, top_p and top_k, read as {', '.join(followed)} (rlstack's own "
            f"default is greedy; set {section}.val_temperature=0 for greedy validation)"
        )
    key = "grpo.val_num_generations_per_prompt"
    n = t.take(key)
    if n is not MISSING:
        t.move(key, "worker.rollout.val_n", n)


IS_KEYS = ("truncated_importance_sampling_type", "truncated_importance_sampling_ratio")
IS_MIN = "truncated_importance_sampling_ratio_min"


def importance_sampling(t: Translation) -> None:
    """`loss_fn.use_importance_sampling_correction` with NeMo RL's truncation (`tis`: weights capped at
    `truncated_importance_sampling_ratio`, none: not capped; `icepop` / `seq-mask-tis`: tokens or sequences
    outside [ratio_min, ratio] dropped) as `worker.actor.rollout_correction` and its bounds."""
    key = "loss_fn.use_importance_sampling_correction"
    on = t.take(key)
    found = _taken(t, "loss_fn", *IS_KEYS, IS_MIN)
    if on is not True:
        if on is False:
            t.move(key, "worker.actor.rollout_correction", None)
        for k in found:
            t.notes.append(f"loss_fn.{k}{t.at('loss_fn.' + k)}: NeMo RL's key, not used: {key} is false")
        return
    kind = found.get("truncated_importance_sampling_type") or "tis"
    ratio, low = found.get("truncated_importance_sampling_ratio"), found.get(IS_MIN)
    if kind not in ("tis", "icepop", "seq-mask-tis"):
        t.problems.append(
            f"loss_fn.truncated_importance_sampling_type={kind!r}{t.at(key)}: tis, icepop or seq-mask-tis"
        )
        return
    t.move(key, "worker.actor.rollout_correction", kind)
    t.move(key, "worker.actor.rollout_correction_high", float("inf") if ratio is None else ratio)
    if kind == "tis" and low not in (None, 0, 0.0):
        t.problems.append(
            f"loss_fn.{IS_MIN}={low!r}{t.at(key)}: rlstack's tis caps the weight from above only; use icepop or "
            "seq-mask-tis for a lower bound"
        )
    elif kind != "tis":
        t.move(key, "worker.actor.rollout_correction_low", 0.0 if low is None else low)


def _training_sampling(t: Translation, name: str) -> Any:
    """The sampling setting `name` (temperature, top_p, top_k) the run trains with: rlstack's key where the
    command line sets it, else NeMo RL's `policy.generation.<name>` (top_k's null: all tokens), else rlstack's
    default; `MISSING` where the value is not a number (its own problem, said once)."""
    value = t.get(f"worker.rollout.{name}")
    if value is MISSING:
        value = t.get(f"policy.generation.{name}")
    if value is MISSING:
        value = ROLLOUT_DEFAULTS[name]
    if name == "top_k" and value is None:
        value = -1
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else MISSING


def validation_end(t: Translation) -> None:
    """`grpo.val_at_end`: rlstack validates after the last step whatever it says."""
    key = "grpo.val_at_end"
    value = t.take(key)
    if value is True:
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: rlstack validates after the last step")
    elif value is False:
        t.notes.append(
            f"{key}=false{t.at(key)}: rlstack validates after the last step anyway (one validation more than NeMo "
            "RL runs; training is the same)"
        )


ALGORITHM_RULES = (
    advantages,
    kl,
    importance_sampling,
    dynamic_sampling,
    reward_shaping,
    switches,
    lora,
    validation_sampling,
    validation_end,
)
"""The rules of this module, in the order they run."""
