"""Asynchronous GRPO's rollout producer: generation and scoring overlap with training, with bounded
staleness (`algorithm.async_grpo`, NeMo RL's async GRPO).

A thread of the driver collects the batch of every step in order (the same prompts, seeds, dynamic
sampling and scoring as the synchronous loop: `Collector.collect`) and hands it to the trainer through a
buffer. Every trajectory carries the weight version that generated it (`weight_version`: the number
of training steps behind the engine's weights). With `max_trajectory_age_steps` = a, step j's batch is
generated with exactly version j - 1 - a (the initial weights for the first a steps): the trainer,
whose policy is at version j - 1 before step j's update, trains on trajectories exactly a steps old.

Without in-flight weight updates the schedule is fixed, not a race: the producer starts step j's batch once the engine holds version
j - 1 - a, and the trainer pushes version k to the engine only once the batches that need older
weights (up to step k + a) are done. So with a = 1, step k + 1's batch is generated while step k
trains, and a seeded run gives the same metrics however fast either side is (a checkpoint's buffer
is restored and the run continues identically). With a = 0 the producer waits for every update: the
synchronous loop, exactly.

Weights reach the engine at step boundaries, under the rollout worker's lock (never in the middle of a
generation call). The engine has its own copy of the model (it cannot share the module the trainer
updates meanwhile).

With in-flight weight updates (`in_flight_weight_updates`, NeMo RL's name) the trainer pushes version k
as soon as it is made, without waiting for the batches that need older weights: the engine lands it
between two decoding steps of the generation in progress. Admission is unchanged (step j's batch
starts once the engine holds version j - 1 - a at least), so no trajectory is older than a; most are
fresher, by how much depends on timing, and the run is no longer reproducible bit for bit. A
trajectory's `weight_version` is the version its generation began with.

An exception in the producer is raised in the trainer, with its cause, at the trainer's next request.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from rlstack.batch import Batch
from rlstack.errors import RLStackError

# collect(step) -> (batch, metrics, timing) of that step's rollout
Collect = Callable[[int], tuple[Batch, dict[str, float], dict[str, float]]]
# (step, batch, metrics, timing)
Produced = tuple[int, Batch, dict[str, float], dict[str, float]]


class ProducerFailed(RLStackError):
    """The rollout producer raised; the cause is chained."""


class RolloutProducer:
    def __init__(
        self,
        collect: Collect,
        max_age: int,
        first_step: int,
        last_step: int,
        version: int,
        buffered: list[Produced] | None = None,
    ):
        """Produces the batches of steps `first_step`..`last_step`; the engine holds weight `version`.
        `buffered`: batches already produced (from a checkpoint), for the steps from `first_step` on."""
        self.collect, self.max_age = collect, max_age
        self.ready: deque[Produced] = deque(buffered or [])
        self.next_step, self.last_step = first_step + len(self.ready), last_step
        self.version = version
        self.error: BaseException | None = None
        self.stopping = False
        self.pausing = False
        self.busy = False
        self.threads = torch.get_num_threads()
        """The trainer's torch threads: a new thread starts with OpenMP's default, and another thread count
        would round the engine's floating-point sums differently than the synchronous loop does."""
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def start(self) -> RolloutProducer:
        self.thread.start()
        return self

    # ------------------------------------------------------------------------------- trainer side

    def get(self, step: int) -> tuple[Batch, dict[str, float], dict[str, float], float]:
        """Step `step`'s batch, its rollout metrics and timings, and the seconds waited for it."""
        began = time.perf_counter()
        with self.cond:
            self.cond.wait_for(lambda: self.ready or self.error is not None)
            if self.error is not None and not self.ready:
                raise ProducerFailed(f"the rollout producer failed: {self.error}") from self.error
            produced, batch, metrics, timing = self.ready.popleft()
            self.cond.notify_all()
        assert produced == step, (produced, step)
        return batch, metrics, timing, time.perf_counter() - began

    def wait_produced(self, step: int) -> float:
        """Wait until the batches up to step `step` are produced (those that need weights older than the
        trainer is about to push); returns the seconds waited."""
        began = time.perf_counter()
        with self.cond:
            self.cond.wait_for(lambda: self.next_step > min(step, self.last_step) or self.error is not None)
            if self.error is not None:
                raise ProducerFailed(f"the rollout producer failed: {self.error}") from self.error
        return time.perf_counter() - began

    @contextmanager
    def paused(self) -> Iterator[list[Produced]]:
        """The buffer, with the producer held between two batches (what a checkpoint saves)."""
        with self.cond:
            self.pausing = True
            self.cond.wait_for(lambda: not self.busy or self.error is not None)
            snapshot = list(self.ready)
        try:
            yield snapshot
        finally:
            with self.cond:
                self.pausing = False
                self.cond.notify_all()

    def synced(self, version: int) -> None:
        """The engine now holds weight `version`."""
        with self.cond:
            self.version = version
            self.cond.notify_all()

    def buffered(self) -> int:
        with self.cond:
            return len(self.ready)

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join()

    # ------------------------------------------------------------------------------ producer side

    def _admitted(self) -> bool:
        return self.stopping or (not self.pausing and self.version >= self.next_step - 1 - self.max_age)

    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        try:
            while self.next_step <= self.last_step:
                waited = time.perf_counter()
                with self.cond:
                    self.cond.wait_for(self._admitted)
                    if self.stopping:
                        return
                    self.busy = True
                waited = time.perf_counter() - waited
                try:
                    batch, metrics, timing = self.collect(self.next_step)
                finally:
                    with self.cond:
                        self.busy = False
                        self.cond.notify_all()
                timing["wait_train"] = waited
                with self.cond:
                    self.ready.append((self.next_step, batch, metrics, timing))
                    self.next_step += 1
                    self.cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the trainer, which raises it
            with self.cond:
                self.error = e
                self.cond.notify_all()


def staleness(batch: Batch, step: int) -> dict[str, Any]:
    """How many training steps (weight versions) behind the policy (version step - 1 before step `step`'s update) each
    trajectory's weights were (the oldest weights that sampled any of its tokens), and the share of
    trajectories that an in-flight weight update reached during their generation."""
    lag = (step - 1) - batch["weight_version"]
    last = batch["weight_version_last"] if "weight_version_last" in batch else batch["weight_version"]
    return {
        "async/staleness/mean": float(lag.float().mean()),
        "async/staleness/max": float(lag.max()),
        "async/in_flight_rows": float((last > batch["weight_version"]).float().mean()),
    }
