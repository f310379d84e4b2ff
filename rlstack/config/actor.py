"""`worker.actor.*`: the policy's optimizer, sharding, batching and loss; the reference follows its batching."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rlstack.config.fields import field
from rlstack.config.model import ModelConfig

if TYPE_CHECKING:
    from rlstack.config.critic import CriticConfig
    from rlstack.config.schema import Config

PolicyLossName = Literal["vanilla", "gspo", "gspo_token", "cispo", "sapo"]
"""The policy losses (`rlstack.algos.policy_loss.PolicyLoss` is made of these)."""
LossAggModeName = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
"""The aggregations of token losses (`rlstack.algos.policy_loss.LossAggMode`)."""
RolloutCorrectionName = Literal["tis", "icepop", "seq-mask-tis"]
"""The rollout corrections (`rlstack.algos.policy_loss.RolloutCorrection`)."""

# Losses defined with one aggregation (a length-normalised sequence ratio or veRL's fixed choice):
# `worker.actor.loss_agg_mode` defaults to it and may not be set to another.
DEFINED_AGG_MODES = {
    "gspo": "seq-mean-token-mean",
    "gspo_token": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
}


@dataclass
class OptimConfig:
    lr: float = field(1.0e-6, ge=0)
    """Peak learning rate of AdamW."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], ge=0, lt=1)
    """AdamW betas."""
    weight_decay: float = field(1.0e-2, ge=0)
    """AdamW weight decay."""
    lr_warmup_ratio: float = field(0.0, ge=0, le=1)
    """Fraction of the training steps spent warming the learning rate up linearly."""
    lr_warmup_steps: int | None = field(None, ge=0)
    """Warm-up steps; overrides `lr_warmup_ratio` when set."""
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    min_lr_ratio: float = field(0.0, ge=0, le=1)
    """Cosine schedule floor, as a fraction of `lr`."""
    strategy: Literal["adamw", "adamw_bf16"] = "adamw"
    """adamw: AdamW's two moments in float32 (8 bytes a parameter); adamw_bf16 (EasyR1's): the moments kept in bfloat16 (4 bytes), computed in float32 each step; the weights' float32 masters (or FSDP2's float32 shards) stay either way."""


@dataclass
class FSDPConfig:
    mp_param_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """With several ranks (FSDP2): the dtype parameters are gathered and computed in, gradients reduced in float32 (unset: `model.dtype`)."""
    offload_params: bool = False
    """Keep the policy's and reference's parameter shards, gradients and optimizer state in host memory (FSDP2's CPU offload, on one rank too; EasyR1's offload_params and offload_optimizer together); saves GPU memory for host transfers and a CPU optimizer step."""


@dataclass
class ActorConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The policy optimizer."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of the policy and reference over several ranks (`trainer.backend=ray`)."""
    global_batch_size: int = field(32, ge=1)
    """Prompts per optimizer step (mini-batch); its trajectories are `global_batch_size * n`."""
    micro_batch_size_per_device_for_update: int = field(64, ge=1, resume=True)
    """Trajectories per forward/backward pass during the update (gradient accumulation unit)."""
    micro_batch_size_per_device_for_experience: int = field(128, ge=1, resume=True)
    """Trajectories per forward pass when computing log-probs without gradient."""
    ppo_epochs: int = field(1, ge=1)
    """Passes over the rollout batch per training step."""
    max_grad_norm: float = field(
        1.0, gt=0, also=(math.inf,), why="clipping to 0 stops every update; inf: no clipping"
    )
    """Gradient clipping norm."""
    clip_ratio_low: float = field(0.2, ge=0)
    """PPO clip range below 1 (ratio >= 1 - clip_ratio_low)."""
    clip_ratio_high: float = field(0.28, ge=0)
    """PPO clip range above 1 (ratio <= 1 + clip_ratio_high; DAPO's clip-higher)."""
    loss_type: PolicyLossName = "vanilla"
    """Policy loss: PPO clip (vanilla, with dual clip), GSPO, GSPO-token, CISPO or SAPO."""
    loss_agg_mode: LossAggModeName | None = None
    """How token losses of a mini-batch become one number (seq-mean-token-sum-norm: Dr.GRPO, veRL's sum over sequences / max length); unset: the mode the loss is defined with, seq-mean-token-mean for gspo, gspo_token and sapo, token-mean otherwise."""
    clip_ratio_dual: float = field(
        3.0,
        gt=1,
        also=(math.inf,),
        why="it caps the loss of a negative advantage at c times it; inf: no dual clip",
    )
    """Dual-clip bound c for negative advantages (loss <= -c * A)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    top_entropy_quantile: float = field(1.0, gt=0, le=1, why="1 trains on every token")
    """Train only on this fraction of highest-entropy response tokens of each micro-batch (0.2: the 80/20 rule; 1: all)."""
    rollout_correction: RolloutCorrectionName | None = None
    """Importance-sampling correction for rollout-vs-trainer numerics: truncated IS, IcePop, or sequence-masked TIS."""
    rollout_correction_low: float = 0.5
    """Lower bound of the kept IS-weight band (icepop, seq-mask-tis)."""
    rollout_correction_high: float = 2.0
    """Cap of the IS weight (tis) / upper bound of the kept band (icepop, seq-mask-tis)."""
    shuffle_mini_batches: bool = False
    """Shuffle trajectories before cutting mini-batches (seeded)."""
    freeze_vision_tower: bool = False
    """Vision models: keep the vision encoder's weights fixed (only the language model and merger train)."""
    padding_free: bool = False
    """Pack each micro-batch's rows into one sequence without their padding for log-probs, entropies and the update (veRL's use_remove_padding, EasyR1's padding_free); the reference model follows. false: the padded layout, which runs a prompt once for all its samples."""
    dynamic_batching: bool = False
    """Form micro-batches by a token budget (max_token_len_per_device_*) instead of a row count (veRL's use_dynamic_bsz); the gradient does not change."""
    skip_zero_advantage: bool = False
    """Rows whose advantages are all 0 take no forward or backward pass in the update (a few such rows still do where a vision tower or another rank needs them, or where no row would, so that the optimizer steps on zero gradients as before). Their loss and gradient are 0, so the update is the same up to rounding (the rows left are regrouped) for a model without dropout or routed experts: only the passes are saved (a GRPO group whose samples all scored alike is such rows). Token-mean metrics (actor/entropy, actor/pg_clipfrac*, actor/ppo_kl, actor/rollout_correction_weight) are then over the rows computed; actor/skipped_tokens says how much was left out. Not with a term that reads every row: a KL loss, an entropy bonus or penalty, top_entropy_quantile < 1."""
    max_token_len_per_device_for_update: int = field(16384, ge=1, resume=True)
    """Dynamic batching: attended tokens per forward/backward pass of the update (veRL's ppo_max_token_len_per_gpu). With padding_free on CPU (SDPA attends over a dense tokens x tokens mask) keep it to a few of the longest trajectories."""
    max_token_len_per_device_for_experience: int = field(32768, ge=1, resume=True)
    """Dynamic batching: attended tokens per forward pass computing log-probs (veRL's log_prob_max_token_len_per_gpu)."""
    ulysses_size: int = field(1, ge=1)
    """Sequence parallelism for long contexts (EasyR1's ulysses_size, veRL's ulysses_sequence_parallel_size): groups of this many consecutive policy ranks hold the same rows and split each packed sequence between them, attention exchanging heads for sequence (DeepSpeed-Ulysses all-to-all); the reference follows. Needs padding_free=true, sdpa attention, and attention and key/value heads divisible by it; 1: off."""


def actor_rules(cfg: Config, p: list[str]) -> None:
    """Batch sizes that must divide, token budgets that must hold a trajectory, the loss's aggregation."""
    d, a, r, t = cfg.data, cfg.worker.actor, cfg.worker.rollout, cfg.trainer
    if min(d.rollout_batch_size, a.global_batch_size) >= 1 and d.rollout_batch_size % a.global_batch_size:
        p.append(
            f"data.rollout_batch_size ({d.rollout_batch_size}) must be divisible by "
            f"worker.actor.global_batch_size ({a.global_batch_size}): each step's prompts are cut into "
            f"mini-batches of global_batch_size prompts; pick a divisor such as "
            f"{divisors_hint(d.rollout_batch_size)}"
        )
    budget_problems(cfg, p, token_budgets(cfg))
    mini = a.global_batch_size * r.n
    micro = a.micro_batch_size_per_device_for_update
    if min(mini, micro) >= 1 and not a.dynamic_batching and mini % micro:
        p.append(
            f"worker.actor.global_batch_size * worker.rollout.n = {a.global_batch_size} * {r.n} = {mini} "
            f"trajectories per mini-batch must be divisible by "
            f"worker.actor.micro_batch_size_per_device_for_update ({micro}); "
            f"pick a divisor such as {divisors_hint(mini)}"
        )
    optim_problems(p, "worker.actor.optim", a.optim)
    defined = DEFINED_AGG_MODES.get(a.loss_type)
    if defined and a.loss_agg_mode not in (None, defined):
        p.append(
            f"worker.actor.loss_type={a.loss_type} is defined with loss_agg_mode={defined} (each sequence counts "
            f"once, as in the paper and veRL), got worker.actor.loss_agg_mode={a.loss_agg_mode}: remove the key "
            f"or set it to {defined}"
        )
    if a.rollout_correction and not 0 <= a.rollout_correction_low <= a.rollout_correction_high:
        p.append(
            f"worker.actor.rollout_correction_low ({a.rollout_correction_low}) and _high ({a.rollout_correction_high}) "
            "must satisfy 0 <= low <= high"
        )
    if a.skip_zero_advantage:
        readers = [
            k
            for k, on in (
                ("algorithm.use_kl_loss=true", cfg.algorithm.use_kl_loss),
                (f"worker.actor.entropy_coeff={a.entropy_coeff}", a.entropy_coeff != 0),
                ("algorithm.use_entropy_penalty=true", cfg.algorithm.use_entropy_penalty),
                (f"worker.actor.top_entropy_quantile={a.top_entropy_quantile}", a.top_entropy_quantile < 1),
            )
            if on
        ]
        if readers:
            p.append(
                f"worker.actor.skip_zero_advantage=true leaves rows whose advantages are all 0 out of the update, "
                f"and {', '.join(readers)} makes every row's loss count (or the rows beside it in a micro-batch): "
                "set worker.actor.skip_zero_advantage=false, or drop those terms"
            )
    if min(t.nnodes, t.n_gpus_per_node) < 1:
        return
    world = t.nnodes * t.n_gpus_per_node
    sequence_parallel_problems(cfg, p, world)
    if a.fsdp.offload_params and a.model.lora.rank > 0:
        p.append(
            "worker.actor.fsdp.offload_params=true shards the policy with FSDP2, which LoRA does not take yet: "
            "keep the adapters on the device (offload_params=false) or train every weight (lora.rank=0)"
        )
    dp = world // a.ulysses_size if world % a.ulysses_size == 0 else world  # groups holding different rows
    if t.backend == "ray" and mini % dp:
        over = f"{world} ranks (trainer.nnodes x trainer.n_gpus_per_node)"
        if dp != world:
            over = f"{dp} data-parallel groups ({world} ranks / worker.actor.ulysses_size={a.ulysses_size})"
        p.append(
            f"worker.actor.global_batch_size x worker.rollout.n = {mini} trajectories per mini-batch do not "
            f"split evenly over {over}: make it a multiple of {dp}"
        )


def sequence_parallel_problems(cfg: Config, p: list[str], world: int) -> None:
    """`worker.actor.ulysses_size` > 1: the ranks it divides, the layout and kernel it runs on, the heads it splits."""
    a, t = cfg.worker.actor, cfg.trainer
    u = a.ulysses_size
    if u <= 1:
        return
    key = f"worker.actor.ulysses_size={u}"
    if t.backend != "ray" or world % u:
        ranks = f"{world} policy ranks" if t.backend == "ray" else "one process (trainer.backend=local)"
        p.append(
            f"{key} splits each sequence over {u} ranks, and the run has {ranks}: set trainer.backend=ray with "
            f"trainer.nnodes x trainer.n_gpus_per_node a multiple of {u}, or worker.actor.ulysses_size=1"
        )
    if not a.padding_free:
        p.append(
            f"{key} splits the packed sequence of the padding-free layout: set worker.actor.padding_free=true "
            "(or worker.actor.ulysses_size=1)"
        )
    m = a.model
    if m.attn_implementation != "sdpa" or m.trust_remote_code:
        p.append(
            f"{key} runs its attention on rlstack's SDPA path, with worker.actor.model.attn_implementation="
            f"{m.attn_implementation} and trust_remote_code={m.trust_remote_code}: set "
            "worker.actor.model.attn_implementation=sdpa and trust_remote_code=false (FlashAttention under "
            "sequence parallelism is not built yet)"
        )
    heads = attention_heads(m.model_path)
    if heads is not None:
        problem = heads_problem(u, *heads, m.model_path)
        if problem:
            p.append(problem)


def attention_heads(model_path: str | None) -> tuple[int, int] | None:
    """(attention heads, key/value heads) of the language model in a local model folder's config.json; None
    where there is none to read here (a Hub name or a built-in model not built yet: the policy checks when it
    loads the model)."""
    if not model_path:
        return None
    cfg_file = Path(os.path.expanduser(model_path)) / "config.json"
    if not cfg_file.is_file():
        return None
    c = json.loads(cfg_file.read_text())
    c = c.get("text_config", c)
    heads = c.get("num_attention_heads")
    if not isinstance(heads, int):
        return None
    return heads, int(c.get("num_key_value_heads") or heads)


def heads_problem(ulysses_size: int, heads: int, kv_heads: int, model_path: str | None) -> str | None:
    """Ulysses gives each of `ulysses_size` ranks an equal share of the query and key/value heads."""
    if heads % ulysses_size == 0 and kv_heads % ulysses_size == 0:
        return None
    fits = [k for k in range(1, heads + 1) if heads % k == 0 and kv_heads % k == 0]
    return (
        f"worker.actor.ulysses_size={ulysses_size} must divide the model's {heads} attention heads and {kv_heads} "
        f"key/value heads ({model_path}): each rank attends with an equal share of both; set it to one of "
        f"{', '.join(map(str, fits))}"
    )


def optim_problems(p: list[str], key: str, optim: OptimConfig) -> None:
    """AdamW takes two betas."""
    if len(optim.betas) != 2:
        p.append(f"{key}.betas = {optim.betas}: AdamW takes two betas, e.g. [0.9, 0.999]")


def token_budgets(cfg: Config) -> list[tuple[str, int]]:
    """The token budgets of the actor and the reference that are in use (dynamic batching on), under their keys."""
    a = cfg.worker.actor
    if not a.dynamic_batching:
        return []
    return [
        ("worker.actor.max_token_len_per_device_for_update", a.max_token_len_per_device_for_update),
        ("worker.actor.max_token_len_per_device_for_experience", a.max_token_len_per_device_for_experience),
        (
            "worker.ref.max_token_len_per_device_for_experience",
            cfg.worker.ref.max_token_len_per_device_for_experience,
        ),
    ]


def budget_problems(cfg: Config, p: list[str], budgets: list[tuple[str, int]]) -> None:
    """Token budgets that cannot hold the longest trajectory (those below 1 are range problems already)."""
    d = cfg.data
    longest = d.max_prompt_length + d.max_response_length
    if min(d.max_prompt_length, d.max_response_length) < 1:
        return
    for key, value in budgets:
        if 1 <= value < longest:
            p.append(
                f"{key} = {value} is less than data.max_prompt_length + data.max_response_length = {longest}: a "
                f"trajectory that long would not fit in a micro-batch; raise it to at least {longest}"
            )


def clamp_micro_batch(
    section: str, holder: ActorConfig | CriticConfig, factors: str, mini: int
) -> str | None:
    """`<section>.micro_batch_size_per_device_for_update` above its mini-batch of `mini` trajectories (`factors`:
    the keys and values that make it) set to `mini`, which runs the same one pass per mini-batch; the note that
    says so, or None. Dynamic batching cuts by tokens and leaves the row count unused."""
    key, micro = (
        f"{section}.micro_batch_size_per_device_for_update",
        holder.micro_batch_size_per_device_for_update,
    )
    if holder.dynamic_batching or not 1 <= mini < micro:
        return None
    holder.micro_batch_size_per_device_for_update = mini
    return (
        f"{key}={micro} is larger than the mini-batch of {factors} = {mini} trajectories: using {key}={mini} "
        "(one forward/backward pass per mini-batch)"
    )


def actor_micro_batch(cfg: Config) -> str | None:
    """The actor's update micro-batch clamped to its mini-batch (`clamp_micro_batch`)."""
    a, n = cfg.worker.actor, cfg.worker.rollout.n
    factors = f"worker.actor.global_batch_size * worker.rollout.n = {a.global_batch_size} * {n}"
    return clamp_micro_batch("worker.actor", a, factors, a.global_batch_size * n)


def divisors_hint(n: int) -> str:
    return ", ".join(str(k) for k in range(1, n + 1) if n % k == 0)
