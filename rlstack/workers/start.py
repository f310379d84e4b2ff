"""Starting a run's workers: the role workers in this process, or (`trainer.backend=ray`) one Ray actor
per rank plus the reward actors; and the driver's typed handles on them."""

from __future__ import annotations

from dataclasses import dataclass

from rlstack.config import Config, resolve_device
from rlstack.plan import StepPlan
from rlstack.rewards.manager import RewardManager, Rewards
from rlstack.workers import distributed
from rlstack.workers.critic import CriticWorker
from rlstack.workers.group import LocalWorkerGroup, WorkerGroup, handle
from rlstack.workers.policy import PolicyWorker, RefWorker
from rlstack.workers.roles import build_roles, role_classes
from rlstack.workers.rollout import RolloutWorker


@dataclass
class Workers:
    groups: dict[str, WorkerGroup]
    """Each role's worker group, by role (`actor`, `rollout`, `ref`, `critic`)."""
    policy: PolicyWorker
    rollout: RolloutWorker
    ref: PolicyWorker | RefWorker | None
    """The reference model's handle (the policy's own with LoRA), where the plan has one."""
    critic: CriticWorker | None
    rewards: Rewards
    """The reward manager, or with Ray the reward actors (`RayRewards`)."""
    cluster: object | None
    """The Ray rank actors (`RayCluster`), or None in one process."""

    def close(self) -> None:
        """Close the reward workers and, with Ray, the actors of every rank."""
        try:
            self.rewards.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()
            distributed.close_alone_group()


def start_workers(cfg: Config, plan: StepPlan, total_steps: int) -> Workers:
    device = resolve_device(cfg.trainer.device)
    cluster = None
    if cfg.trainer.backend == "ray":
        from rlstack.workers.ray_group import RayCluster, RayRewards, reward_placement

        cluster = RayCluster(cfg, plan, total_steps, device)
        groups: dict[str, WorkerGroup] = {
            role: cluster.group(role, cls) for role, cls in role_classes(plan).items()
        }
        try:
            cpus, said = reward_placement(cluster, cfg.worker.reward.num_workers)
            if said:
                print(f"[rlstack] {said}", flush=True)
            if cpus > 0:  # scoring runs in CPU actors, off the training ranks
                rewards = RayRewards(cluster, cfg, cpus)
            else:
                rewards = RewardManager.of(
                    cfg.worker.reward, max_response_length=cfg.data.max_response_length
                )
        except BaseException:
            cluster.close()
            raise
    else:
        if cfg.worker.actor.fsdp.offload_params:  # FSDP2's CPU offload shards over a group of one
            distributed.alone_group(device)
        try:
            groups = {
                role: LocalWorkerGroup(w) for role, w in build_roles(cfg, plan, total_steps, device).items()
            }
            rewards = RewardManager.of(cfg.worker.reward, max_response_length=cfg.data.max_response_length)
        except BaseException:
            distributed.close_alone_group()
            raise
    return Workers(
        groups=groups,
        policy=handle(groups["actor"], PolicyWorker),
        rollout=handle(groups["rollout"], RolloutWorker),
        ref=handle(groups["ref"], groups["ref"].cls) if "ref" in groups else None,
        critic=handle(groups["critic"], CriticWorker) if "critic" in groups else None,
        rewards=rewards,
        cluster=cluster,
    )
