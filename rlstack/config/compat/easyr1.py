"""Keys of EasyR1's configs that rlstack names differently or does without.

rlstack's config follows EasyR1's layout, so an EasyR1 config mostly loads as it is. Its remaining keys
are handled here, before the config is built, each one way:

- `Moved`: the same setting under rlstack's name, read there (a note says so); values EasyR1 spells
  differently are translated (`bf16` -> `bfloat16`). Setting both names is a problem.
- `Inert`: nothing to do at the values listed (`ANY`: at every value), e.g. `enable_full_shard: true`,
  which FSDP2 always does; a note says why. At another value it is a problem saying what rlstack does
  instead.
- a few keys with their own rule (`disable_kl`, `limit_images`, `val_override_config`), and rlstack keys
  whose EasyR1 values are spelled differently (`VALUE_ALIASES`, LoRA's comma-separated module list, the
  forks' `adv_estimator: gspo` / `cispo`, read as grpo with that `worker.actor.loss_type` in a config that
  holds EasyR1's own keys; elsewhere they stay a wrong choice naming worker.actor.loss_type).

Notes are logged as warnings; problems join the config's other problems.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import rlstack.config.tree as tree
from rlstack.config.compat.easyr1_fields import EASYR1_FIELDS

log = logging.getLogger(__name__)

ANY = object()
"""`Inert.ok`: every value needs nothing."""


@dataclass(frozen=True)
class Moved:
    to: str
    """rlstack's key."""
    values: dict | None = None
    """EasyR1's values -> rlstack's, where they are spelled differently (others pass as they are)."""


@dataclass(frozen=True)
class Inert:
    ok: Any
    """The values that need nothing: a tuple, or `ANY`."""
    why: str


DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""EasyR1's dtype names -> rlstack's (torch's)."""
OFFLOAD = Inert(
    ANY,
    "EasyR1 moves the weights / optimizer state to host memory between phases; rlstack keeps them on the "
    "device (worker.actor.fsdp.offload_params is FSDP2's CPU offload during every pass: less GPU memory, "
    "slower steps)",
)
REF_FOLLOWS = Inert(
    ANY, "the reference model follows the actor (worker.actor.model.dtype, worker.actor.fsdp)"
)
FSDP2 = Inert(("fsdp",), "rlstack shards with FSDP2 (fully_shard)")
FULL_SHARD = Inert((True,), "FSDP2 always shards fully over the ranks; replicated training is not built")
EASYR1_FSDP_KEYS = (
    "enable_full_shard",
    "enable_cpu_offload",
    "enable_rank0_init",
    "use_orig_params",
    "torch_dtype",
    "fsdp_size",
    "mp_param_dtype",
    "mp_reduce_dtype",
    "mp_buffer_dtype",
)

FOREIGN: dict[str, Moved | Inert] = {
    "data.video_key": Inert(("videos",), "rlstack reads no videos; remove the key"),
    "data.video_fps": Inert(ANY, "rlstack reads no videos"),
    "data.mini_rollout_batch_size": Inert(
        (None,),
        "rlstack's online filtering generates data.rollout_batch_size x algorithm.oversample_factor prompts per "
        "round: set algorithm.oversample_factor instead",
    ),
    "data.override_chat_template": Moved("worker.actor.model.chat_template"),
    "worker.actor.strategy": FSDP2,
    "worker.actor.use_torch_compile": Inert(ANY, "rlstack runs the model eagerly"),
    "worker.actor.ulysses_sequence_parallel_size": Moved("worker.actor.ulysses_size"),  # veRL's name
    "worker.actor.loss_avg_mode": Moved(
        "worker.actor.loss_agg_mode", {"token": "token-mean", "seq": "seq-mean-token-mean"}
    ),
    "worker.actor.model.freeze_vision_tower": Moved("worker.actor.freeze_vision_tower"),
    "worker.actor.model.override_config": Inert(({},), "rlstack loads the model's config as saved"),
    "worker.actor.fsdp.enable_full_shard": FULL_SHARD,
    "worker.actor.fsdp.enable_rank0_init": Inert(ANY, "every rank loads the model and FSDP2 shards it"),
    "worker.actor.fsdp.enable_cpu_offload": Moved("worker.actor.fsdp.offload_params"),
    "worker.actor.fsdp.use_orig_params": Inert(
        ANY, "FSDP2 shards each parameter as it is (no flat parameters)"
    ),
    "worker.actor.fsdp.torch_dtype": Moved("worker.actor.model.dtype", DTYPES),
    "worker.actor.fsdp.fsdp_size": Inert(
        (-1,), "FSDP2 shards over every rank of the policy (no hybrid sharding)"
    ),
    "worker.actor.fsdp.mp_reduce_dtype": Inert(("fp32", "float32"), "FSDP2 reduces gradients in float32"),
    "worker.actor.fsdp.mp_buffer_dtype": Inert(("fp32", "float32"), "buffers stay in float32"),
    "worker.actor.offload.offload_params": OFFLOAD,
    "worker.actor.offload.offload_optimizer": OFFLOAD,
    "worker.ref.strategy": FSDP2,
    **{f"worker.ref.fsdp.{k}": REF_FOLLOWS for k in EASYR1_FSDP_KEYS},
    # EasyR1 copies these from worker.actor to worker.ref; rlstack's reference follows the actor's the same way
    **{
        f"worker.ref.{k}": Inert(ANY, f"the reference model follows worker.actor.{k}, as EasyR1 sets it")
        for k in ("dynamic_batching", "padding_free", "ulysses_size")
    },
    "worker.ref.offload.offload_params": REF_FOLLOWS,
    "worker.ref.offload.offload_optimizer": REF_FOLLOWS,
    "worker.rollout.enable_chunked_prefill": Inert(
        ANY, "vLLM's scheduler decides (rlstack turns chunked prefill off on vLLM's CPU build)"
    ),
    "worker.rollout.disable_tqdm": Inert(ANY, "rlstack shows no generation progress bars"),
    "worker.reward.reward_type": Inert(
        ("batch",),
        "rlstack reads a reward function's type from its file: REWARD_TYPE = 'batch' (the default, "
        "fn(list of inputs) -> list of dicts) or 'sequential' (fn(input) -> dict); remove the key",
    ),
    "worker.reward.score_function": Moved("worker.reward.reward_function"),
    "trainer.total_episodes": Moved("trainer.total_epochs"),
    "trainer.max_try_make_batch": Moved("algorithm.max_try_make_batch"),
    "trainer.save_checkpoint_path": Inert(
        (None,),
        "rlstack writes checkpoints in the run directory, trainer.output_dir/project_name/experiment_name/"
        "checkpoints: set trainer.output_dir",
    ),
}

VALUE_ALIASES: dict[str, dict] = {
    "worker.actor.model.dtype": DTYPES,
    "worker.critic.model.dtype": DTYPES,
    "worker.actor.fsdp.mp_param_dtype": DTYPES,
    "worker.actor.loss_type": {"default": "vanilla"},
}
"""rlstack's keys whose EasyR1 values are spelled differently (EasyR1's -> rlstack's)."""

ESTIMATOR_LOSSES = {"gspo": "gspo", "gspo_token": "gspo_token", "cispo": "cispo"}
"""`algorithm.adv_estimator` values of EasyR1 forks that name a policy loss: read as adv_estimator=grpo with
worker.actor.loss_type set to the loss (rlstack's GSPO and CISPO use GRPO's group advantages)."""
LOSS_TYPE = "worker.actor.loss_type"

VAL_OVERRIDES = {"temperature": "val_temperature", "top_p": "val_top_p", "top_k": "val_top_k", "n": "val_n"}
"""EasyR1's worker.rollout.val_override_config keys -> rlstack's worker.rollout keys."""

LORA_MODULES = "worker.actor.model.lora.target_modules"


def translate(values: dict, sources: dict[str, str], problems: list[str]) -> list[str]:
    """Read EasyR1's keys out of the merged config `values` (in place): moved to rlstack's keys or dropped.
    Returns the notes; appends problems (`sources`: key -> where it was set, for messages)."""
    notes: list[str] = []

    def at(key: str) -> str:
        return tree.where_set(sources, key)

    def move(key: str, to: str, value: Any, spellings: dict | None = None) -> None:
        if tree.get(values, to) is not tree.MISSING:
            problems.append(f"{key}{at(key)} is EasyR1's name for {to}, which is set too: keep {to} only")
        elif value is None:  # EasyR1's "unset"
            notes.append(f"{key}{at(key)}: EasyR1's key, unset: {to} keeps rlstack's default")
        else:
            value = spellings.get(value, value) if spellings and isinstance(value, str) else value
            tree.set(values, to, value)
            notes.append(f"{key}{at(key)}: EasyR1's key, read as {to}={value}")

    handlers: dict[str, Callable[[str, Any], None]] = {
        "algorithm.disable_kl": lambda key, value: _disable_kl(key, value, values, notes, at),
        "worker.rollout.limit_images": lambda key, value: _limit_images(key, value, move, notes, at),
        "worker.rollout.val_override_config": lambda key, value: _val_overrides(
            key, value, move, problems, at
        ),
    }
    easyr1_file = is_easyr1_file(values, sources)
    easyr1 = False  # the config holds keys only EasyR1 has: it is read as EasyR1's
    disable_kl_read = False
    for key in (*FOREIGN, *OWN_RULES):
        value = tree.pop(values, key)
        if value is tree.MISSING:
            continue
        easyr1, disable_kl_read = True, disable_kl_read or key == "algorithm.disable_kl"
        if key in handlers:
            handlers[key](key, value)
            continue
        rule = FOREIGN[key]
        if isinstance(rule, Moved):
            move(key, rule.to, value, rule.values)
        elif rule.ok is ANY or value in rule.ok:
            notes.append(f"{key}{at(key)}: EasyR1's key, not used: {rule.why}")
        else:
            problems.append(f"{key}={value!r}{at(key)}: {rule.why}")
    for section in ("worker.actor.offload", "worker.ref.offload", "worker.ref.fsdp"):
        if tree.get(values, section) == {}:  # emptied above
            tree.pop(values, section)
    for key, spellings in VALUE_ALIASES.items():
        value = tree.get(values, key)
        if isinstance(value, str) and value in spellings:
            tree.set(values, key, spellings[value])
            notes.append(f"{key}={value}{at(key)}: EasyR1's spelling, read as {spellings[value]}")
    if easyr1:
        _estimator_loss(values, notes, problems, at)
    if easyr1_file and not disable_kl_read and tree.get(values, "algorithm.use_kl_in_reward") is tree.MISSING:
        # EasyR1's disable_kl defaults to false: a KL penalty in the reward
        _disable_kl("algorithm.disable_kl", False, values, notes, lambda _: " (unset: EasyR1's default)")
    _idle_kl_coef(values, notes, at)  # before EasyR1's kl_coef fills in where no KL uses it
    if easyr1_file:
        _easyr1_defaults(values, notes, problems)
    modules = tree.get(values, LORA_MODULES)
    if isinstance(modules, str):  # EasyR1: "all-linear" or "q_proj,v_proj"
        tree.set(values, LORA_MODULES, rlstack_spelling(LORA_MODULES, modules))
        notes.append(f"{LORA_MODULES}={modules!r}{at(LORA_MODULES)}: EasyR1's spelling, read as a list")
    for note in notes:
        log.warning("config: %s", note)
    return notes


OWN_RULES = ("algorithm.disable_kl", "worker.rollout.limit_images", "worker.rollout.val_override_config")
"""EasyR1's keys read by a rule of their own (`translate`'s handlers), besides `FOREIGN`'s."""


def is_easyr1_file(values: dict, sources: dict[str, str]) -> bool:
    """Whether a config file (not only the command line) of the merged config `values` holds keys only EasyR1
    has: then the config is EasyR1's file, and the keys it leaves out take EasyR1's defaults."""
    for key in (*FOREIGN, *OWN_RULES):
        where = tree.where_set(sources, key)
        if tree.get(values, key) is not tree.MISSING and where and "command-line override" not in where:
            return True
    return False


def dialect_defaults(values: dict, sources: dict[str, str]) -> dict[str, Any]:
    """The defaults the keys of the merged config `values` take where it leaves them out, where they are not
    rlstack's: EasyR1's for an EasyR1 file (`EASYR1_DEFAULTS` and `EASYR1_SPELLED` for rlstack's keys,
    `EASYR1_FIELDS` for its fields rlstack has no key for), else none. What an interpolation
    (`${worker.rollout.n}`, `${algorithm.disable_kl}`) to such a key reads, as in EasyR1, which merges its
    defaults with the file and then resolves: each in EasyR1's spelling (`${worker.actor.fsdp.mp_param_dtype}`
    is `bf16` there), as the file's own values are (interpolations resolve before `translate` respells them)."""
    return {**EASYR1_FIELDS, **EASYR1_SPELLED, **EASYR1_DEFAULTS} if is_easyr1_file(values, sources) else {}


EASYR1_DEFAULTS: dict[str, Any] = {
    "data.val_files": "",
    "data.prompt_key": "prompt",
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.rollout_batch_size": 512,
    "data.val_batch_size": -1,
    "trainer.total_epochs": 15,
    "trainer.project_name": "easy_r1",
    "trainer.experiment_name": "demo",
    "trainer.val_generations_to_log": 0,
    "trainer.save_limit": -1,
    "worker.actor.global_batch_size": 256,
    "worker.actor.micro_batch_size_per_device_for_update": 4,
    "worker.actor.micro_batch_size_per_device_for_experience": 16,
    "worker.actor.clip_ratio_high": 0.3,
    "worker.actor.model.enable_gradient_checkpointing": True,
    "worker.actor.model.lora.alpha": 64,
    "worker.actor.fsdp.mp_param_dtype": "bf16",
    "worker.actor.padding_free": True,
    "worker.actor.dynamic_batching": True,
    "worker.critic.global_batch_size": 256,
    "worker.critic.micro_batch_size_per_device_for_update": 4,
    "worker.critic.micro_batch_size_per_device_for_experience": 16,
    "worker.critic.optim.lr": 1e-6,
    "worker.critic.dynamic_batching": True,
    "worker.rollout.n": 1,
    "algorithm.kl_coef": 1e-3,
    "algorithm.kl_penalty": "kl",
}
"""EasyR1's defaults (its DataConfig, AlgorithmConfig, TrainerConfig, ActorConfig, ModelConfig, RolloutConfig)
where rlstack's are the tiny demo's or otherwise differ: what the keys an EasyR1 config file leaves out mean
there (the KL's whether it is a loss or in the reward: EasyR1 copies the algorithm's to the actor's; the actor's
padding-free layout and dynamic batching, and the critic's dynamic batching, all on in EasyR1's ActorConfig and
CriticConfig, off by default here, where the padded layout runs a prompt once for all its samples).
Validation sampling follows the rollout's (`_easyr1_validation`). Spelled as EasyR1 spells them, which is what
an interpolation reads (`dialect_defaults`); the run takes rlstack's spelling (`VALUE_ALIASES`: `bf16` is
`bfloat16`)."""
EASYR1_SPELLED: dict[str, Any] = {
    "worker.actor.loss_type": "default",
    "worker.actor.model.lora.target_modules": "all-linear",
}
"""EasyR1's defaults of rlstack's keys where rlstack's default means the same but is spelled otherwise (its
ActorConfig.loss_type and LoraConfig.target_modules, verl/workers/actor/config.py lines 27 and 115 at EasyR1
b44b311): only what an interpolation in an EasyR1 file reads (`${worker.actor.loss_type}` is `default` there);
the run keeps rlstack's default (`vanilla`, `[all-linear]`), which is the same setting."""
EASYR1_ROLLOUT = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
"""EasyR1's sampling defaults (its RolloutConfig), which its validation uses where val_override_config does not
say otherwise."""
EASYR1_REQUIRED = ("data.train_files", "worker.actor.model.model_path", "worker.reward.reward_function")
"""Keys EasyR1 has no default for (rlstack's are the demo's task, model and reward)."""


def _easyr1_defaults(values: dict, notes: list[str], problems: list[str]) -> None:
    """An EasyR1 config file: the keys it leaves out take EasyR1's defaults, not the demo's; those EasyR1
    has none for must be set."""
    unset = {
        k: rlstack_spelling(k, v) for k, v in EASYR1_DEFAULTS.items() if tree.get(values, k) is tree.MISSING
    }
    for k, v in unset.items():
        tree.set(values, k, v)
    if unset:
        notes.append(
            "keys this EasyR1 config leaves out take EasyR1's defaults (rlstack's own are its tiny demo's): "
            + ", ".join(f"{k}={v!r}" for k, v in unset.items())
        )
    _easyr1_validation(values, notes)
    _easyr1_budgets(values, notes)
    limit = tree.get(values, "trainer.save_limit")
    if isinstance(limit, int) and limit > 0 and tree.get(values, "trainer.save_best_metric") is tree.MISSING:
        notes.append(
            f"trainer.save_limit={limit}: EasyR1 keeps the checkpoint best by the validation reward among them "
            f"and the newest others; rlstack keeps the newest {limit} (trainer.save_best_metric=val/reward_score "
            f"keeps the {limit} best by it and the newest)"
        )
    if tree.get(values, "worker.actor.model.trust_remote_code") is tree.MISSING:
        notes.append(
            "worker.actor.model.trust_remote_code: EasyR1's default is true, rlstack's false (a model folder's "
            "own code is not run): set it true for a model that ships its code"
        )
    for k in EASYR1_REQUIRED:
        if tree.get(values, k) is tree.MISSING:
            problems.append(
                f"{k} is not set in this EasyR1 config, and EasyR1 has no default for it (rlstack's is its "
                f"tiny demo's): set {k}"
            )


def rlstack_spelling(key: str, value: Any) -> Any:
    """`value` of rlstack's key `key` as rlstack spells it, where EasyR1 spells it otherwise (`VALUE_ALIASES`:
    EasyR1's `bf16` is `bfloat16`, its LoRA modules' `q_proj,v_proj` a list)."""
    if key == LORA_MODULES and isinstance(value, str):
        return [m.strip() for m in value.split(",") if m.strip()]
    spellings = VALUE_ALIASES.get(key, {})
    return spellings.get(value, value) if isinstance(value, str) else value


def _easyr1_validation(values: dict, notes: list[str]) -> None:
    """EasyR1 validates with the rollout's sampling settings, each replaced where val_override_config gives
    one (moved by then to worker.rollout.val_*); rlstack's own validation default is greedy."""
    said = []
    for name, default in EASYR1_ROLLOUT.items():
        key = f"worker.rollout.{VAL_OVERRIDES[name]}"
        if tree.get(values, key) is tree.MISSING:
            value = tree.get(values, f"worker.rollout.{name}")
            value = default if value is tree.MISSING else value
            tree.set(values, key, value)
            said.append(f"{key}={value}")
    if said:
        notes.append(
            "EasyR1 validates with the rollout's sampling, where worker.rollout.val_override_config does not "
            f"say otherwise: read as {', '.join(said)} (rlstack's own default is greedy)"
        )


EASYR1_BUDGETS = {
    "worker.actor.max_token_len_per_device_for_update": (
        "worker.actor.dynamic_batching",
        "worker.actor.micro_batch_size_per_device_for_update",
    ),
    "worker.actor.max_token_len_per_device_for_experience": (
        "worker.actor.dynamic_batching",
        "worker.actor.micro_batch_size_per_device_for_experience",
    ),
    "worker.ref.max_token_len_per_device_for_experience": (
        "worker.actor.dynamic_batching",
        "worker.actor.micro_batch_size_per_device_for_experience",
    ),
    "worker.critic.max_token_len_per_device_for_update": (
        "worker.critic.dynamic_batching",
        "worker.critic.micro_batch_size_per_device_for_update",
    ),
    "worker.critic.max_token_len_per_device_for_experience": (
        "worker.critic.dynamic_batching",
        "worker.critic.micro_batch_size_per_device_for_experience",
    ),
}
"""rlstack's dynamic-batching token budgets -> (the switch, the micro-batch size) EasyR1 derives each from. EasyR1
has no budget key: with dynamic batching its actor and critic pack each pass with up to the micro-batch size x
the padded length of the rows, which is data.max_prompt_length + data.max_response_length (prompts are padded
to the one, responses to the other); its reference runs the actor's code with the actor's experience micro-batch
and switch, copied to it."""


def _easyr1_budgets(values: dict, notes: list[str]) -> None:
    """The token budgets an EasyR1 file leaves out (all of them: EasyR1 has none), where its dynamic batching is
    on: EasyR1's, the micro-batch size x the padded length (`EASYR1_BUDGETS`), not rlstack's fixed 16384 /
    32768, which would pack passes of another size than EasyR1's on the same GPU."""
    lengths = [tree.get(values, k) for k in ("data.max_prompt_length", "data.max_response_length")]
    if not all(tree.is_count(v) for v in lengths):
        return  # a problem of its own
    padded, said = sum(lengths), []
    with_critic = tree.get(values, "algorithm.adv_estimator") == "gae"  # else the critic is not built
    for key, (switch, micro_key) in EASYR1_BUDGETS.items():
        if key.startswith("worker.critic.") and not with_critic:
            continue
        micro = tree.get(values, micro_key)
        if (
            tree.get(values, switch) is True
            and tree.get(values, key) is tree.MISSING
            and tree.is_count(micro)
        ):
            tree.set(values, key, micro * padded)
            said.append(f"{key}={micro * padded} ({micro_key.rsplit('.', 1)[-1]} {micro} x {padded})")
    if said:
        notes.append(
            "EasyR1's dynamic batching packs each pass with up to the micro-batch size x the padded length "
            f"(data.max_prompt_length + data.max_response_length = {padded}) tokens: read as {', '.join(said)}"
        )


EASYR1_KL = {k: EASYR1_DEFAULTS[k] for k in ("algorithm.kl_coef", "algorithm.kl_penalty")}
"""EasyR1's KL defaults (its AlgorithmConfig), where the config leaves them out: filled with the in-reward KL
that `disable_kl: false` turns on, also where only the command line says so."""


def _disable_kl(key: str, value: Any, values: dict, notes: list[str], at: Callable[[str], str]) -> None:
    if not value:  # EasyR1: the KL to the reference is a loss with use_kl_loss, else a penalty in the reward
        loss, in_reward = "algorithm.use_kl_loss", "algorithm.use_kl_in_reward"
        if tree.get(values, loss) is True or tree.get(values, in_reward) is not tree.MISSING:
            notes.append(f"{key}{at(key)}=false: EasyR1's key, the KL as {loss} / {in_reward} say")
            return
        tree.set(values, in_reward, True)
        unset = {k: v for k, v in EASYR1_KL.items() if tree.get(values, k) is tree.MISSING}
        for k, v in unset.items():  # EasyR1's own defaults, not rlstack's (which are a KL loss's)
            tree.set(values, k, v)
        filled = f", with EasyR1's {', '.join(f'{k}={v}' for k, v in unset.items())}" if unset else ""
        notes.append(
            f"{key}{at(key)}=false without {loss}=true: EasyR1 subtracts kl_coef x KL from the reward, read as "
            f"{in_reward}=true{filled} (set {loss}=true for the KL as a loss, or {key}=true for none)"
        )
        return
    kl_keys = ("algorithm.use_kl_loss", "algorithm.use_kl_in_reward")
    overridden = [f"{k}=true{at(k)}" for k in kl_keys if tree.get(values, k) is True]
    for k in kl_keys:
        tree.set(values, k, False)
    over = f", over {' and '.join(overridden)} (as EasyR1 does)" if overridden else ""
    notes.append(
        f"{key}{at(key)}=true: EasyR1's key, read as algorithm.use_kl_loss=false, use_kl_in_reward=false{over}"
    )


def _idle_kl_coef(values: dict, notes: list[str], at: Callable[[str], str]) -> None:
    """A kl_coef the config sets where no KL is on: EasyR1 would apply it (in the reward, unless disable_kl or
    use_kl_loss), rlstack does nothing with it; said, whatever the file."""
    key = "algorithm.kl_coef"
    coef = tree.get(values, key)
    on = [tree.get(values, k) is True for k in ("algorithm.use_kl_loss", "algorithm.use_kl_in_reward")]
    if coef is not tree.MISSING and coef and not any(on):
        notes.append(
            f"{key}={coef}{at(key)} does nothing: neither algorithm.use_kl_loss nor algorithm.use_kl_in_reward "
            "is true (EasyR1 subtracts it from the reward unless disable_kl or use_kl_loss: set "
            "algorithm.use_kl_in_reward=true for that, or algorithm.use_kl_loss=true for a KL loss)"
        )


def _estimator_loss(values: dict, notes: list[str], problems: list[str], at: Callable[[str], str]) -> None:
    key = "algorithm.adv_estimator"
    estimator = tree.get(values, key)
    if not isinstance(estimator, str) or estimator not in ESTIMATOR_LOSSES:
        return
    loss, given = ESTIMATOR_LOSSES[estimator], tree.get(values, LOSS_TYPE)
    if given not in (tree.MISSING, None, "vanilla", loss):
        problems.append(
            f"{key}={estimator}{at(key)} selects the {loss} loss (EasyR1 forks' spelling), but "
            f"{LOSS_TYPE}={given}{at(LOSS_TYPE)}: keep one (adv_estimator=grpo with {LOSS_TYPE}={loss})"
        )
        return
    tree.set(values, key, "grpo")
    tree.set(values, LOSS_TYPE, loss)
    notes.append(
        f"{key}={estimator}{at(key)}: EasyR1 forks' spelling, read as {key}=grpo, {LOSS_TYPE}={loss}"
    )


def _limit_images(key: str, value: Any, move: Callable, notes: list[str], at: Callable[[str], str]) -> None:
    if value == 0:  # EasyR1: no limit
        notes.append(
            f"{key}{at(key)}=0: EasyR1's 'no limit', not used: worker.rollout.agent.max_images bounds images"
        )
    else:
        move(key, "worker.rollout.agent.max_images", value)


def _val_overrides(
    key: str, value: Any, move: Callable, problems: list[str], at: Callable[[str], str]
) -> None:
    if not isinstance(value, dict):
        problems.append(f"{key}{at(key)}: expected a mapping like {{temperature: 0.6, n: 1}}, got {value!r}")
        return
    for name, v in value.items():
        if name in VAL_OVERRIDES:
            move(f"{key}.{name}", f"worker.rollout.{VAL_OVERRIDES[name]}", v)
        else:
            problems.append(
                f"{key}.{name}{at(key)}: rlstack's validation settings are worker.rollout."
                + ", worker.rollout.".join(VAL_OVERRIDES.values())
            )
