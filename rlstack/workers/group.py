"""WorkerGroup: how the driver reaches the workers of one role.

The trainer calls `group.call(method, *args)` and never holds a model. `LocalWorkerGroup` runs a
single worker in this process (the embedded default). A data-parallel group (Ray actors, one per
GPU) implements the same interface by splitting a Batch argument's rows across its workers,
concatenating Batch results and averaging metric dicts, so the loop does not change.
"""

from __future__ import annotations

from typing import Any, Protocol


class WorkerGroup(Protocol):
    world_size: int

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run `method` on the workers; a Batch result is all rows, a dict result is the mean over workers."""
        ...


class LocalWorkerGroup:
    """One worker, in-process."""

    world_size = 1

    def __init__(self, worker: Any):
        self.worker = worker

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)
