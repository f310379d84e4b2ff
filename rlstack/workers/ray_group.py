"""Ray worker groups (`trainer.backend=ray`): one Ray actor per rank, each holding its colocated role
workers (policy, rollout, reference, critic: EasyR1's hybrid engine), joined in one
`torch.distributed` process group (gloo on CPU, NCCL on GPU) so that the models are FSDP2-sharded
over the ranks (`workers/distributed.py`).

Ranks are placed with a placement group of one bundle per node (`trainer.nnodes`), each holding that
node's `trainer.n_gpus_per_node` ranks (a GPU and a CPU each, or a CPU on machines without GPUs), every
bundle on a different node; rank r is on node r // n_gpus_per_node. `RayRoleGroup` reaches one role
on every rank, splitting arguments and gathering results as each method declares (`@remote`,
`workers/group.py`). A rank that dies (killed, out of memory, a crash) ends the call with an error
that names the rank and its node instead of leaving the driver waiting.

`ray.init()` connects to the cluster of `ray start --head` / `ray start --address=...` when one runs
on this machine (or `RAY_ADDRESS` names one), and otherwise starts a local one.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any

import torch

from rlstack.batch import Batch
from rlstack.config import Config, RewardConfig
from rlstack.config.reward import functions_in_use, judge_endpoint
from rlstack.errors import RLStackError
from rlstack.plan import StepPlan
from rlstack.workers.group import (
    Added,
    Dispatch,
    declaration,
    gather_rows,
    incoming,
    invoke,
    outgoing,
    split_mini_batches,
    split_rows,
)
from rlstack.workers.rollout import RolloutWorker


class WorkerDied(RLStackError):
    """A rank of a worker group died during a call."""


class RankHost:
    """One rank: joins the process group, then builds and serves its role workers."""

    def __init__(self, rank: int, world_size: int, num_threads: int):
        self.rank, self.world_size, self.num_threads = rank, world_size, num_threads
        if num_threads > 0:
            torch.set_num_threads(num_threads)
        self.roles: dict[str, Any] = {}

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it (rank 0's are the process group's rendezvous)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def where(self) -> tuple[str, int, str]:
        """This rank's host, process id and Ray node id."""
        import ray

        return socket.gethostname(), os.getpid(), ray.get_runtime_context().get_node_id()

    def setup(
        self, master_addr: str, master_port: int, cfg: Config, plan: StepPlan, total_steps: int, device: str
    ) -> list[str]:
        from rlstack import checkpoint
        from rlstack.workers import distributed
        from rlstack.workers.roles import build_roles

        if device.startswith("cuda"):
            device = "cuda:0"  # Ray makes the rank's GPU the only visible one
        distributed.init_process_group(self.rank, self.world_size, master_addr, master_port, device)
        if cfg.worker.actor.fsdp.offload_params:  # one rank too: FSDP2 over its group of one
            distributed.alone_group(device)
        checkpoint.seed_everything(cfg.trainer.seed, cfg.trainer.full_determinism)
        self.roles = build_roles(cfg, plan, total_steps, device)
        return sorted(self.roles)

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """The role's declared method (`invoke`: only the columns it adds travel back). A result that stays
        remote is put in this rank's object store, and only its reference goes to the driver."""
        import ray

        # a threaded actor's call thread (in-flight weight updates) starts with OpenMP's default
        if self.num_threads > 0 and torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        result = invoke(self.roles[role], method, args, kwargs)
        return ray.put(result) if declaration(type(self.roles[role]), method).stays_remote else result

    def setup_rollout(self, cfg: Config, device: str) -> list[str]:
        """A rollout worker placed apart from the policy (no process group: it only generates)."""
        from rlstack import checkpoint

        if device.startswith("cuda"):
            device = "cuda:0"
        checkpoint.seed_everything(cfg.trainer.seed, cfg.trainer.full_determinism)
        w = cfg.worker
        self.roles = {
            "rollout": RolloutWorker(
                w.rollout,
                w.actor.model,
                cfg.data.max_response_length,
                None,
                device,
                self.rank,
                in_flight=cfg.algorithm.async_grpo.in_flight,
            )
        }
        return ["rollout"]

    def shutdown(self) -> None:
        import torch.distributed as dist

        self.roles.clear()
        if dist.is_initialized():
            dist.destroy_process_group()


class RayCluster:
    """The rank actors of one run and their placement group."""

    def __init__(self, cfg: Config, plan: StepPlan, total_steps: int, device: str):
        try:
            import ray
            from ray.util.placement_group import placement_group
        except ImportError as e:
            raise RLStackError("trainer.backend = ray needs Ray: pip install 'rlstack[ray]'") from e
        t = cfg.trainer
        self.world_size = t.nnodes * t.n_gpus_per_node
        self.ulysses_size = cfg.worker.actor.ulysses_size
        """Consecutive ranks that hold the same rows of the policy, reference and critic (sequence parallelism)."""
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            try:
                ray.init(address=address, log_to_driver=True)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise RLStackError(
                    f"trainer.backend = ray: could not reach the Ray cluster at RAY_ADDRESS={address!r} ({e}). "
                    "Start it (ray start --head; ray start --address=HEAD:6379 on the other nodes), or unset "
                    "RAY_ADDRESS to start a local one"
                ) from e
        gpu = device.startswith("cuda")
        per_node = t.n_gpus_per_node
        # One bundle per node holding its ranks' devices, each bundle on a different node.
        bundle = {"GPU": per_node, "CPU": per_node} if gpu else {"CPU": per_node}
        strategy = "STRICT_SPREAD" if t.nnodes > 1 else "STRICT_PACK"
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        self.pg = placement_group([bundle] * t.nnodes, strategy=strategy) if len(nodes) >= t.nnodes else None
        ready = self.pg is not None and ray.wait([self.pg.ready()], timeout=60)[0]
        if not ready:
            if self.pg is not None:
                ray.util.remove_placement_group(self.pg)
            raise RLStackError(
                f"trainer.nnodes={t.nnodes} x trainer.n_gpus_per_node={per_node}: {t.nnodes} node(s) with "
                f"{bundle} free each, but the Ray cluster has {len(nodes)} node(s) with "
                f"{[{k: n.get(k, 0) for k in bundle} for n in nodes]}: lower the ranks, or add nodes "
                "(ray start --address=...)"
            )
        self.env = actor_env(cfg)
        self.hosts = _place_hosts(self.pg, self.world_size, per_node, gpu, t.num_threads, self.env)
        self.where: list[tuple[str, int, str]] = []
        self.extra_actors: list = []
        """Actors beside the ranks (reward workers), ended with them."""
        self.rollout_hosts = []
        """Rollout workers placed apart from the policy (`worker.rollout.colocated=false`)."""
        try:
            self.where = self.get([h.where.remote() for h in self.hosts])
            addr, port = self.get([self.hosts[0].address.remote()])[0]
            setup = [h.setup.remote(addr, port, cfg, plan, total_steps, device) for h in self.hosts]
            self.roles = self.get(setup)[0]
            if not cfg.worker.rollout.colocated:
                self._start_rollout_hosts(cfg, device, gpu)
                self.roles = [*self.roles, "rollout"]
        except BaseException:
            self.close()  # no rank left behind
            raise

    def _start_rollout_hosts(self, cfg: Config, device: str, gpu: bool) -> None:
        import ray
        from ray.util.placement_group import placement_group

        n = cfg.worker.rollout.num_ranks
        bundle = {"GPU": 1, "CPU": 1} if gpu else {"CPU": 1}
        self.rollout_pg = placement_group([bundle] * n, strategy="PACK")
        if not ray.wait([self.rollout_pg.ready()], timeout=60)[0]:
            raise RLStackError(
                f"worker.rollout.num_ranks = {n} rollout actors of {bundle} each do not fit in what the Ray "
                f"cluster has left after the {self.world_size} policy ranks: lower it, or add nodes"
            )
        # in-flight weight updates arrive while a generate call runs: two calls at a time
        concurrency = 2 if cfg.algorithm.async_grpo.in_flight else 1
        self.rollout_hosts = _place_hosts(
            self.rollout_pg, n, 1, gpu, cfg.trainer.num_threads, self.env, concurrency
        )
        self.rollout_who = [f"rollout worker {r} of {n}" for r in range(n)]
        self.get([h.setup_rollout.remote(cfg, device) for h in self.rollout_hosts], self.rollout_who)

    def get(self, refs: list, who: list[str] | None = None) -> list:
        """Results of one call per rank, in rank order. The first rank to fail ends the call at once (the
        others may be waiting for it in a collective): a dead rank as `WorkerDied` naming it, its host and
        what Ray saw; an exception raised in a worker as itself."""
        import ray

        rank_of = {ref: r for r, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except ray.exceptions.ActorDiedError as e:
                name = (who or self.rank_names())[rank_of[done[0]]]
                raise WorkerDied(
                    f"{name} died: {e}. The run was stopped; resume from the last checkpoint "
                    "(trainer.find_last_checkpoint=true)"
                ) from e
            except ray.exceptions.RayTaskError as e:
                raise e.as_instanceof_cause() from None
        return ray.get(refs)

    def rank_names(self) -> list[str]:
        """How a failure names each rank: its place, host and process."""
        where = self.where or [("?", 0, "")] * self.world_size
        return [f"rank {i} of {self.world_size} (host {h}, pid {pid})" for i, (h, pid, _) in enumerate(where)]

    def group(self, role: str, cls: type) -> RayRoleGroup:
        """The role's workers (of class `cls`) on every rank that holds it."""
        if role == "rollout" and self.rollout_hosts:
            return RayRoleGroup(self, role, cls, self.rollout_hosts, self.rollout_who)
        replicas = self.ulysses_size if role in ("actor", "ref", "critic") else 1
        return RayRoleGroup(self, role, cls, self.hosts, replicas=replicas)

    def close(self) -> None:
        import ray

        for h in self.hosts + getattr(self, "rollout_hosts", []) + self.extra_actors:
            ray.kill(h)
        ray.util.remove_placement_group(self.pg)
        if getattr(self, "rollout_pg", None) is not None:
            ray.util.remove_placement_group(self.rollout_pg)


FORWARDED = ("TOKENIZERS_PARALLELISM", "NCCL_DEBUG", "VLLM_LOGGING_LEVEL", "RLSTACK_CACHE")
FORWARDED_PREFIXES = ("HF_",)
"""The driver's environment variables every actor gets (where the driver has them set): what EasyR1's and
NeMo RL's Ray runtime environments pass, and where models and caches live."""
ACTOR_DEFAULTS = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "VLLM_LOGGING_LEVEL": "WARN"}
"""EasyR1's values, for those the driver does not set."""


def actor_env(cfg: Config) -> dict[str, str]:
    """The environment variables of every actor of a run: EasyR1's defaults, the driver's forwarded ones,
    then `trainer.env_vars`."""
    forwarded = {k: v for k, v in os.environ.items() if k in FORWARDED or k.startswith(FORWARDED_PREFIXES)}
    return ACTOR_DEFAULTS | forwarded | {k: str(v) for k, v in cfg.trainer.env_vars.items()}


def _place_hosts(
    pg, n: int, per_bundle: int, gpu: bool, num_threads: int, env: dict[str, str], concurrency: int = 1
) -> list:
    """`n` rank actors in placement group `pg`, `per_bundle` to a bundle, a GPU (or a CPU) each, with the
    environment variables `env`, running up to `concurrency` calls at a time."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor = ray.remote(RankHost)
    return [
        actor.options(
            max_concurrency=concurrency,
            runtime_env={"env_vars": env},
            num_cpus=1,
            num_gpus=1 if gpu else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=r // per_bundle
            ),
        ).remote(r, n, num_threads)
        for r in range(n)
    ]


class RewardHost:
    """One reward worker: a reward manager (one call at a time) scoring the rows it is sent."""

    def __init__(self, reward: RewardConfig, max_response_length: int):
        from rlstack.rewards.manager import RewardManager

        self.manager = RewardManager.of(reward, max_response_length=max_response_length)

    def score(self, batch: Batch) -> Batch:
        scored = self.manager.score(batch)
        return Batch({k: scored[k] for k in ("scores", "reward_components", "reward_info")})

    def pop_metrics(self) -> dict[str, float]:
        return self.manager.pop_metrics()

    def close(self) -> None:
        self.manager.close()


class RayRewards:
    """`worker.reward.num_workers` CPU actors that score rollouts off the training ranks (sandboxed code
    tests, judge calls and the reward model included: each actor loads its own copy of it, on
    `reward_model.num_gpus` GPUs); the driver sends each an equal share of the rows. It implements `Rewards`,
    as the `RewardManager` each actor runs does. Each actor takes a CPU, or an equal share of the CPUs the
    ranks leave when there are fewer (`reward_placement`). The judge's address and key go as the driver
    reads them (its environment's LLM_AS_A_JUDGE_BASE / OPENAI_API_KEY included): an actor on another node
    has that node's environment."""

    def __init__(self, cluster: RayCluster, cfg: Config, cpus: float):
        import ray

        rw = cfg.worker.reward
        n = rw.num_workers
        self.cluster = cluster
        env = {"env_vars": cluster.env}
        reward = dataclasses.replace(rw, num_workers=1, judge=judge_endpoint(rw.judge))
        gpus = rw.reward_model.num_gpus if "builtin:reward_model" in functions_in_use(rw) else 0
        if gpus > 0:  # Ray would keep an actor it cannot place pending for ever: say so now
            left = ray.available_resources().get("GPU", 0)
            if n * gpus > left + 1e-6:  # a cluster-wide sum: one actor's GPUs must also fit on one node
                raise RLStackError(
                    f"worker.reward.num_workers={n} reward actors x worker.reward.reward_model.num_gpus={gpus:g} "
                    f"= {n * gpus:g} GPUs, but the Ray cluster has {left:g} GPU(s) left after the "
                    f"{cluster.world_size} policy rank(s){' and the rollout workers' if cluster.rollout_hosts else ''}: "
                    "lower num_workers or num_gpus (0 loads the reward model on the actor's CPU), lower "
                    "trainer.n_gpus_per_node, or add GPUs (NeMo RL's cluster.gpus_per_node counts the "
                    "reward model's GPUs; rlstack's trainer.n_gpus_per_node does not)"
                )
        self.hosts = [
            ray.remote(RewardHost)
            .options(num_cpus=cpus, num_gpus=gpus, runtime_env=env)
            .remote(reward, cfg.data.max_response_length)
            for _ in range(n)
        ]
        self.cluster.extra_actors += self.hosts
        self.who = [f"reward worker {i} of {n}" for i in range(n)]
        self.cluster.get([h.pop_metrics.remote() for h in self.hosts], self.who)  # started, or why not

    def score(self, batch: Batch) -> Batch:
        from rlstack.rewards.manager import REWARD_COLUMNS

        needed = Batch({k: batch[k] for k in REWARD_COLUMNS if k in batch})
        parts, padding = split_rows(needed, len(self.hosts))
        refs = [h.score.remote(p) for h, p in zip(self.hosts, parts)]
        scored = gather_rows(self.cluster.get(refs, self.who), padding, len(batch) + padding)
        return batch.update(scored.columns)

    def pop_metrics(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for m in self.cluster.get([h.pop_metrics.remote() for h in self.hosts], self.who):
            for k, v in m.items():  # counts (judge calls, judge errors): summed over the actors
                totals[k] = totals.get(k, 0.0) + v
        return totals

    def close(self) -> None:
        self.cluster.get([h.close.remote() for h in self.hosts], self.who)


def reward_placement(cluster: RayCluster, num_workers: int) -> tuple[float, str]:
    """CPUs per reward actor, and the line that says so when it is not one each; 0: no actors, the driver
    scores (`worker.reward.num_workers=0`, or no CPU left after the ranks)."""
    import ray

    free = ray.available_resources().get("CPU", 0.0)
    if num_workers == 0:
        return 0.0, "worker.reward.num_workers=0: rewards are scored in the driver process"
    if free >= num_workers:
        return 1.0, ""
    ranks = f"the Ray cluster has {free:g} CPU(s) left after the {cluster.world_size} ranks"
    if free < 0.01 * num_workers:
        return 0.0, f"{ranks}: rewards are scored in the driver process (add CPUs for reward actors)"
    share = free / num_workers
    return share, (
        f"{ranks}: the worker.reward.num_workers = {num_workers} reward actors share them ({share:.2g} CPU each)"
    )


class RayRoleGroup:
    """One role on every rank of a `RayCluster`, behind the `WorkerGroup` interface. With `replicas` > 1
    (sequence parallelism) rows are split over groups of that many consecutive ranks, each rank of a group
    gets the group's rows, and the first rank of each group answers."""

    def __init__(
        self,
        cluster: RayCluster,
        role: str,
        cls: type,
        hosts: list,
        who: list[str] | None = None,
        replicas: int = 1,
    ):
        self.cluster, self.role, self.cls, self.hosts, self.who = cluster, role, cls, hosts, who
        self.world_size = len(hosts)
        self.replicas = replicas

    def get(self, refs: list) -> list:
        return self.cluster.get(refs, self.who)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        hosts, w, r = self.hosts, self.world_size // self.replicas, self.replicas
        declared = declaration(self.cls, method)
        sent = outgoing(declared, args)
        if declared.dispatch is Dispatch.ROWS:
            parts, padding = split_rows(sent[0], w)
            refs = [
                h.call.remote(self.role, method, parts[i // r], *sent[1:], **kwargs)
                for i, h in enumerate(hosts)
            ]
            results = self.get(refs)[::r]
            if isinstance(results[0], Added):  # new columns of the driver's batch, as locally
                added = gather_rows([Batch(r) for r in results], padding, len(args[0]) + padding)
                return incoming(Added(added.columns), args)
            return gather_rows(results, padding, len(args[0]) + padding)
        if declared.dispatch is Dispatch.MINI_BATCHES:
            parts, per_rank = split_mini_batches(sent[0], sent[1], w)
            refs = [
                h.call.remote(self.role, method, parts[i // r], per_rank, *sent[2:], **kwargs)
                for i, h in enumerate(hosts)
            ]
            return self.get(refs)[0]
        # one copy in the object store for all ranks; a reference another group's call left remote as is
        shared = [a if isinstance(a, ray.ObjectRef) else ray.put(a) for a in sent]
        # a result that stays remote comes back as a reference to it in rank 0's object store
        results = self.get([h.call.remote(self.role, method, *shared, **kwargs) for h in hosts])
        return results if declared.dispatch is Dispatch.EACH else results[0]
