"""NeMo RL's keys that need a rule of their own (`rlstack.config.compat.nemo_rl` has the table of the
others): each rule reads its keys out of the values being translated, and moves them to rlstack's."""

from __future__ import annotations

import rlstack.config.tree as tree
from rlstack.config.compat.nemo_rl_algorithm import ALGORITHM_RULES
from rlstack.config.compat.nemo_rl_data import datasets_rule, prompt_files_rule
from rlstack.config.compat.nemo_rl_translation import Translation

REWARDS = {"math": "builtin:math", "code": "builtin:code", "reward_model": "builtin:reward_model"}
"""NeMo RL's environments -> rlstack's built-in rewards."""


PROMPT_SPLIT = 4
"""`policy.max_total_sequence_length` with neither a response nor a prompt bound below it: the prompt gets
this fraction (1 / PROMPT_SPLIT) of the total, the response the rest."""


def _global_batch(t: Translation) -> None:
    key = "policy.train_global_batch_size"
    total = t.take(key)
    if total is tree.MISSING:
        return
    n = t.take("grpo.num_generations_per_prompt")
    if n is not tree.MISSING:
        t.move("grpo.num_generations_per_prompt", "worker.rollout.n", n)
    n = t.get("worker.rollout.n")  # the command line's, if it set it
    n = n if isinstance(n, int) and n > 0 else 1
    if not isinstance(total, int) or total % n:
        t.problems.append(
            f"{key}={total!r}{t.at(key)}: NeMo RL counts trajectories, rlstack's worker.actor.global_batch_size "
            f"prompts; it must be a multiple of grpo.num_generations_per_prompt ({n})"
        )
        return
    prompts = t.get("data.rollout_batch_size")
    step = prompts if prompts is not tree.MISSING else t.get("grpo.num_prompts_per_step")
    if isinstance(step, int) and total // n > step:
        # NeMo RL's update takes whole batches of train_global_batch_size trajectories out of the step's
        # step * n, which hold none: it would not update at all. One optimizer step per rollout is what it means.
        t.move(key, "worker.actor.global_batch_size", step)
        t.notes.append(
            f"{key}={total}{t.at(key)} is {total // n} prompts of {n} trajectories, more than the {step} prompts a "
            f"step generates (grpo.num_prompts_per_step; NeMo RL would make no update with it): read as one "
            f"optimizer step per rollout, worker.actor.global_batch_size={step} ({step * n} trajectories)"
        )
        return
    t.move(key, "worker.actor.global_batch_size", total // n)


def _lengths(t: Translation) -> None:
    """Prompt and response bounds from NeMo RL's total (prompt + response) bound: the bound below the total
    (`generation.max_new_tokens` for the response, `data.max_input_seq_length` for the prompt, or one set in
    rlstack's name) stays and the other is what is left. With both at the total, NeMo RL's stock setting
    (its response gets whatever its prompt leaves, cut by vLLM's `max_model_len`), rlstack, which bounds
    each on its own, gives the prompt a quarter of the total and the response the rest (512: 128 + 384)."""
    key = "policy.max_total_sequence_length"
    total = t.take(key)
    new_tokens = t.take("policy.generation.max_new_tokens")
    prompt = t.take("data.max_input_seq_length")
    bounds = [
        f"{k}={v}"
        for k, v in (("policy.generation.max_new_tokens", new_tokens), ("data.max_input_seq_length", prompt))
        if v is not tree.MISSING
    ]
    if total is tree.MISSING:
        if new_tokens is not tree.MISSING:
            t.move("policy.generation.max_new_tokens", "data.max_response_length", new_tokens)
        if prompt is not tree.MISSING:
            t.move("data.max_input_seq_length", "data.max_prompt_length", prompt)
        return
    own = [t.get(k) is not tree.MISSING for k in ("data.max_prompt_length", "data.max_response_length")]
    if all(own):
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's key, not used: data.max_prompt_length and max_response_length are set"
        )
        return
    response = new_tokens if isinstance(new_tokens, int) and new_tokens < total else None
    prompt = prompt if isinstance(prompt, int) and prompt < total else None
    if own[0]:  # a bound set in rlstack's name stays; the other is what is left of the total
        prompt, response = t.get("data.max_prompt_length"), None
    elif own[1]:
        prompt, response = None, t.get("data.max_response_length")
    if response is None and prompt is None:
        if not isinstance(total, int) or total < 2:
            t.problems.append(
                f"{key}={total!r}{t.at(key)}: NeMo RL's bound on prompt + response must be a number of tokens (at "
                "least 2): set it, or data.max_prompt_length and data.max_response_length"
            )
            return
        prompt = total // PROMPT_SPLIT or 1
        tree.set(t.values, "data.max_prompt_length", prompt)
        tree.set(t.values, "data.max_response_length", total - prompt)
        t.notes.append(
            f"{key}={total}{t.at(key)}: NeMo RL's bound on prompt + response, with policy.generation.max_new_tokens "
            "and data.max_input_seq_length at the total (NeMo RL's response gets what its prompt leaves); rlstack "
            f"bounds each: read as data.max_prompt_length={prompt} (1/{PROMPT_SPLIT}) and data.max_response_length="
            f"{total - prompt}, longer prompts dropped (data.filter_overlong_prompts); set data.max_prompt_length "
            "to split it otherwise"
        )
        return
    if response is None:
        response = total - prompt
    if prompt is None:
        prompt = total - response
    prompt = min(prompt, total - response) if not own[0] else prompt
    tree.set(t.values, "data.max_prompt_length", prompt)
    tree.set(t.values, "data.max_response_length", response)
    given = f" (with {', '.join(bounds)})" if bounds else ""
    kept = [k for k, is_set in zip(("data.max_prompt_length", "data.max_response_length"), own) if is_set]
    t.notes.append(
        f"{key}={total}{t.at(key)}: NeMo RL's bound on prompt + response{given}, read as data.max_prompt_length="
        f"{prompt}, data.max_response_length={response}" + (f" ({kept[0]} is set)" if kept else "")
    )


def _env(t: Translation) -> None:
    """The reward from NeMo RL's environment (`env.<name>`, or the one `data.default.env_name` picks). NeMo
    RL starts only the environments its data names: the other sections (the base file's `env.math` under
    `grpo_rm_1B.yaml`'s reward model) are noted, their settings not read."""
    env = t.get("env")
    name = t.get("data.default.env_name")
    if not isinstance(env, dict) or not env:
        return
    names = [name] if isinstance(name, str) else list(env)
    settings = {n: t.take(f"env.{n}") or {} for n in list(env)}
    if len(names) > 1:
        t.problems.append(
            f"env{t.at('env')}: NeMo RL's environments {names}, and no data.default.env_name picks one; for one "
            "reward per data source use worker.reward.reward_function_by_source"
        )
        return
    (n,) = names
    t.env = n
    for other, own in settings.items():
        if other != n:
            keys = ", ".join(own) if isinstance(own, dict) and own else "no settings"
            t.notes.append(
                f"env.{other}{t.at(f'env.{other}')}: NeMo RL's {other} environment ({keys}), not used: this run's "
                f"environment is {n}, which data.default.env_name{t.at('data.default.env_name')} picks, and NeMo RL "
                "starts only the environments its data names"
            )
    if n not in REWARDS:
        t.problems.append(
            f"env.{n}{t.at(f'env.{n}')}: NeMo RL's environment, which rlstack has no built-in for; write a reward "
            "function (worker.reward.reward_function) or use env math / code"
        )
        return
    if t.get("worker.reward.reward_function") is tree.MISSING:
        t.move(f"env.{n}", "worker.reward.reward_function", REWARDS[n])
    own = settings.get(n, {}) if isinstance(settings.get(n), dict) else {}
    if n == "reward_model":
        _reward_model(t, own)
        return
    for k, v in own.items():
        if k == "num_workers":
            t.move(f"env.{n}.num_workers", "worker.reward.num_workers", v)
        elif k == "terminate_on_evaluation":
            _terminate_on_evaluation(t, f"env.{n}.{k}", v)
        else:
            t.notes.append(
                f"env.{n}.{k}={v!r}{t.at(f'env.{n}.{k}')}: NeMo RL's environment setting, not used"
            )


def _terminate_on_evaluation(t: Translation, key: str, value: object) -> None:
    """NeMo RL's code environment ends an episode once a `<code>` block ending in an expression ran without
    error: over several turns, `worker.rollout.agent.end_on_evaluation`; in one turn every episode ends anyway."""
    turns = t.get("grpo.max_rollout_turns")
    if isinstance(turns, int) and turns > 1:
        t.move(key, "worker.rollout.agent.end_on_evaluation", bool(value))
    else:
        t.notes.append(
            f"{key}={value!r}{t.at(key)}: NeMo RL's key, not used: one turn per episode ends it anyway"
        )


RM = "worker.reward.reward_model"
RM_MOVED = {
    "model_name": f"{RM}.model_path",
    "precision": f"{RM}.dtype",
    "batch_size": f"{RM}.micro_batch_size",
    "max_model_len": f"{RM}.max_length",
}
RM_INERT = {
    "processor": "rlstack reads rows by data.format",
    "reward_model_cfg.enabled": "builtin:reward_model is the reward",
    "dtensor_cfg": "the reward model is not trained: each reward actor holds a whole copy on its one GPU",
    "dynamic_batching": "the reward model scores worker.reward.reward_model.micro_batch_size texts at a time",
    "sequence_packing": "the reward model scores padded batches",
    "offload_optimizer_for_logprob": "the reward model has no optimizer",
    "max_grad_norm": "the reward model is not trained",
}


def _reward_model(t: Translation, own: dict) -> None:
    """NeMo RL's reward-model environment (`env.reward_model`): rlstack's `builtin:reward_model`, a
    Bradley-Terry sequence classifier read at the last token; its GPUs (`resources`) by `_reward_model_gpus`."""
    env = "env.reward_model"
    flat = {".".join(k): v for k, v in _flat(own)}
    model = flat.get("model_name")
    for k, v in flat.items():
        key = f"{env}.{k}"
        if k in RM_MOVED:
            t.move(key, RM_MOVED[k], DTYPE_NAMES.get(v, v) if k == "precision" else v)
        elif k.startswith("resources."):
            continue
        elif k == "tokenizer.name" and v in (None, model):
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, the reward model's own tokenizer")
        elif k == "reward_model_cfg.reward_model_type" and v == "bradley_terry":
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key: builtin:reward_model is a Bradley-Terry model")
        elif k == "checkpoint_path" and v is None:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, null: the weights of model_name")
        elif any(k == inert or k.startswith(inert + ".") for inert in RM_INERT):
            why = next(w for inert, w in RM_INERT.items() if k == inert or k.startswith(inert + "."))
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: {why}")
        else:
            t.problems.append(
                f"{key}={v!r}{t.at(key)}: NeMo RL's reward-model setting, which rlstack has no equivalent for"
            )
    _reward_model_gpus(t, flat.get("resources.gpus_per_node", 1), flat.get("resources.num_nodes", 1))


def _reward_model_gpus(t: Translation, rm_gpus: object, rm_nodes: object) -> None:
    """NeMo RL runs the reward model on GPUs of its own (`env.reward_model.resources`: `gpus_per_node` on each
    of `num_nodes` nodes, data-parallel over them), taken out of the cluster's: on one node the policy gets
    the node's GPUs less the reward model's, on several the nodes the reward model leaves. rlstack's reward
    model runs in reward actors off the policy's ranks, a whole copy on one GPU each (`RayRewards`): one actor
    per GPU NeMo RL gives it, under `trainer.backend=ray`, which places them on GPUs of their own."""
    key = "env.reward_model.resources"
    gpus, nodes = t.get("cluster.gpus_per_node"), t.get("cluster.num_nodes")
    nodes = 1 if nodes is tree.MISSING else nodes
    if not all(isinstance(x, int) and x >= 0 for x in (gpus, nodes, rm_gpus, rm_nodes)):
        t.problems.append(
            f"{key}{t.at(key)}: NeMo RL's reward-model GPUs (gpus_per_node={rm_gpus!r}, num_nodes={rm_nodes!r}) and "
            f"cluster (gpus_per_node={gpus!r}, num_nodes={nodes!r}) must be numbers of GPUs and nodes"
        )
        return
    if rm_gpus * rm_nodes == 0:
        t.move(f"{key}.gpus_per_node", f"{RM}.num_gpus", 0)
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's reward model on no GPU of its own: rlstack's runs on its reward actors' CPU "
            "(trainer.backend=ray), or in the trainer's process on worker.reward.reward_model.device (local)"
        )
        return
    if nodes == 1 and rm_nodes == 1 and gpus > rm_gpus:
        t.take("cluster.gpus_per_node")
        t.move("cluster.gpus_per_node", "trainer.n_gpus_per_node", gpus - rm_gpus)
        policy = f"trainer.n_gpus_per_node={gpus - rm_gpus} of cluster.gpus_per_node={gpus}"
    elif nodes > 1 and nodes > rm_nodes:
        t.take("cluster.num_nodes")
        t.move("cluster.num_nodes", "trainer.nnodes", nodes - rm_nodes)
        policy = f"trainer.nnodes={nodes - rm_nodes} of cluster.num_nodes={nodes}"
    else:
        t.problems.append(
            f"cluster: {nodes} node(s) of {gpus} GPU(s) leave none for the policy beside the reward model's "
            f"{rm_nodes} node(s) of {rm_gpus} GPU(s) ({key})"
        )
        return
    # one reward actor per GPU of the reward model's, each on one GPU, which Ray places (`RayRewards`)
    wanted = {"worker.reward.num_workers": rm_gpus * rm_nodes, f"{RM}.num_gpus": 1, "trainer.backend": "ray"}
    kept = {k: t.get(k) for k in wanted if t.get(k) not in (tree.MISSING, "auto")}  # set in rlstack's name
    for k, v in wanted.items():
        if k not in kept:
            tree.set(t.values, k, v)
    backend = kept.get("trainer.backend", "ray")
    if backend != "ray":
        t.problems.append(
            f"trainer.backend={backend}{t.at('trainer.backend')}: NeMo RL runs the reward model on GPUs of its own, "
            f"{key}{t.at(key)}, which rlstack's reward actors take under trainer.backend=ray; the local backend "
            "would load it in the trainer's process, beside the policy: leave trainer.backend unset (or ray)"
        )
        return
    reward_actors_fit_their_gpus(t, rm_gpus, rm_nodes, policy)
    said = ", ".join(f"{k}={v} (set)" for k, v in kept.items() if v != wanted[k])
    t.notes.append(
        f"{key}{t.at(key)}: NeMo RL's reward model on {rm_nodes} node(s) of {rm_gpus} GPU(s) of its own, the policy on "
        f"the rest ({policy}); read as {rm_gpus * rm_nodes} reward actor(s) holding the reward model on a GPU each "
        f"(worker.reward.num_workers={rm_gpus * rm_nodes}, worker.reward.reward_model.num_gpus=1), under "
        f"trainer.backend=ray, which places them{'; kept: ' + said if said else ''}"
    )


def reward_actors_fit_their_gpus(t: Translation, rm_gpus: int, rm_nodes: int, policy: str) -> None:
    """The reward actors (`worker.reward.num_workers`, each on `worker.reward.reward_model.num_gpus` GPUs) must
    fit the GPUs NeMo RL gives the reward model (`env.reward_model.resources`): the rest of the cluster is the
    policy's, and Ray would otherwise stop the run at start for want of GPUs, after the policy has loaded."""
    n, gpus = t.get("worker.reward.num_workers"), t.get(f"{RM}.num_gpus")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (n, gpus)) or gpus <= 0:
        return  # a value of the wrong type or range is said when the config is built; 0 GPUs: on the CPU
    key, total = "env.reward_model.resources", rm_gpus * rm_nodes
    actors = (
        f"worker.reward.num_workers={n}{t.at('worker.reward.num_workers')} reward actor(s) x "
        f"{RM}.num_gpus={gpus:g}{t.at(f'{RM}.num_gpus')}"
    )
    given = f"NeMo RL's {key}{t.at(key)} gives the reward model {rm_nodes} node(s) of {rm_gpus} GPU(s)"
    if gpus > rm_gpus:
        t.problems.append(
            f"{actors}: one actor's {gpus:g} GPUs must be on one node, and {given}: set {RM}.num_gpus to at most "
            f"{rm_gpus}, or raise {key}.gpus_per_node (and cluster.gpus_per_node with it)"
        )
    elif n * gpus > total + 1e-6:
        t.problems.append(
            f"{actors} need {n * gpus:g} GPUs, but {given}, {total} in all (the rest of the cluster is the "
            f"policy's: {policy}), and Ray would stop the run at start: set worker.reward.num_workers to at most "
            f"{int(total // gpus + 1e-6)}, share the GPUs ({RM}.num_gpus={int(total / n * 100) / 100:g}), or give the reward model "
            f"more ({key}.gpus_per_node, and cluster.gpus_per_node with it)"
        )


DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _flat(node: dict, prefix: tuple = ()) -> list[tuple[tuple, object]]:
    """(key path, value) of every leaf of `node`."""
    out = []
    for k, v in node.items():
        out += _flat(v, (*prefix, k)) if isinstance(v, dict) and v else [((*prefix, k), v)]
    return out


def _scheduler(t: Translation) -> None:
    key = "policy.scheduler"
    steps = t.take(key)
    if steps is tree.MISSING or steps is None:
        return
    kinds = (
        [s.get("name") for s in steps if isinstance(s, dict) and "name" in s]
        if isinstance(steps, list)
        else []
    )
    linear = "torch.optim.lr_scheduler.LinearLR"
    constant = "torch.optim.lr_scheduler.ConstantLR"
    factors = [
        s.get("kwargs", {}).get("factor", 1.0)
        for s in steps
        if isinstance(s, dict) and s.get("name") == constant
    ]
    if all(f == 1.0 for f in factors):
        if kinds and kinds[0] == linear and all(k == constant for k in kinds[1:]):
            kwargs = steps[0].get("kwargs", {})
            warmup, start = kwargs.get("total_iters"), kwargs.get("start_factor", 1 / 3)
            if isinstance(warmup, int):
                t.move(key, "worker.actor.optim.lr_warmup_steps", warmup)
                t.notes.append(
                    f"{key}{t.at(key)}: NeMo RL warms up from {start} x lr, rlstack from 0 (its first step is at "
                    "lr / warm-up steps)"
                )
                return
        if kinds and all(k == constant for k in kinds):
            return
    t.problems.append(
        f"{key}{t.at(key)}: rlstack's schedules are a linear warm-up then constant or cosine "
        "(worker.actor.optim.lr_warmup_steps, lr_scheduler_type); set those instead"
    )


TRACKERS: dict[str, tuple[str, str] | None] = {
    "tensorboard": None,
    "wandb": ("project", "name"),
    "mlflow": ("experiment_name", "run_name"),
    "swanlab": ("project", "name"),
}
"""NeMo RL's trackers (`logger.<name>_enabled`), each one of rlstack's `trainer.logger`, and the keys of its
section (`logger.<name>.*`) that name the project and the run."""


def _loggers(t: Translation) -> None:
    """`logger.<tracker>_enabled` as rlstack's `trainer.logger` (console and file, and each tracker enabled),
    and the project and run names from the first enabled tracker's section (`logger.wandb.project`, ...;
    W&B's where none is enabled): rlstack gives every tracker the same names."""
    enabled = {name: t.take(f"logger.{name}_enabled") for name in TRACKERS}
    on = [name for name, value in enabled.items() if value is True]
    if any(value is not tree.MISSING for value in enabled.values()):
        if t.get("trainer.logger") is not tree.MISSING:
            t.notes.append(
                f"logger.*_enabled{t.at('logger')}: NeMo RL's keys, not used: trainer.logger is set"
            )
        else:
            tree.set(t.values, "trainer.logger", ["console", "file", *on])
            said = ", ".join(f"logger.{name}_enabled" for name, v in enabled.items() if v is not tree.MISSING)
            t.notes.append(
                f"{said}{t.at('logger')}: NeMo RL's keys, read as trainer.logger={['console', 'file', *on]}"
            )
    named = next((name for name in on if TRACKERS[name]), "wandb")
    for name, keys in TRACKERS.items():
        for part, to in zip(keys or (), ("trainer.project_name", "trainer.experiment_name")):
            key = f"logger.{name}.{part}"
            value = t.take(key)
            if value in (tree.MISSING, None):
                continue
            if name == named:
                t.move(key, to, value)
            else:
                t.notes.append(
                    f"{key}{t.at(key)}: NeMo RL's key, not used: rlstack names every tracker's run from logger.{named}"
                )
        if t.get(f"logger.{name}") == {}:
            t.take(f"logger.{name}")
            t.notes.append(f"logger.{name}{t.at('logger.' + name)}: NeMo RL's key, empty: nothing to read")


def _checkpoints(t: Translation) -> None:
    enabled = t.take("checkpointing.enabled")
    if enabled is True:
        t.notes.append(
            f"checkpointing.enabled{t.at('checkpointing')}: NeMo RL's key: checkpoints as saved below"
        )
    if enabled is False and t.get("trainer.save_model_only") is not tree.MISSING:
        t.notes.append(
            f"checkpointing.enabled=false{t.at('checkpointing')}: NeMo RL's key, trainer.save_model_only is set"
        )
    elif enabled is False:
        if t.take("checkpointing.save_period") is not tree.MISSING:
            t.notes.append(
                f"checkpointing.save_period{t.at('checkpointing.save_period')}: NeMo RL's key, not used: "
                "checkpointing.enabled is false"
            )
        tree.set(t.values, "trainer.save_model_only", True)
        t.notes.append(
            f"checkpointing.enabled=false{t.at('checkpointing')}: NeMo RL's key, read as trainer.save_model_only=true "
            "(no checkpoints to resume from; the trained model is still written to huggingface/)"
        )


VAL_METRICS = {"accuracy": "val/reward_score", "avg_length": "val/response_length/mean"}
"""NeMo RL's validation metrics (`checkpointing.metric_name: val:<name>`) by rlstack's names."""


def _best_checkpoints(t: Translation) -> None:
    """`keep_top_k` of the checkpoints best by `metric_name` (`val:<name>`, the older `val_reward`), as
    NeMo RL keeps them: trainer.save_limit, save_best_metric and save_best_mode."""
    k, key = t.take("checkpointing.keep_top_k"), "checkpointing.metric_name"
    if k is not tree.MISSING:
        t.move("checkpointing.keep_top_k", "trainer.save_limit", -1 if k is None else k)
    metric, higher = t.take(key), t.take("checkpointing.higher_is_better")
    if metric in (tree.MISSING, None):
        return
    if t.get("trainer.save_best_metric") is not tree.MISSING:
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: trainer.save_best_metric is set")
        return
    text = str(metric)
    name = "accuracy" if text == "val_reward" else text.split(":", 1)[1] if text.startswith("val:") else None
    if name not in VAL_METRICS:
        t.problems.append(
            f"{key}={metric!r}{t.at(key)}: rlstack ranks checkpoints by its own metric names; set "
            "trainer.save_best_metric to one of metrics.jsonl's (val/reward_score is NeMo RL's val:accuracy), "
            f"or {key}=null to keep the newest checkpoints"
        )
        return
    t.move(key, "trainer.save_best_metric", VAL_METRICS[name])
    if higher is not tree.MISSING:
        t.move("checkpointing.higher_is_better", "trainer.save_best_mode", "max" if higher else "min")


def _megatron(t: Translation) -> None:
    key = "policy.megatron_cfg"
    cfg = t.take(key)
    if cfg is tree.MISSING:
        return
    if isinstance(cfg, dict) and cfg.get("enabled"):
        t.problems.append(
            f"{key}.enabled=true{t.at(key)}: rlstack trains with FSDP2, not Megatron; use dtensor_cfg"
        )
    else:
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's Megatron settings, not used (megatron_cfg.enabled is false)"
        )


PASSTHROUGH_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
"""NeMo RL's `chat_template: null`: the messages' contents joined, no role markers or special tokens."""


def _tokenizer(t: Translation) -> None:
    key = "policy.tokenizer"
    name, model = t.take(f"{key}.name"), t.take("policy.model_name")
    template, kwargs = t.take(f"{key}.chat_template"), t.take(f"{key}.chat_template_kwargs")
    if model is not tree.MISSING:
        t.move("policy.model_name", "worker.actor.model.model_path", model)
    if name in (None, model):
        t.notes.append(f"{key}.name{t.at(key + '.name')}: NeMo RL's key, the model's own tokenizer")
    elif name is not tree.MISSING:
        t.move(f"{key}.name", "worker.actor.model.tokenizer_path", name)
    if template == "default":
        t.notes.append(
            f"{key}.chat_template{t.at(key + '.chat_template')}: NeMo RL's key, the tokenizer's own template"
        )
    elif template is None:  # NeMo RL's passthrough template
        t.move(f"{key}.chat_template", "worker.actor.model.chat_template", PASSTHROUGH_TEMPLATE)
    elif template is not tree.MISSING:
        t.move(f"{key}.chat_template", "worker.actor.model.chat_template", template)
    if kwargs in (None, {}):
        where = t.at(key + ".chat_template_kwargs")
        t.notes.append(f"{key}.chat_template_kwargs{where}: NeMo RL's key, none given: the template as it is")
    elif kwargs is not tree.MISSING:
        t.problems.append(
            f"{key}.chat_template_kwargs={kwargs!r}{t.at(key + '.chat_template_kwargs')}: rlstack renders templates "
            "without extra arguments; put their effect into worker.actor.model.chat_template"
        )


CODE_TOOL = {"name": "python", "import_path": "builtin:python"}
"""NeMo RL's code environment over several turns: rlstack's Python tool, called in `<code>...</code>`."""


def _turns(t: Translation) -> None:
    """`grpo.max_rollout_turns` as `worker.rollout.agent.max_turns`. Between NeMo RL's turns its environment
    replies; with `env.code` that is its code environment, which runs the `<code>` block the model wrote and
    sends back what it printed: rlstack's Python tool (`CODE_TOOL`, sandboxed, its state kept across the
    turns). Another environment's reply is a `worker.rollout.agent.feedback` function to write."""
    key = "grpo.max_rollout_turns"
    turns = t.take(key)
    if turns is tree.MISSING or turns == 1:
        if turns == 1:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, 1: single-turn rollouts")
        return
    t.move(key, "worker.rollout.agent.max_turns", turns)
    agent = "worker.rollout.agent"
    if t.get(f"{agent}.feedback") not in (tree.MISSING, None) or t.get(f"{agent}.tools") not in (
        tree.MISSING,
        [],
        None,
    ):
        return
    if t.env == "code":
        tree.set(t.values, f"{agent}.tools", [dict(CODE_TOOL)])
        t.notes.append(
            f"{key}={turns}{t.at(key)} with env.code: NeMo RL's code environment runs the model's <code> blocks "
            f"between turns, read as {agent}.tools=[builtin:python] (calls in <code>...</code>, what the program "
            "prints comes back as the next turn, without NeMo RL's <result> tags); the reward scores the last program"
        )
        return
    t.problems.append(
        f"{key}={turns}{t.at(key)}: between NeMo RL's turns its environment replies; rlstack's replies come from "
        f"{agent}.feedback (file.py:fn, returning the next user message or None) or from tools ({agent}.tools; "
        "env.code's are rlstack's Python tool)"
    )


def _top_k(t: Translation) -> None:
    value = t.take("policy.generation.top_k")
    if value is not tree.MISSING:
        t.move("policy.generation.top_k", "worker.rollout.top_k", -1 if value is None else value)


def _ratio_clip_c(t: Translation) -> None:
    value = t.take("loss_fn.ratio_clip_c")
    if value is not tree.MISSING:  # NeMo RL's null: no dual clip (rlstack's default clips at 3)
        t.move(
            "loss_fn.ratio_clip_c", "worker.actor.clip_ratio_dual", float("inf") if value is None else value
        )


RULES = (
    _global_batch,
    _lengths,
    *ALGORITHM_RULES,
    _env,
    datasets_rule,
    prompt_files_rule,
    _scheduler,
    _loggers,
    _checkpoints,
    _best_checkpoints,
    _megatron,
    _tokenizer,
    _top_k,
    _ratio_clip_c,
    _turns,
)
"""The rules, in the order they run (before the table)."""
