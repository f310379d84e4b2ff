"""Data parallelism within a role: the ranks' process group, FSDP2 sharding, and the reductions that
keep a training step's gradient independent of the number of ranks.

A worker runs as one rank of a `torch.distributed` process group when its worker group starts it
so (`init_process_group`: gloo on CPU, NCCL on GPU); otherwise it is rank 0 of a world of one, and
every function here is a no-op (the embedded default). With more than one rank:

- models are sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`): each transformer block
  (the model's `_no_split_modules`) is a unit, then the whole model;
- a mini-batch's rows are split across ranks, and its loss normalisers (token and sequence counts)
  are totals over all ranks (`MiniBatchTotals`), so each rank's loss is its share of the
  mini-batch's loss. FSDP2 averages gradients over ranks, so the loss is scaled by the world size
  before `backward`: the summed gradient is the one-process gradient;
- decisions that end a step (a non-finite loss, gradient norm or weight) are taken together
  (`all_ranks`): one rank raising while the others wait in a collective would be a hang.

Sequence parallelism (`worker.actor.ulysses_size`, `rlstack.models.ulysses`) groups consecutive ranks
(`sequence_group`): the ranks of a group hold the same rows and split each packed sequence between them.
Counts and metrics summed over ranks then take one rank per group (`data_parallel_sum`); gradients need
nothing more: each rank's gradient is that of its slice of the sequence, and the slices add up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from rlstack.models.vision import is_vision_model, run_vision_tower_in_every_pass


@dataclass(frozen=True)
class Rank:
    """Where this process is in its role's data-parallel group."""

    rank: int = 0
    world_size: int = 1


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int, device: str) -> None:
    """Join the group of `world_size` ranks (gloo on CPU; on CUDA NCCL for GPU tensors and gloo for host
    tensors, which FSDP2's CPU offload reduces) as `rank`."""
    os.environ.update(
        MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    backend = "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world_size)


_ALONE = False
"""This process's models are FSDP2-sharded over a group of one (`alone_group`)."""
_MADE_GROUP = False
"""`alone_group` started the process group (a one-process run), so `close_alone_group` ends it."""
_GROUP_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
_SAVED_ENV: dict[str, str | None] = {}


def alone_group(device: str) -> None:
    """FSDP2 over this process alone, what its CPU offload (`worker.actor.fsdp.offload_params`) needs on one
    rank: a Ray rank of a world of one has its group already; a one-process run gets a group of itself."""
    global _ALONE, _MADE_GROUP
    if dist.is_initialized():
        _ALONE = dist.get_world_size() == 1
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if device == "cuda":  # torch.cuda.set_device needs an index
        device = f"cuda:{torch.cuda.current_device()}"
    _SAVED_ENV.update({k: os.environ.get(k) for k in _GROUP_ENV})
    init_process_group(0, 1, "127.0.0.1", port, device)
    _ALONE = _MADE_GROUP = True


def close_alone_group() -> None:
    """End the group `alone_group` started (at the end of a one-process run)."""
    global _ALONE, _MADE_GROUP
    if _MADE_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    if _MADE_GROUP:  # the environment init_process_group set, as it was
        for k, v in _SAVED_ENV.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _SAVED_ENV.clear()
    _ALONE = _MADE_GROUP = False


def current() -> Rank:
    if dist.is_available() and dist.is_initialized():
        return Rank(dist.get_rank(), dist.get_world_size())
    return Rank()


def sharded() -> bool:
    """Whether models are FSDP2-sharded: this process is one of several ranks, or a group of its own
    (`alone_group`, for CPU offload)."""
    return current().world_size > 1 or _ALONE


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over the ranks (a new tensor; `t` itself with one rank)."""
    if not sharded():
        return t
    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def gather_objects(obj: object) -> list:
    """Every rank's `obj` (picklable), by rank. Every rank must call it."""
    if not sharded():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_ranks(flag: bool) -> list[int]:
    """The ranks where `flag` is False (empty: it holds on every rank). Every rank must call it."""
    return [r for r, f in enumerate(gather_objects(bool(flag))) if not f]


_SEQUENCE_GROUPS: dict[int, dist.ProcessGroup] = {}
"""This rank's sequence-parallel group, by group size (made once: making groups is a collective)."""


def sequence_group(size: int) -> dist.ProcessGroup | None:
    """This rank's sequence-parallel group of `size` consecutive ranks (`[0, size)`, `[size, 2 size)`, ...);
    None for `size` 1. Every rank must make the first call with the same `size`."""
    if size == 1:
        return None
    if size not in _SEQUENCE_GROUPS:
        world = current().world_size
        if world % size:
            raise ValueError(
                f"sequence parallelism over {size} ranks needs a multiple of {size} ranks, got {world}"
            )
        _SEQUENCE_GROUPS[size], _ = dist.new_subgroups(group_size=size)
    return _SEQUENCE_GROUPS[size]


def data_parallel_sum(t: torch.Tensor, sequence_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """`t` summed over the ranks, one rank per `sequence_group` (whose ranks hold the same rows: only its first
    counts); without one, `all_reduce_sum`."""
    first = sequence_group is None or dist.get_rank(sequence_group) == 0
    return all_reduce_sum(t if first else torch.zeros_like(t))


@dataclass(frozen=True)
class MiniBatchTotals:
    """Counts of a whole mini-batch, over all ranks: what each micro-batch's loss is divided by."""

    tokens: torch.Tensor
    """Sampled tokens, `response_mask.sum()`."""
    sequences: torch.Tensor
    """Rows with at least one sampled token."""
    computed_tokens: torch.Tensor
    """The sampled tokens of the rows that take a pass: `tokens`, unless rows are left out
    (`worker.actor.skip_zero_advantage`). Token-mean metrics are over them."""

    @classmethod
    def of(
        cls, response_mask: torch.Tensor, sequence_group: dist.ProcessGroup | None = None
    ) -> MiniBatchTotals:
        """The totals of the mini-batch whose rows on this rank have `response_mask` (the same on every rank of
        its `sequence_group`, which counts them once)."""
        local = torch.stack([response_mask.sum(), (response_mask.sum(-1) > 0).sum()]).long().cpu()
        tokens, sequences = data_parallel_sum(local, sequence_group)
        return cls(tokens, sequences, tokens)

    def computing(
        self, response_mask: torch.Tensor, sequence_group: dist.ProcessGroup | None = None
    ) -> MiniBatchTotals:
        """These totals, with only the rows of `response_mask` (on this rank) taking a pass."""
        computed = data_parallel_sum(response_mask.sum().long().cpu().reshape(1), sequence_group)[0]
        return replace(self, computed_tokens=computed)


def shard_model(
    model: torch.nn.Module, device: str, param_dtype: str | None = None, offload: bool = False
) -> torch.nn.Module:
    """FSDP2 over the current group: every transformer block (`_no_split_modules`), then the model.
    `param_dtype` (e.g. bfloat16) is the compute dtype of parameters in forward/backward (gradients are
    reduced in float32); None computes in the parameters' own dtype. `offload`: FSDP2's CPU offload, the
    sharded parameters, their gradients and so the optimizer's state and step live in host memory, each
    block's parameters are copied to the device for its forward and backward.

    A trained model loaded in bfloat16 / float16 is sharded in float32 and computes in its own dtype
    (mixed precision): AdamW's steps at RL learning rates are far below bfloat16's spacing and would
    round away on bfloat16 shards (`training.MasterAdamW` does the same for one process)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    low = {p.dtype for p in model.parameters() if p.requires_grad} & {torch.bfloat16, torch.float16}
    if low:
        param_dtype = param_dtype or str(low.pop()).removeprefix("torch.")
        model.float()

    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(
        param_dtype=getattr(torch, param_dtype) if param_dtype else None,
        reduce_dtype=torch.float32 if param_dtype else None,
    )
    blocks = set(getattr(model, "_no_split_modules", None) or [])
    units = [m for m in model.modules() if type(m).__name__ in blocks]
    if not units:
        raise ValueError(
            f"{type(model).__name__} names no transformer block class (`_no_split_modules`) to shard with FSDP2"
        )
    policy = CPUOffloadPolicy(pin_memory=device.startswith("cuda")) if offload else OffloadPolicy()
    for m in units:
        fully_shard(m, mesh=mesh, mp_policy=mp, offload_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=policy)
    if is_vision_model(model):  # a rank without images must still make the vision blocks' collectives
        run_vision_tower_in_every_pass(model)
    return model


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly FSDP2-sharded) parameter or value."""
    return t.to_local() if hasattr(t, "to_local") else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly sharded) parameter or value; a collective when sharded."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


BUCKET_BYTES = 256 * 2**20


def full_state_dict(
    model: torch.nn.Module, bucket_bytes: int = BUCKET_BYTES
) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's whole tensors under their Hugging Face names, in order. Sharded tensors are gathered
    in buckets of about `bucket_bytes` of shards (one collective per bucket and dtype rather than per
    tensor), so every rank must iterate to the end."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in model.state_dict().items():
        if not _dim0_sharded(t):
            yield from _gathered(bucket)
            bucket, size = [], 0
            yield name, full(t).detach()
            continue
        if bucket and (t.dtype != bucket[0][1].dtype or size >= bucket_bytes):
            yield from _gathered(bucket)
            bucket, size = [], 0
        bucket.append((name, t))
        size += local(t).numel() * t.element_size()
    yield from _gathered(bucket)


def _dim0_sharded(t: torch.Tensor) -> bool:
    """An FSDP2 parameter: a DTensor sharded on dim 0 over a 1-D mesh."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(t, DTensor) and t.device_mesh.ndim == 1 and tuple(t.placements) == (Shard(0),)


def _gathered(bucket: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Whole tensors of a bucket of dim-0 shards (same dtype) from one all-gather. Rank r holds rows
    [r * c, (r + 1) * c) of each tensor, c = ceil(rows / world) (fewer at the end): each shard is padded to
    c rows, the padded shards are gathered side by side, and each tensor is cut back out."""
    if not bucket:
        return
    world = dist.get_world_size()
    pieces, chunks = [], []
    for _, t in bucket:
        rows = t.shape[0]
        chunk = -(-rows // world)
        row_size = t.numel() // rows if rows else 0
        shard = local(t).detach().reshape(-1)
        padded = torch.zeros(chunk * row_size, dtype=t.dtype, device=shard.device)
        padded[: shard.numel()] = shard
        pieces.append(padded)
        chunks.append(chunk)
    flat = torch.cat(pieces)
    out = torch.empty(world * flat.numel(), dtype=flat.dtype, device=flat.device)
    dist.all_gather_into_tensor(out, flat)
    out = out.view(world, -1)
    offset = 0
    for (name, t), piece, chunk in zip(bucket, pieces, chunks):
        n = piece.numel()
        whole = out[:, offset : offset + n].reshape(world * chunk, *t.shape[1:])[: t.shape[0]]
        offset += n
        yield name, whole


def save_pretrained(model: torch.nn.Module, path) -> bool:
    """`model.save_pretrained(path)` of the whole weights (gathered from the shards on every rank; rank 0
    writes). Returns whether this rank wrote."""
    weights = dict(full_state_dict(model)) if sharded() else None
    if current().rank != 0:
        return False
    model.save_pretrained(path, state_dict=weights)
    return True


def save_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path) -> None:
    """Model and optimizer state with `torch.distributed.checkpoint`: every rank writes its shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=path)


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path) -> None:
    """What `save_sharded` wrote, on any number of ranks, resharded onto this run's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
