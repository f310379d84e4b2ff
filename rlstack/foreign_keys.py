"""Keys of EasyR1's configs that rlstack names differently or does without.

rlstack's config follows EasyR1's layout, so an EasyR1 config mostly loads as it is. Its remaining keys
are handled here, before the config is built, each one way:

- `Moved`: the same setting under rlstack's name; the value is read there (a note says so). Setting
  both names is a problem.
- `Inert`: nothing to do at the values listed (`ANY`: at every value), e.g. `enable_full_shard: true`,
  which FSDP2 always does; a note says why. At another value it is a problem saying what rlstack does
  instead.
- a few keys with their own rule (`disable_kl`, `limit_images`, `val_override_config`).

Notes are logged as warnings; problems join the config's other problems.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

ANY = object()
"""`Inert.ok`: every value needs nothing."""


@dataclass(frozen=True)
class Moved:
    to: str
    """rlstack's key."""
    combine: bool = False
    """Several EasyR1 keys feed `to` (booleans): it is on when any of them is."""


@dataclass(frozen=True)
class Inert:
    ok: Any
    """The values that need nothing: a tuple, or `ANY`."""
    why: str


OFFLOAD = Moved("worker.actor.fsdp.offload_params", combine=True)
REF_FOLLOWS = Inert(ANY, "the reference model follows worker.actor.fsdp (sharding and offload)")
FULL_SHARD = Inert((True,), "FSDP2 always shards fully over the ranks; replicated training is not built")
RANK0_INIT = Inert(ANY, "every rank loads the model and FSDP2 shards it")
ULYSSES = Inert((1,), "Ulysses sequence parallelism is not built in rlstack; remove the key")

FOREIGN: dict[str, Moved | Inert] = {
    "data.video_key": Inert(("videos",), "rlstack reads no videos; remove the key"),
    "data.video_fps": Inert(ANY, "rlstack reads no videos"),
    "data.mini_rollout_batch_size": Inert(
        (None,),
        "rlstack's online filtering generates data.rollout_batch_size x algorithm.oversample_factor prompts per "
        "round: set algorithm.oversample_factor instead",
    ),
    "data.override_chat_template": Inert(
        (None,),
        "rlstack renders prompts with the tokenizer's chat template: put yours in the model's tokenizer_config.json "
        "(chat_template), or shape the prompt with data.format_prompt",
    ),
    "worker.actor.ulysses_size": ULYSSES,
    "worker.actor.ulysses_sequence_parallel_size": ULYSSES,
    "worker.actor.model.freeze_vision_tower": Moved("worker.actor.freeze_vision_tower"),
    "worker.actor.optim.strategy": Inert(
        ("adamw",),
        "rlstack's AdamW keeps its state in float32; worker.actor.model.dtype=bfloat16 trains bfloat16 weights "
        "with float32 master copies",
    ),
    "worker.actor.fsdp.enable_full_shard": FULL_SHARD,
    "worker.actor.fsdp.enable_rank0_init": RANK0_INIT,
    "worker.actor.fsdp.enable_cpu_offload": OFFLOAD,
    "worker.actor.offload.offload_params": OFFLOAD,
    "worker.actor.offload.offload_optimizer": OFFLOAD,
    "worker.ref.fsdp.enable_full_shard": FULL_SHARD,
    "worker.ref.fsdp.enable_rank0_init": RANK0_INIT,
    "worker.ref.fsdp.enable_cpu_offload": REF_FOLLOWS,
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

VAL_OVERRIDES = {"temperature": "val_temperature", "top_p": "val_top_p", "top_k": "val_top_k", "n": "val_n"}
"""EasyR1's worker.rollout.val_override_config keys -> rlstack's worker.rollout keys."""


def translate(values: dict, sources: dict[str, str], problems: list[str]) -> list[str]:
    """Read EasyR1's keys out of the merged config `values` (in place): moved to rlstack's keys or dropped.
    Returns the notes; appends problems (`sources`: key -> where it was set, for messages)."""
    notes: list[str] = []

    def at(key: str) -> str:
        where = sources.get(key) or next((v for k, v in sources.items() if k.startswith(key + ".")), "")
        return f" ({where})" if where else ""

    def move(key: str, to: str, value: Any, combine: bool = False) -> None:
        if _get(values, to) is not _MISSING and not combine:
            problems.append(f"{key}{at(key)} is EasyR1's name for {to}, which is set too: keep {to} only")
            return
        if combine:
            previous = _get(values, to)
            value = bool(value) or (previous is not _MISSING and bool(previous))
        _set(values, to, value)
        notes.append(f"{key}{at(key)}: EasyR1's key, read as {to}={value}")

    handlers: dict[str, Callable[[str, Any], None]] = {
        "algorithm.disable_kl": lambda key, value: _disable_kl(key, value, values, notes, at),
        "worker.rollout.limit_images": lambda key, value: _limit_images(key, value, move, notes, at),
        "worker.rollout.val_override_config": lambda key, value: _val_overrides(
            key, value, move, problems, at
        ),
    }
    # the keys set in the explicit combine order first, so `combine` sees every source
    for key in [*FOREIGN, *handlers]:
        value = _pop(values, key)
        if value is _MISSING:
            continue
        if key in handlers:
            handlers[key](key, value)
            continue
        rule = FOREIGN[key]
        if isinstance(rule, Moved):
            move(key, rule.to, value, rule.combine)
        elif rule.ok is ANY or value in rule.ok:
            notes.append(f"{key}{at(key)}: EasyR1's key, not used: {rule.why}")
        else:
            problems.append(f"{key}={value!r}{at(key)}: {rule.why}")
    for section in ("worker.actor.offload", "worker.ref.offload", "worker.ref.fsdp"):
        if _get(values, section) == {}:  # emptied by the moves above
            _pop(values, section)
    for note in notes:
        log.warning("config: %s", note)
    return notes


def _disable_kl(key: str, value: Any, values: dict, notes: list[str], at: Callable[[str], str]) -> None:
    if value:
        for off in ("algorithm.use_kl_loss", "algorithm.use_kl_in_reward"):
            _set(values, off, False)
        notes.append(
            f"{key}{at(key)}=true: EasyR1's key, read as algorithm.use_kl_loss=false, use_kl_in_reward=false"
        )
    else:
        notes.append(
            f"{key}{at(key)}=false: EasyR1's key, not used: algorithm.use_kl_loss / use_kl_in_reward decide"
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


_MISSING = object()


def _get(values: dict, dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _pop(values: dict, dotted: str) -> Any:
    *parents, last = dotted.split(".")
    node: Any = values
    for part in parents:
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    if not isinstance(node, dict) or last not in node:
        return _MISSING
    return node.pop(last)


def _set(values: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
