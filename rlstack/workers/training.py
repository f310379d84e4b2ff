"""What the actor and the critic share: the optimizer and schedule, and the loop of optimizer steps.

`optimizer_steps` cuts a batch into mini-batches (one optimizer step each, for `epochs` passes)
and each mini-batch into micro-batches (gradient accumulation). `micro_loss` receives the
micro-batch and its mini-batch, and normalizes by the mini-batch's token or sequence count, so
accumulation does not change the gradient. A NaN or infinite loss, gradient norm or weight raises
`TrainingDiverged` before anything is applied or saved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

from rlstack.batch import Batch
from rlstack.config import OptimConfig
from rlstack.errors import TrainingDiverged

# micro_loss(micro_batch, mini_batch) -> (loss, {metric: contribution summed over the mini-batch}); the loss
# is normalized by the mini-batch (its tokens or sequences), so micro-batch losses add up to its loss.
MicroLoss = Callable[[Batch, Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def build_optimizer(model: torch.nn.Module, o: OptimConfig, total_steps: int):
    trainable = [p for p in model.parameters() if p.requires_grad]  # a frozen vision tower stays out
    optimizer = torch.optim.AdamW(trainable, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    warmup = o.lr_warmup_steps if o.lr_warmup_steps is not None else int(o.lr_warmup_ratio * total_steps)
    if o.lr_scheduler_type == "cosine":
        scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, warmup, total_steps, min_lr_rate=o.min_lr_ratio
        )
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer, warmup)
    return optimizer, scheduler


def optimizer_steps(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: Batch,
    micro_loss: MicroLoss,
    mini_batch_size: int,
    micro_batch_size: int,
    epochs: int,
    max_grad_norm: float,
    role: str,
    shuffle_seed: int | None = None,
) -> dict[str, float]:
    """Run the optimizer steps of one training step; returns metrics averaged over them, plus `<role>/lr`."""
    step = scheduler.last_epoch + 1
    model.train()
    sums: dict[str, float] = defaultdict(float)
    n_steps = 0
    for epoch in range(epochs):
        order = batch
        if shuffle_seed is not None:
            g = torch.Generator().manual_seed(shuffle_seed * 1_000_003 + step * 101 + epoch)
            order = batch.select(torch.randperm(len(batch), generator=g))
        for mb in order.split(mini_batch_size):
            for micro in mb.split(micro_batch_size):
                loss, stats = micro_loss(micro, mb)
                if not torch.isfinite(loss):
                    optimizer.zero_grad(set_to_none=True)
                    raise TrainingDiverged(f"the {role} loss became {loss.item()} at step {step}")
                loss.backward()
                for k, v in stats.items():
                    sums[k] += float(v)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            if not torch.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                raise TrainingDiverged(f"the {role} gradient norm became {grad_norm.item()} at step {step}")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if not bool(torch.stack([p.isfinite().all() for p in model.parameters()]).all()):
                raise TrainingDiverged(f"the {role} optimizer step made weights non-finite at step {step}")
            sums[f"{role}/grad_norm"] += float(grad_norm)
            n_steps += 1
    metrics = {k: v / n_steps for k, v in sums.items()}
    metrics[f"{role}/lr"] = scheduler.get_last_lr()[0]
    scheduler.step()
    return metrics
