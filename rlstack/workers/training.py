"""What the actor and the critic share: the optimizer and schedule, and the loop of optimizer steps.

`optimizer_steps` cuts a batch into mini-batches (one optimizer step each, for `epochs` passes)
and each mini-batch into micro-batches (gradient accumulation). `micro_loss` receives the
micro-batch and the totals of its mini-batch (over all data-parallel ranks, `MiniBatchTotals`), and
normalizes by the mini-batch's token or sequence count, so neither accumulation nor the number of
ranks changes the gradient. A NaN or infinite loss, gradient norm or weight raises
`TrainingDiverged` before anything is applied or saved, on every rank at once.

With several ranks (`distributed.sharded()`), each rank's `batch` holds its rows of every
mini-batch, in order: local mini-batch i is this rank's part of global mini-batch i
(`mini_batch_size` is then the per-rank size). Metrics are summed over ranks (one per sequence-parallel
group, whose ranks hold the same rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

from rlstack.batch import Batch, token_budget_groups
from rlstack.config import OptimConfig
from rlstack.errors import OutOfMemory, TrainingDiverged
from rlstack.models.vision import BlankImages
from rlstack.workers import distributed
from rlstack.workers.distributed import MiniBatchTotals
from rlstack.workers.memory import device_memory_in_use

# micro_loss(micro_batch, mini_batch_totals) -> (loss, {metric: contribution summed over the mini-batch}); the
# loss is normalized by the mini-batch (its tokens or sequences), so micro-batch losses add up to its loss.
MicroLoss = Callable[[Batch, MiniBatchTotals], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class MicroBatching:
    """How a batch is cut into forward/backward passes: `rows` trajectories each, or with `max_tokens`
    (dynamic batching, veRL's `use_dynamic_bsz`) groups of rows holding at most that many attended tokens
    each. Neither changes the gradient: losses are normalized by the mini-batch (`MiniBatchTotals`)."""

    rows: int
    max_tokens: int | None = None
    section: str = ""
    """The config section whose keys set it (`worker.actor`, `worker.ref`, `worker.critic`), for messages."""
    phase: str = ""
    """`update` or `experience`: which of the section's keys."""

    @classmethod
    def of(cls, rows: int, budget: int, dynamic: bool, section: str, phase: str) -> MicroBatching:
        """`rows` per micro-batch, or with `dynamic` (dynamic batching) the token `budget`: the `phase` keys of
        config `section` (`<section>.micro_batch_size_per_device_for_<phase>`, `...max_token_len...`)."""
        return cls(rows, budget if dynamic else None, section, phase)

    @property
    def key(self) -> str:
        """The config key of the token budget."""
        return f"{self.section}.max_token_len_per_device_for_{self.phase}" if self.section else ""

    @property
    def rows_key(self) -> str:
        """The config key of the row count."""
        return f"{self.section}.micro_batch_size_per_device_for_{self.phase}" if self.section else ""

    @contextmanager
    def out_of_memory_named(self, micro: Batch, what: str, backward: bool = False) -> Iterator[None]:
        """Turn a device's out-of-memory error in the pass over `micro` (with a `backward` pass: an update)
        into `OutOfMemory` naming the pass, its size, the device's memory and the settings to lower."""
        try:
            yield
        except torch.OutOfMemoryError as e:
            attended = micro["attention_mask"].sum(-1)
            size = (
                f"{len(micro)} trajectories of up to {int(attended.max())} tokens "
                f"({int(attended.sum())} attended, padded to {micro['attention_mask'].shape[1]} columns)"
            )
            role = (
                "worker.critic" if self.section == "worker.critic" else "worker.actor"
            )  # the reference: the actor's
            if self.max_tokens is not None and self.key:
                knob = f"lower {self.key}={self.max_tokens} (the tokens of a micro-batch)"
            elif self.rows_key:
                knob = f"lower {self.rows_key}={self.rows} (or set {role}.dynamic_batching=true with a token budget)"
            else:
                knob = "shorten the trajectories"
            others = [f"bfloat16 weights ({role}.model.dtype)"]
            if role == "worker.actor":
                others.insert(0, "worker.actor.fsdp.offload_params=true")
                if backward:
                    others.insert(0, "worker.actor.model.enable_gradient_checkpointing=true")
            logits = (
                "; a policy's pass also makes logits of rows x positions x vocabulary"
                if role != "worker.critic"
                else ""
            )
            raise OutOfMemory(
                f"out of memory in the {what} of a micro-batch of {size}{device_memory_in_use()}: {knob}. Other ways "
                f"to fit: {', '.join(others)}{logits}. The device said: {str(e).splitlines()[0]}"
            ) from e

    def split(self, batch: Batch) -> list[tuple[list[int], Batch]]:
        """(row indices, rows) of each micro-batch, every row in one. With several ranks each gets as
        many micro-batches as the rank that needs the most (FSDP2 runs its collectives per pass)."""
        if self.max_tokens is None:
            return [
                (list(range(i, min(i + self.rows, len(batch)))), mb)
                for i, mb in zip(range(0, len(batch), self.rows), batch.split(self.rows))
            ]
        lengths = batch["attention_mask"].sum(-1).tolist()
        longest = max(lengths, default=0)
        if longest > self.max_tokens:
            raise ValueError(
                f"a trajectory of {longest} tokens does not fit in {self.key}={self.max_tokens}: raise it to at "
                "least data.max_prompt_length + data.max_response_length (agent trajectories: their whole length)"
            )
        groups = token_budget_groups(lengths, self.max_tokens)
        if distributed.current().world_size > 1:
            most = max(distributed.gather_objects(len(groups)))
            if most > len(groups):
                groups = token_budget_groups(lengths, self.max_tokens, min_groups=most)
        return [(g, batch.select(g)) for g in groups]

    def map(
        self, batch: Batch, fn: Callable[[Batch], torch.Tensor], what: str = "forward pass"
    ) -> torch.Tensor:
        """`fn` over the micro-batches, its `[rows, ...]` results put back in the batch's row order."""
        parts = self.split(batch)
        results = []
        for _, mb in parts:
            with self.out_of_memory_named(mb, what):
                results.append(fn(mb))
        out = torch.cat(results)
        order = torch.tensor([i for rows, _ in parts for i in rows])
        return out[torch.argsort(order)]


class BF16MomentsAdamW(torch.optim.Optimizer):
    """AdamW whose two moments are kept in bfloat16 (EasyR1's `optim.strategy: adamw_bf16`): 4 bytes of
    state a parameter instead of 8. Each step computes in float32 (the moments read up, updated with the
    gradient, the parameter stepped with them) and stores the moments rounded. The parameters stay as they
    are: float32 masters in one process (`MasterAdamW`), FSDP2's float32 shards on several ranks."""

    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float, eps: float = 1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                t = float(state["step"])
                g = p.grad.float()
                m = state["exp_avg"].float().mul_(b1).add_(g, alpha=1 - b1)
                v = state["exp_avg_sq"].float().mul_(b2).addcmul_(g, g, value=1 - b2)
                state["exp_avg"], state["exp_avg_sq"] = m.to(torch.bfloat16), v.to(torch.bfloat16)
                p.mul_(1 - lr * decay)
                denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(eps)
                p.addcdiv_(m.to(p.dtype), denom.to(p.dtype), value=-lr / (1 - b1**t))
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """Torch casts a loaded state to its parameter's dtype: the moments go back to bfloat16."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)


class _Masters:
    """Low-precision (bfloat16 / float16) parameters stepped through float32 master copies, as
    mixed-precision training keeps them: each step reads the parameters' gradients into the masters, steps
    the masters with the optimizer it is mixed into and writes them back rounded. Stepping bfloat16 weights
    directly loses the update: at RL learning rates (~1e-6) a step is far below bfloat16's spacing (about
    1e-4 for a weight of 0.02) and rounds away for all but the weights nearest zero. The masters are saved
    with the optimizer's state (resuming gives the same weights). For plain tensors; FSDP2's shards keep
    float32 storage instead (`distributed.shard_model`).

    The masters (twice the bfloat16 weights' memory) are made at the first step, save or load, not before:
    a policy that only generates and scores (`rlstack eval`, a val-only run) never holds them."""

    def __init__(self, params: list[torch.nn.Parameter], **kwargs):
        self.model_params = params
        self.has_masters = False
        super().__init__(params, **kwargs)  # the group's params become the masters when first needed

    @property
    @torch.no_grad()
    def masters(self) -> list[torch.Tensor]:
        group = self.param_groups[0]
        if not self.has_masters:
            group["params"] = [p.detach().float().clone() for p in self.model_params]
            self.has_masters = True
        return group["params"]

    @torch.no_grad()
    def step(self, closure=None):
        for p, m in zip(self.model_params, self.masters):
            m.grad = None if p.grad is None else p.grad.float()
        loss = super().step(closure)
        for p, m in zip(self.model_params, self.masters):
            p.copy_(m)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p in self.model_params:
            p.grad = None

    def state_dict(self) -> dict:
        masters = [m.detach().clone() for m in self.masters]
        return {**super().state_dict(), "master_weights": masters}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """The saved masters, or (a state without them) the parameters as they are now."""
        state = dict(state_dict)
        saved = state.pop("master_weights", None)
        self.masters  # noqa: B018 -- made first: the loaded state belongs to the masters, not the weights
        super().load_state_dict(state)
        for i, (p, m) in enumerate(zip(self.model_params, self.masters)):
            m.copy_(saved[i] if saved is not None else p.float())


class MasterAdamW(_Masters, torch.optim.AdamW):
    """torch's AdamW over float32 masters of low-precision parameters (`_Masters`)."""


class MasterBF16MomentsAdamW(_Masters, BF16MomentsAdamW):
    """`BF16MomentsAdamW` over float32 masters of low-precision parameters (`_Masters`)."""


def build_optimizer(model: torch.nn.Module, o: OptimConfig, total_steps: int):
    trainable = [p for p in model.parameters() if p.requires_grad]  # a frozen vision tower stays out
    kwargs = dict(lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    masters = any(p.dtype in (torch.bfloat16, torch.float16) for p in trainable) and not any(
        isinstance(p, DTensor) for p in trainable
    )
    optimizer: torch.optim.Optimizer
    if o.strategy == "adamw_bf16":
        optimizer = (MasterBF16MomentsAdamW if masters else BF16MomentsAdamW)(trainable, **kwargs)
    else:
        kwargs["fused"] = _fusable(trainable)
        optimizer = (MasterAdamW if masters else torch.optim.AdamW)(trainable, **kwargs)
    warmup = o.lr_warmup_steps if o.lr_warmup_steps is not None else int(o.lr_warmup_ratio * total_steps)
    if o.lr_scheduler_type == "cosine":
        scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, warmup, total_steps, min_lr_rate=o.min_lr_ratio
        )
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer, warmup)
    return optimizer, scheduler


def apply_optim_config(optimizer: torch.optim.Optimizer, scheduler, o: OptimConfig) -> None:
    """After a checkpoint's optimizer and scheduler states are loaded: the config's learning rate, betas and
    weight decay again (the states carry the saved run's), and the learning rate the config's schedule
    gives at the restored step, so that a resume trains with the settings it records."""
    for group in optimizer.param_groups:
        group.update(betas=tuple(o.betas), weight_decay=o.weight_decay, initial_lr=o.lr)
    scheduler.base_lrs = [o.lr] * len(optimizer.param_groups)
    for group, fn in zip(optimizer.param_groups, scheduler.lr_lambdas):
        group["lr"] = o.lr * fn(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _fusable(params: list[torch.nn.Parameter]) -> bool:
    """Whether AdamW can take one fused kernel over all parameters (what Hugging Face's Trainer uses by
    default): plain floating-point tensors on CPU or CUDA. FSDP2's sharded parameters (DTensors) take the
    default implementation."""
    return bool(params) and all(
        p.device.type in ("cpu", "cuda") and p.is_floating_point() and not isinstance(p, DTensor)
        for p in params
    )


def optimizer_steps(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: Batch,
    micro_loss: MicroLoss,
    mini_batch_size: int,
    micro_batching: MicroBatching,
    epochs: int,
    max_grad_norm: float,
    role: str,
    shuffle_seed: int | None = None,
    sequence_group: torch.distributed.ProcessGroup | None = None,
    takes_pass: Callable[[Batch], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Run the optimizer steps of one training step; returns metrics averaged over them, plus `<role>/lr`.
    `sequence_group`: the ranks that hold this rank's rows (sequence parallelism), counted once in the
    mini-batch totals and the metrics. `takes_pass`: which rows of a mini-batch [rows] need a forward and
    backward pass, the others' loss and gradient being 0 (`computed_rows`; `<role>/skipped_tokens`): the
    update is then the same up to rounding; None: every row."""
    step = scheduler.last_epoch + 1
    dp = distributed.current()
    blank = BlankImages.of(model)
    model.train()
    sums: dict[str, torch.Tensor] = {}
    grad_norms: list[float] = []
    skipped: list[float] = []  # per mini-batch, the share of its sampled tokens left out (over all ranks)
    for epoch in range(epochs):
        order = batch
        if (
            shuffle_seed is not None
        ):  # with several ranks, each shuffles its own rows (a sequence group alike)
            rows_of = dp.rank // (
                1 if sequence_group is None else torch.distributed.get_world_size(sequence_group)
            )
            g = torch.Generator().manual_seed(shuffle_seed * 1_000_003 + step * 101 + epoch + 7919 * rows_of)
            order = batch.select(torch.randperm(len(batch), generator=g))
        for mb in order.split(mini_batch_size):
            totals = MiniBatchTotals.of(mb["response_mask"], sequence_group)
            if takes_pass is not None:
                mb = computed_rows(mb, takes_pass(mb))
                totals = totals.computing(mb["response_mask"], sequence_group)
                skipped.append(1 - float(totals.computed_tokens) / max(1, float(totals.tokens)))
            bad_loss = None
            for _, micro in micro_batching.split(mb):
                micro = micro.trimmed()  # its own columns only: the mini-batch's longest row may be elsewhere
                with micro_batching.out_of_memory_named(micro, f"{role} update", backward=True):
                    loss, stats = micro_loss(micro, totals)
                    if not torch.isfinite(loss) and bad_loss is None:
                        bad_loss = loss.item()
                        if dp.world_size == 1:
                            break
                    # FSDP2 averages gradients over ranks; each rank's loss is its share of the sum.
                    (loss * dp.world_size if dp.world_size > 1 else loss).backward()
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v.detach().double().cpu()
            bad = [(r, v) for r, v in enumerate(distributed.gather_objects(bad_loss)) if v is not None]
            if bad:
                optimizer.zero_grad(set_to_none=True)
                ranks = [r for r, _ in bad]
                raise TrainingDiverged(f"the {role} loss became {bad[0][1]} at step {step}{_on(ranks, dp)}")
            if blank is not None:  # a sharded vision model: tower gradients of blank images only are not kept
                blank.step_done(any_rank_saw_images=len(distributed.all_ranks(not blank.saw_images)) > 0)
            grad_norm = distributed.full(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
            if not torch.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                raise TrainingDiverged(f"the {role} gradient norm became {grad_norm.item()} at step {step}")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            finite = bool(
                torch.stack([distributed.local(p).isfinite().all() for p in model.parameters()]).all()
            )
            ranks = distributed.all_ranks(finite)
            if ranks:
                raise TrainingDiverged(
                    f"the {role} optimizer step made weights non-finite at step {step}{_on(ranks, dp)}"
                )
            grad_norms.append(float(grad_norm))
    keys = sorted(sums)
    summed = (
        distributed.data_parallel_sum(torch.stack([sums[k] for k in keys]), sequence_group)
        if keys
        else torch.zeros(0)
    )
    metrics = {k: float(v) / len(grad_norms) for k, v in zip(keys, summed)}
    metrics[f"{role}/grad_norm"] = sum(grad_norms) / len(grad_norms)
    if skipped:
        metrics[f"{role}/skipped_tokens"] = sum(skipped) / len(skipped)
    metrics[f"{role}/lr"] = scheduler.get_last_lr()[0]
    scheduler.step()
    return metrics


def computed_rows(mb: Batch, takes_pass: torch.Tensor) -> Batch:
    """The rows of mini-batch `mb` that take a pass when `takes_pass` [rows] marks those that need one: the
    marked rows; then, where the mini-batch has images and no marked row does, one row with images (a
    vision tower's gradients are then zeros, as every row's pass leaves them, not missing); then the others,
    shortest first, up to the most rows any rank needs (FSDP2 runs its collectives per pass: every rank
    makes the same passes), and at least one row, so that the optimizer steps on zero gradients where a
    pass would have made them."""
    marked = takes_pass.bool()
    grids = mb.get("image_grid_thw")
    pictured = torch.tensor(
        [g is not None and len(g) > 0 for g in grids] if grids is not None else [False] * len(mb)
    )
    lend_image = bool(pictured.any()) and not bool((pictured & marked).any())
    keep = max(1, *distributed.gather_objects(int(marked.sum()) + lend_image))
    if keep >= len(mb):
        return mb
    order = mb["attention_mask"].sum(-1).double()  # the others: shortest first
    if lend_image:
        order[int(pictured.nonzero()[0])] = -1
    order[marked] = -2
    return mb.select(torch.argsort(order, stable=True)[:keep].sort().values)


def _on(ranks: list[int], dp: distributed.Rank) -> str:
    """Where it happened, when there are several ranks."""
    return f" (on rank {', '.join(map(str, ranks))} of {dp.world_size})" if dp.world_size > 1 else ""
