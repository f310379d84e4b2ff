"""Keeping the rollout engines on the policy's weights, and proving it.

`WeightSync.sync` brings every engine to the policy's current weights after an update: a rollout
worker beside the policy pulls them from it (an engine sharing the policy's module only records the
version); rollout workers placed apart are sent the whole weights, gathered on the policy's rank 0 and
fetched from there by each rollout actor (not through the driver).

`worker.rollout.check_weight_sync` takes the log-probs of a fixed text probe under every engine and under
the policy after each sync and stops the run when they disagree: an engine left on stale weights would
make training off-policy without anyone knowing.
"""

from __future__ import annotations

from rlstack.errors import RLStackError
from rlstack.workers.policy import PolicyWorker
from rlstack.workers.rollout import RolloutWorker

PROBE_TEXT = "The weight-sync probe: 12 + 34 = 46."
"""Fixed text (no images, whatever the model) whose log-probs engine and policy compute."""


def sync_engines(policy: PolicyWorker, rollout: RolloutWorker, colocated: bool, version: int) -> int:
    """Bring the rollout engines to the policy's current weights (`version`): a rollout worker beside the
    policy (`colocated`) pulls them from it, rollout workers placed apart are sent the whole weights.
    Returns the bytes one engine received."""
    if colocated:
        return rollout.sync_weights(version)
    return rollout.update_weights(policy.gathered_weights(), version)


class WeightSync:
    def __init__(
        self,
        policy: PolicyWorker,
        rollout: RolloutWorker,
        colocated: bool,
        probe_ids: list[int],
        tolerance: float,
        engine_name: str,
    ):
        """`policy`, `rollout`: the workers' handles; `colocated`: the rollout workers live beside the
        policy, in its ranks (else they are placed apart); `probe_ids`: the tokens of `PROBE_TEXT`."""
        self.policy, self.rollout, self.colocated = policy, rollout, colocated
        self.probe = probe_ids[:8], probe_ids[8:]
        """The probe's first 8 tokens as the prompt, the rest as the tokens whose log-probs are compared."""
        self.tolerance, self.engine_name = tolerance, engine_name
        self.synced: list[float] | None = None
        """The policy's log-probs of the probe at the weights of the last sync (None: none checked yet)."""

    def sync(self, version: int) -> int:
        """Bring the rollout engines to the policy's current weights (`version` = the step). Returns the
        bytes one engine received."""
        return sync_engines(self.policy, self.rollout, self.colocated, version)

    def remember(self) -> None:
        """Before the first update: the probe's log-probs under the weights the engine has now."""
        if self.synced is None:
            self.synced = self.policy.probe_logprobs(*self.probe)

    def check(self, step: int) -> dict[str, float]:
        """The probe's log-probs under the engines and under the policy; fail loudly when they disagree: past
        the tolerance, or, below it, when an engine's log-probs of the probe are at least twice as close to
        the weights of the previous sync as to the policy's now (what an engine that kept the old weights
        does however little the update moved the probe; an engine in step with the policy differs from both
        by its own numerics alone). Differences below 1% of the tolerance are taken as equal."""
        engines = self.rollout.probe_logprobs(*self.probe)  # Dispatch.EACH: one list per rollout rank
        policy = self.policy.probe_logprobs(*self.probe)
        previous, self.synced = self.synced, policy
        now = [_max_diff(engine, policy) for engine in engines]
        metrics = {"rollout/weight_sync_max_diff": max(now)}
        stale = ""
        if not max(now) <= self.tolerance:
            stale = (
                f"differ from the policy's by up to {max(now):.3g} on a fixed probe "
                f"(worker.rollout.weight_sync_tolerance={self.tolerance})"
            )
        elif previous is not None:
            before = [_max_diff(engine, previous) for engine in engines]
            metrics["rollout/weight_sync_previous_diff"] = max(before)
            metrics["rollout/weight_sync_policy_moved"] = _max_diff(policy, previous)
            closer = [(n, b) for n, b in zip(now, before) if n > self.tolerance / 100 and 2 * b < n]
            if closer:
                n, b = closer[0]
                stale = (
                    f"are closer to the previous weights' (up to {b:.3g} apart) than to the policy's now "
                    f"(up to {n:.3g}) on a fixed probe"
                )
        if stale:
            raise RLStackError(
                f"after the weight sync of step {step}, the rollout engine's log-probs {stale}: the "
                f"{self.engine_name} engine is not sampling from the weights being trained. Training on its "
                "samples would be off-policy without anyone knowing; stopping instead"
            )
        return metrics


def _max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))
