"""WorkerGroup: how the driver reaches the workers of one role.

The trainer calls `group.call(method, *args)` and never holds a model. `LocalWorkerGroup` runs a
single worker in this process (the embedded default). A data-parallel group (`RayWorkerGroup`,
one Ray actor per rank) implements the same interface; each worker method declares with
`@dispatch(...)` how its arguments are split across the ranks and its results gathered:

- `Dispatch.ALL` (the default): every rank runs the method with the same arguments (weights,
  checkpoints, a collective every rank must join); the result is rank 0's.
- `Dispatch.EACH`: like ALL, but the result is the list of every rank's results, by rank (what
  differs per rank: each rank's rollout engine).
- `Dispatch.ROWS`: the first argument is a Batch whose rows are split into equal parts, one per
  rank (padded with copies of its last row up to a multiple of the world size); the parts' Batch
  results are concatenated in order with the padding's rows dropped (a method that returns k rows
  per input row, as generation returns `n` per prompt, drops k per padding row).
- `Dispatch.MINI_BATCHES`: `update(batch, mini_batch_size)`: every rank gets its part of each
  mini-batch, in order, and the per-rank mini-batch size (`split_mini_batches`); padding rows have
  an all-zero `response_mask`, so they add nothing to a loss or its normalisers. The result (metrics,
  already reduced over ranks by the workers) is rank 0's.

With one rank every mode is a plain call, so the loop does not change.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

from rlstack.batch import Batch


class Dispatch(enum.Enum):
    ALL = "all"
    EACH = "each"
    ROWS = "rows"
    MINI_BATCHES = "mini_batches"


F = TypeVar("F", bound=Callable[..., Any])


def dispatch(mode: Dispatch) -> Callable[[F], F]:
    """Declare how a worker method's arguments are split across ranks (see the module docstring)."""

    def mark(fn: F) -> F:
        fn.dispatch = mode  # type: ignore[attr-defined]
        return fn

    return mark


def dispatch_mode(worker: Any, method: str) -> Dispatch:
    fn = getattr(type(worker) if not isinstance(worker, type) else worker, method)
    return getattr(fn, "dispatch", Dispatch.ALL)


def split_rows(batch: Batch, world_size: int) -> tuple[list[Batch], int]:
    """`batch` in `world_size` equal parts, in order, padded with copies of its last row; and the
    number of padding rows (dropped from the gathered results)."""
    n = len(batch)
    per_rank = -(-n // world_size)
    padding = per_rank * world_size - n
    index = list(range(n)) + [n - 1] * padding
    return [batch.select(index[r * per_rank : (r + 1) * per_rank]) for r in range(world_size)], padding


def split_mini_batches(batch: Batch, mini_batch_size: int, world_size: int) -> tuple[list[Batch], int]:
    """Each rank's rows of every mini-batch of `mini_batch_size` rows, in order, and the per-rank
    mini-batch size. A mini-batch that does not divide into `world_size` equal parts is padded with
    rows whose `response_mask` is all zero."""
    per_rank = -(-mini_batch_size // world_size)
    parts: list[list[Batch]] = [[] for _ in range(world_size)]
    for mb in batch.split(mini_batch_size):
        size = -(-len(mb) // world_size)
        padding = size * world_size - len(mb)
        if padding:
            pad = mb.select([len(mb) - 1] * padding)
            pad["response_mask"] = torch.zeros_like(pad["response_mask"])
            mb = Batch.concat([mb, pad])
        for r in range(world_size):
            parts[r].append(mb.select(slice(r * size, (r + 1) * size)))
    return [Batch.concat(p) for p in parts], per_rank


def gather_rows(results: list[Batch], padding: int, rows_in: int) -> Batch:
    """The ranks' results in order, without the rows made from the `padding` rows of the `rows_in`
    (padded) rows that were split."""
    out = Batch.concat(results)
    drop = padding * (len(out) // rows_in)
    return out.select(slice(0, len(out) - drop)) if drop else out


class WorkerGroup(Protocol):
    world_size: int

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run `method` on the workers, split and gathered as the method declares (`@dispatch`)."""
        ...


class LocalWorkerGroup:
    """One worker, in-process."""

    world_size = 1

    def __init__(self, worker: Any):
        self.worker = worker

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.worker, method)(*args, **kwargs)
        return [result] if dispatch_mode(self.worker, method) is Dispatch.EACH else result
