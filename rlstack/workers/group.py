"""How the driver reaches the workers of one role: remote methods, worker groups and typed handles.

A worker method the driver may call declares it once, with `@remote(...)`: how its arguments are split
across the role's ranks and its results gathered, and which Batch columns it reads. Both backends
(`LocalWorkerGroup`: the worker in this process, the embedded default; `RayRoleGroup`: one Ray actor
per rank) read the same declaration, and a method without one cannot be called remotely. The trainer
holds `handle(group, PolicyWorker)`, which type checkers and editors see as the worker class itself,
and calls `self.policy.compute_logprobs(batch)`; a misspelled or undeclared method fails when the
handle is asked for it (and a test checks every call the driver makes).

Dispatch modes:
- `Dispatch.ALL`: every rank runs the method with the same arguments (weights, checkpoints, a
  collective every rank must join); the result is rank 0's.
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

Only what a method reads crosses the border: a Batch argument is cut to the declared `reads`
columns before it is sent, and a method that adds columns to the Batch it was given sends back only
those (`Added`), which the driver adds to its own batch. With one rank every mode is a plain call, so
the loop does not change.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import torch

from rlstack.batch import Batch, columns_read_by
from rlstack.errors import RLStackError


class Dispatch(enum.Enum):
    ALL = "all"
    EACH = "each"
    ROWS = "rows"
    MINI_BATCHES = "mini_batches"


MODEL_INPUTS = columns_read_by("model")
"""The columns a forward pass over trajectories reads (token rows and, for vision models, each row's
image patches)."""


@dataclass(frozen=True)
class Remote:
    """A worker method's declaration (`@remote`)."""

    dispatch: Dispatch
    reads: frozenset[str] | None = None
    """The Batch columns the method reads, where present (None: all of them)."""
    stays_remote: bool = False
    """The result stays where it was made (a Ray object reference, rank 0's) until another group's call
    takes it as an argument and fetches it from there: weights go from the policy's ranks to rollout
    actors without passing through the driver. In-process it is the plain result."""


F = TypeVar("F", bound=Callable[..., Any])
W = TypeVar("W")


def remote(
    dispatch: Dispatch, reads: Iterable[str] | None = None, stays_remote: bool = False
) -> Callable[[F], F]:
    """Declare a worker method callable from the driver: how its arguments are split across ranks (see
    the module docstring) and, for a method given a Batch, the columns it reads."""
    declared = Remote(dispatch, None if reads is None else frozenset(reads), stays_remote)

    def mark(fn: F) -> F:
        fn.__remote__ = declared  # type: ignore[attr-defined]
        return fn

    return mark


class NotRemote(RLStackError, AttributeError):
    """A worker method the driver asked for has no `@remote` declaration (or does not exist)."""


def declaration(cls: type, method: str) -> Remote:
    """`cls.method`'s `@remote` declaration; `NotRemote` when it has none."""
    fn = getattr(cls, method, None)
    declared = getattr(fn, "__remote__", None)
    if not isinstance(declared, Remote):
        what = "has no method" if fn is None else "does not declare the remote method"
        raise NotRemote(
            f"{cls.__name__} {what} {method!r}: only methods declared with @remote(Dispatch...) can be called "
            f"from the driver (remote methods: {', '.join(remote_methods(cls)) or 'none'})"
        )
    return declared


def remote_methods(cls: type) -> list[str]:
    return sorted(
        n for n in dir(cls) if isinstance(getattr(getattr(cls, n, None), "__remote__", None), Remote)
    )


def outgoing(declared: Remote, args: tuple) -> tuple:
    """The arguments as sent: a Batch first argument cut to the columns the method reads."""
    if declared.reads is None or not args or not isinstance(args[0], Batch):
        return args
    batch = args[0]
    sent = Batch({k: v for k, v in batch.columns.items() if k in declared.reads}, batch.meta)
    return (sent, *args[1:])


class Added(dict):
    """The columns a worker method added to (or replaced in) the Batch it was given."""


def invoke(worker: Any, method: str, args: tuple, kwargs: dict) -> Any:
    """Run a declared method on the worker (where it lives). A method that adds columns to the Batch it
    was given returns only those (`Added`): the driver adds them to its own batch."""
    declaration(type(worker), method)
    given = args[0] if args and isinstance(args[0], Batch) else None
    before = {k: id(v) for k, v in given.columns.items()} if given is not None else {}
    result = getattr(worker, method)(*args, **kwargs)
    if given is not None and result is given:
        return Added({k: v for k, v in result.columns.items() if before.get(k) != id(v)})
    return result


def incoming(result: Any, args: tuple) -> Any:
    """The driver's result: added columns go into the driver's own batch, which is returned."""
    if isinstance(result, Added):
        return args[0].update(result)
    return result


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
    cls: type
    """The class of the role's workers, whose `@remote` declarations the group follows."""

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run `method` on the workers, split and gathered as the method declares (`@remote`)."""
        ...


class LocalWorkerGroup:
    """One worker, in-process."""

    world_size = 1

    def __init__(self, worker: Any):
        self.worker = worker
        self.cls = type(worker)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        declared = declaration(self.cls, method)
        result = incoming(invoke(self.worker, method, outgoing(declared, args), kwargs), args)
        return [result] if declared.dispatch is Dispatch.EACH else result


class Handle:
    """A worker group seen as its worker class: `handle.method(*args)` is `group.call("method", *args)`
    for the methods the class declares `@remote` (anything else raises `NotRemote`)."""

    def __init__(self, group: WorkerGroup):
        self._group = group

    @property
    def world_size(self) -> int:
        return self._group.world_size

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("__"):
            raise AttributeError(method)
        declaration(self._group.cls, method)
        return functools.partial(self._group.call, method)

    def __repr__(self) -> str:
        return f"<{self._group.cls.__name__} x {self._group.world_size}>"


def handle(group: WorkerGroup, cls: type[W]) -> W:
    """The typed handle of `group`, whose workers are `cls` (or a subclass): type checkers and editors
    follow `handle.method(...)` to `cls.method`. An `EACH` method returns a list, one result per rank."""
    if not issubclass(group.cls, cls):
        raise TypeError(f"the group's workers are {group.cls.__name__}, not {cls.__name__}")
    return cast(W, Handle(group))
