"""Ready for a GPU the day one is lent: rlstack's GPU paths checked on a bare CUDA machine.

The machine that is sometimes lent has a Python with torch, transformers, peft and accelerate, and no
package index. Everything else rlstack's training path imports travels as wheels in a bundle of at most
64 MiB, built here, where pip reaches the index:

    python bench/gpu_check.py bundle OUT_DIR     # wheels of rlstack and EXTRAS, this script, OUT_DIR/run.sh
    sh OUT_DIR/run.sh [--json OUT] [--only A,B]  # there: install the wheels (pip --no-index), run the checks
    python bench/gpu_check.py run [--cpu] [--json OUT] [--only A,B] [--forward-decoding]

`run` prints one line per check, `PASS|FAIL <name>: <figure or reason>`, and exits non-zero when one
failed; a check that crashes is that check's FAIL line and the others still run. On CUDA:

- device_placement: the policy, reference and rollout engine models sit on the GPU; a log-prob pass of
  the policy and of the reference runs there;
- hf_rollout: the HF engine (`worker.rollout.name=hf`) generates prompts x samples on the GPU;
- turn_cache: a second agent turn continued from the KV cache the engine kept from the first prefills only
  its new tokens and samples what the same turn prefilled whole does (float32, rows ending at different
  steps, so that ended rows leave the decoding batch);
- lean_decoding: the lean decoding step against the model's own forward: the same samples in float32,
  and tokens/s of each in the policy's dtype (`--forward-decoding` runs every check without the lean step);
- padding_free: `worker.actor.padding_free=true` gives the padded layout's log-probs (float32: up to
  rounding; bfloat16: no further from float32 than the padded layout in bfloat16 is, within 2x);
- lora: `worker.actor.model.lora.rank=8` trains: finite loss and gradient norm, only adapters change;
- fsdp2_bf16: `worker.actor.fsdp.mp_param_dtype=bfloat16` on one NCCL rank: FSDP2 keeps float32 master
  parameters (and AdamW state), the linear layers compute in bfloat16, an update applies;
- offload_one_process: `worker.actor.fsdp.offload_params=true` in a one-process run: the policy's shards
  in host memory over a group of one, two GRPO steps that train as without it, the peak memory of each;
- grpo_smollm2_135m, grpo_qwen2.5_1.5b: a few real GRPO steps of rlstack's `Trainer` (builtin:addition,
  builtin:exact_match) on randomly initialised models of those shapes; the figure is steps/s (median
  step after a warm-up) and the peak GPU memory allocated (`perf/max_memory_allocated_gb`).

`--cpu` runs the same checks on this CPU with tiny shapes and gloo (the dry run `make test` runs), so
that every check's code is exercised without a GPU. Models are written with `save_pretrained` into a
temporary folder (the machine reaches no hub) with the built-in tiny model's character tokenizer.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLE_LIMIT = 64 * 2**20
EXTRAS = ("omegaconf", "pillow")
"""What rlstack's training path imports beyond torch, transformers, peft, accelerate and what they require:
omegaconf (`rlstack.config`; 2.4 vendors its ANTLR runtime) and pillow (PIL, imported by the rollout
engine, the agent loop and the built-in tasks). Downloaded at the versions installed here."""
TARGET_PYTHON = "3.12"
"""The lent machine's Python (/opt/torch/.venv/bin/python3 is 3.12): pillow's wheel is built per version."""
TARGET_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

# ------------------------------------------------------------------------------------------ models

SHAPES = {
    "smollm2-135m": (
        "llama",
        dict(
            hidden_size=576,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            intermediate_size=1536,
            vocab_size=49152,
            max_position_embeddings=8192,
        ),
    ),
    "qwen2.5-1.5b": (
        "qwen2",
        dict(
            hidden_size=1536,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            intermediate_size=8960,
            vocab_size=151936,
            max_position_embeddings=32768,
        ),
    ),
}
"""The two real shapes (tied embeddings); `--cpu` keeps the heads and shrinks the rest (`TINY`)."""
TINY = dict(hidden_layers=2, head_dim=8, intermediate_size=128, vocab_size=128)


def model_config(name: str, tiny: bool, pad_token_id: int, eos_token_id: int):
    from transformers import LlamaConfig, Qwen2Config

    arch, sizes = SHAPES[name]
    sizes = dict(sizes)
    if tiny:
        sizes.update(
            hidden_size=sizes["num_attention_heads"] * TINY["head_dim"],
            num_hidden_layers=TINY["hidden_layers"],
            intermediate_size=TINY["intermediate_size"],
            vocab_size=TINY["vocab_size"],
            max_position_embeddings=512,
        )
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return cls(
        **sizes,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )


def write_model(out: Path, name: str, tiny: bool, device: str, dtype: str) -> int:
    """A randomly initialised model of shape `name` and the built-in tiny model's tokenizer, in `out`
    (weights in `dtype`, initialised on `device`); returns its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlstack.models.loading import mark_generic_tokenizer
    from rlstack.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    config = model_config(name, tiny, tok.pad_token_id, tok.eos_token_id)
    if config.vocab_size < len(tok):
        raise ValueError(
            f"{name}: vocab_size {config.vocab_size} does not cover the tokenizer's {len(tok)} tokens"
        )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    mark_generic_tokenizer(out)
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------ the context


@dataclass
class Workload:
    """Sizes of the checks' runs."""

    prompts: int
    """Prompts per GRPO step and per rollout (`data.rollout_batch_size`)."""
    samples: int
    """Responses per prompt (`worker.rollout.n`)."""
    response_tokens: int
    """`data.max_response_length` of the GRPO runs and the rollout."""
    warmup_steps: int
    """GRPO steps run before the timed ones."""
    timed_steps: int
    """GRPO steps whose median time gives steps/s."""
    rows: int
    """Trajectories of the synthetic batches (padding-free, LoRA, FSDP2)."""
    prompt_columns: int
    """Their prompt columns (left-padded)."""
    response_columns: int
    """Their response columns (right-padded)."""


GPU_WORK = Workload(8, 4, 128, 1, 3, rows=16, prompt_columns=32, response_columns=64)
CPU_WORK = Workload(2, 2, 8, 1, 1, rows=8, prompt_columns=8, response_columns=8)


@dataclass
class Context:
    device: str
    """cuda or cpu: `trainer.device` of every run."""
    tmp: Path
    work: Workload
    dtype: str
    """The policy's `worker.actor.model.dtype` (bfloat16 on the GPU, float32 on the CPU)."""
    models: dict[str, tuple[Path, int]] = field(default_factory=dict)

    @property
    def rank_device(self) -> str:
        """The device string a rank's workers get (a GPU rank names its GPU, as Ray's ranks do)."""
        return "cuda:0" if self.device == "cuda" else "cpu"

    def model(self, name: str = "smollm2-135m") -> tuple[Path, int]:
        """(directory, parameter count) of the model of shape `name`, written on first use."""
        if name not in self.models:
            out = self.tmp / "models" / name
            self.models[name] = (out, write_model(out, name, self.device == "cpu", self.device, self.dtype))
        return self.models[name]

    def config(self, *extra: str, model: str = "smollm2-135m"):
        """rlstack's config for a check: the model of shape `model` on this device, builtin:addition with
        builtin:exact_match, the workload's sizes, a metrics file only; `extra` overrides last."""
        from rlstack.config import load_config

        w = self.work
        trajectories = w.prompts * w.samples
        return load_config(
            [
                f"worker.actor.model.model_path={self.model(model)[0]}",
                f"worker.actor.model.dtype={self.dtype}",
                "data.train_files=builtin:addition@train",
                "data.val_files=",
                f"data.rollout_batch_size={w.prompts}",
                f"data.max_response_length={w.response_tokens}",
                f"worker.actor.global_batch_size={w.prompts}",
                f"worker.actor.micro_batch_size_per_device_for_update={trajectories}",
                f"worker.actor.micro_batch_size_per_device_for_experience={trajectories}",
                f"worker.rollout.n={w.samples}",
                "worker.rollout.name=hf",
                "worker.reward.reward_function=builtin:exact_match",
                f"trainer.device={self.device}",
                "trainer.logger=[file]",
                "trainer.val_before_train=false",
                "trainer.save_model_only=true",
                "trainer.train_generations_to_log=0",
                f"trainer.output_dir={self.tmp / 'runs'}",
                *extra,
            ]
        )

    def synthetic_batch(self, vocab: int):
        """Trajectories laid out as the rollout lays them out: prompts of different lengths left-padded,
        each sampled twice; responses of different lengths right-padded; random advantages."""
        import torch

        from rlstack.batch import Batch

        w = self.work
        rows, P, R = w.rows, w.prompt_columns, w.response_columns
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(3, vocab, (rows, P + R), generator=g)
        attn = torch.zeros(rows, P + R, dtype=torch.long)
        resp = torch.zeros_like(attn)
        for i in range(rows):
            prompt = P - (i // 2) % (P // 2)
            response = R - (5 * i) % R
            if i % 2:
                ids[i, :P] = ids[i - 1, :P]
            attn[i, P - prompt : P + response] = 1
            resp[i, P : P + response] = 1
        advantages = torch.randn(rows, 1, generator=g).expand(-1, P + R) * resp
        return Batch(
            {
                "input_ids": torch.where(attn.bool(), ids, 0),
                "attention_mask": attn,
                "response_mask": resp,
                "advantages": advantages.contiguous(),
            }
        )


class CheckFailed(Exception):
    """A check ran and its result is wrong: the message says what was found."""


Outcome = tuple[str, dict[str, float | str | list[float]]]
"""A passed check's figure (one line) and its numbers."""


def _parameters_on(model, device: str) -> list[str]:
    return sorted({p.device.type for p in model.parameters()} - {device})


def _finite(metrics: dict[str, float], *keys: str) -> None:
    bad = {k: metrics.get(k) for k in keys if not math.isfinite(metrics.get(k, math.nan))}
    if bad:
        raise CheckFailed(f"not finite (or missing): {bad}")


# ------------------------------------------------------------------------------------------ checks


def check_device_placement(ctx: Context) -> Outcome:
    """The policy, the reference (a KL loss makes one) and the rollout engine's model live on the device;
    the policy's and the reference's log-prob passes run there and agree (the same initial weights)."""
    import torch

    from rlstack.config import resolve_device
    from rlstack.plan import StepPlan
    from rlstack.workers.roles import build_roles

    cfg = ctx.config("algorithm.use_kl_loss=true", "algorithm.kl_penalty=low_var_kl")
    roles = build_roles(cfg, StepPlan.of(cfg), total_steps=1, device=resolve_device(cfg.trainer.device))
    models = {
        "policy": roles["actor"].model,
        "reference": roles["ref"].model,
        "rollout": roles["rollout"].engine.model,
    }
    elsewhere = {role: _parameters_on(m, ctx.device) for role, m in models.items()}
    elsewhere = {role: where for role, where in elsewhere.items() if where}
    if elsewhere:
        raise CheckFailed(f"parameters off {ctx.device}: {elsewhere}")
    batch = ctx.synthetic_batch(len(roles["actor"].tokenizer))
    batch = roles["ref"].compute_ref_logprobs(roles["actor"].compute_logprobs(batch))
    mask = batch["response_mask"].bool()
    policy, ref = batch["old_logprobs"][mask], batch["ref_logprobs"][mask]
    if not (torch.isfinite(policy).all() and torch.isfinite(ref).all()):
        raise CheckFailed("non-finite log-probs from the policy or the reference")
    diff = float((policy - ref).abs().max())
    shared = models["rollout"] is models["policy"]
    where = torch.cuda.get_device_name() if ctx.device == "cuda" else platform.processor() or "cpu"
    figure = (
        f"policy, reference, rollout engine on {ctx.device} ({where}; the engine "
        f"{'shares the policy module' if shared else 'holds its own copy'}); log-prob passes of "
        f"{int(mask.sum())} tokens: mean {float(policy.mean()):.3f}, |policy - reference| <= {diff:.2g}"
    )
    return figure, {"logprob_mean": float(policy.mean()), "policy_ref_max_diff": diff}


def check_hf_rollout(ctx: Context) -> Outcome:
    """`worker.rollout.name=hf` samples `n` responses per prompt with the engine's model on the device."""
    import torch

    from rlstack.config import resolve_device
    from rlstack.data.dataset import PromptDataset
    from rlstack.plan import StepPlan
    from rlstack.workers.roles import build_roles

    cfg = ctx.config()
    roles = build_roles(cfg, StepPlan.of(cfg), total_steps=1, device=resolve_device(cfg.trainer.device))
    rollout = roles["rollout"]
    if rollout.engine.capabilities.name != "hf":
        raise CheckFailed(f"the engine is {rollout.engine.capabilities.name}, not hf")
    elsewhere = _parameters_on(rollout.engine.model, ctx.device)
    if elsewhere:
        raise CheckFailed(f"the engine's parameters are on {elsewhere}, not {ctx.device}")
    dataset = PromptDataset.from_config(cfg.data.train_files, roles["actor"].tokenizer, cfg.data)
    prompts = dataset.batch(list(range(ctx.work.prompts)))
    _sync(ctx)
    start = time.perf_counter()
    batch = rollout.generate(prompts)
    _sync(ctx)
    seconds = time.perf_counter() - start
    expected = ctx.work.prompts * ctx.work.samples
    tokens = int(batch["response_mask"].sum())
    if len(batch) != expected or tokens == 0:
        raise CheckFailed(f"{len(batch)} trajectories (expected {expected}) with {tokens} sampled tokens")
    logp = batch["rollout_logprobs"][batch["response_mask"].bool()]
    if not torch.isfinite(logp).all():
        raise CheckFailed("non-finite behaviour log-probs from the engine")
    figure = (
        f"{len(batch)} trajectories ({ctx.work.prompts} prompts x {ctx.work.samples}), {tokens} sampled tokens "
        f"in {seconds:.2f} s ({tokens / seconds:.0f} tokens/s) on {ctx.device}"
    )
    return figure, {
        "trajectories": len(batch),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
    }


FLOAT32_TOLERANCE = 1e-3
"""Largest |padding-free - padded| log-prob in float32: rounding of the two layouts' kernels (the CPU
tests hold them to 1e-5); a row attending across its neighbours is off by whole nats."""


def check_padding_free(ctx: Context) -> Outcome:
    """The policy's log-probs with `worker.actor.padding_free=true` against the padded layout: in float32
    up to rounding; in bfloat16 (where the device has it) both layouts' error against float32, padding-free
    within twice the padded layout's."""
    from rlstack.config import cpu_supports_bfloat16
    from rlstack.workers.policy import PolicyWorker

    dtypes = ["float32"] + (["bfloat16"] if ctx.device == "cuda" or cpu_supports_bfloat16() else [])
    logp = {}
    for dtype in dtypes:
        for padding_free in (False, True):
            cfg = ctx.config(
                f"worker.actor.model.dtype={dtype}", f"worker.actor.padding_free={str(padding_free).lower()}"
            )
            worker = PolicyWorker(
                cfg.worker.actor,
                cfg.algorithm,
                ctx.work.response_tokens,
                1,
                1,
                ctx.rank_device,
                old_logprobs=False,
            )
            batch = ctx.synthetic_batch(len(worker.tokenizer))
            mask = batch["response_mask"].bool()
            logp[dtype, padding_free] = worker.compute_logprobs(batch)["old_logprobs"][mask].double()
            del worker
    values: dict[str, float | str | list[float]] = {}
    fp32 = float((logp["float32", True] - logp["float32", False]).abs().max())
    values["float32_max_diff"] = fp32
    if not fp32 <= FLOAT32_TOLERANCE:
        raise CheckFailed(
            f"float32: padding-free and padded log-probs differ by up to {fp32:.3g} (> {FLOAT32_TOLERANCE})"
        )
    figure = f"float32 |padding-free - padded| <= {fp32:.2g}"
    if "bfloat16" in dtypes:
        reference = logp["float32", False]
        packed = float((logp["bfloat16", True] - reference).abs().mean())
        padded = float((logp["bfloat16", False] - reference).abs().mean())
        values |= {"bfloat16_padding_free_error": packed, "bfloat16_padded_error": padded}
        if not packed <= 2 * padded:
            raise CheckFailed(
                f"bfloat16: padding-free log-probs are {packed:.3g} from float32 on average, the padded layout's "
                f"{padded:.3g} (more than 2x)"
            )
        figure += f"; bfloat16 mean |error vs float32|: padding-free {packed:.3g}, padded {padded:.3g}"
    return f"{figure} over {int(mask.sum())} response tokens", values


def check_lora(ctx: Context) -> Outcome:
    """One policy update with LoRA adapters (`worker.actor.model.lora.rank=8`): finite loss and gradient
    norm, adapters change, the base weights do not."""
    import torch

    from rlstack.workers.policy import PolicyWorker

    cfg = ctx.config("worker.actor.model.lora.rank=8", "worker.actor.optim.lr=1e-3")
    # one on-policy update of a synthetic batch: its first forward pass is the old policy
    worker = PolicyWorker(
        cfg.worker.actor, cfg.algorithm, ctx.work.response_tokens, 1, 1, ctx.rank_device, old_logprobs=False
    )
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    trainable = {n for n, p in worker.model.named_parameters() if p.requires_grad}
    batch = ctx.synthetic_batch(len(worker.tokenizer))
    metrics = worker.update(batch, len(batch))
    _finite(metrics, "actor/pg_loss", "actor/grad_norm")
    changed = {n for n, p in worker.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    adapters = {n for n in before if ".lora_" in n}
    if not adapters or trainable != adapters:
        raise CheckFailed(
            f"{len(trainable)} trainable tensors, {len(adapters)} adapter tensors: not the same set"
        )
    if changed - adapters:
        raise CheckFailed(f"base weights changed: {sorted(changed - adapters)[:3]}")
    if not changed or not metrics["actor/grad_norm"] > 0:
        raise CheckFailed(f"the update changed nothing (grad_norm {metrics['actor/grad_norm']})")
    params = dict(worker.model.named_parameters())
    n_adapter = sum(params[n].numel() for n in adapters)
    n_total = sum(p.numel() for p in params.values())
    figure = (
        f"{len(changed)} of {len(adapters)} adapter tensors changed, base unchanged; "
        f"{n_adapter / 1e6:.2f}M of {n_total / 1e6:.1f}M parameters train; pg_loss {metrics['actor/pg_loss']:.4g}, "
        f"grad_norm {metrics['actor/grad_norm']:.4g}"
    )
    return figure, {
        "adapters_changed": len(changed),
        "adapter_parameters": n_adapter,
        "pg_loss": metrics["actor/pg_loss"],
        "grad_norm": metrics["actor/grad_norm"],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_fsdp2_bf16(ctx: Context) -> Outcome:
    """FSDP2 with `worker.actor.fsdp.mp_param_dtype=bfloat16` on one rank of a process group (NCCL on the
    GPU, gloo on the CPU), joined as Ray's ranks and the tests' ranks join it
    (`distributed.init_process_group`): float32 master parameters and AdamW state, linear layers that
    compute in bfloat16, and an update that moves the weights."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from rlstack.workers import distributed
    from rlstack.workers.policy import PolicyWorker
    from rlstack.workers.training import build_optimizer

    cfg = ctx.config(
        "worker.actor.model.dtype=float32",
        "worker.actor.fsdp.mp_param_dtype=bfloat16",
        "worker.actor.optim.lr=1e-3",
    )
    a = cfg.worker.actor
    device = ctx.rank_device
    distributed.init_process_group(0, 1, "127.0.0.1", free_port(), device)
    try:
        backend = str(dist.get_backend())
        worker = PolicyWorker(a, cfg.algorithm, ctx.work.response_tokens, 1, 1, device, old_logprobs=False)
        # PolicyWorker shards only with several ranks (`distributed.sharded()`); one NCCL rank per GPU means
        # a world of one here, so shard and build the optimizer as its constructor does with several.
        distributed.shard_model(worker.model, device, a.fsdp.mp_param_dtype, a.fsdp.offload_params)
        worker.optimizer, worker.scheduler = build_optimizer(worker.model, a.optim, 1)
        params = dict(worker.model.named_parameters())
        if not all(isinstance(p, DTensor) for p in params.values()):
            raise CheckFailed("fully_shard left plain tensors among the parameters")
        before = {n: distributed.full(p).detach().clone() for n, p in params.items()}
        computed: set[torch.dtype] = set()
        hooks = [
            m.register_forward_hook(lambda _module, _inputs, out: computed.add(out.dtype))
            for m in worker.model.modules()
            if isinstance(m, torch.nn.Linear)
        ]
        try:
            metrics = worker.update(ctx.synthetic_batch(len(worker.tokenizer)), ctx.work.rows)
        finally:
            for h in hooks:
                h.remove()
        _finite(metrics, "actor/pg_loss", "actor/grad_norm")
        masters = {p.dtype for p in worker.model.parameters()}
        state = {
            t.dtype
            for s in worker.optimizer.state.values()
            for t in s.values()
            if t.is_floating_point() and t.dim() > 0
        }
        if masters != {torch.float32} or state != {torch.float32}:
            raise CheckFailed(f"master parameters {masters}, AdamW state {state}: expected float32")
        if computed != {torch.bfloat16}:
            raise CheckFailed(f"linear layers computed in {computed}, expected bfloat16")
        moved = max(float((distributed.full(p).detach() - before[n]).abs().max()) for n, p in params.items())
        if not (math.isfinite(moved) and moved > 0):
            raise CheckFailed(f"the update moved the weights by {moved}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    figure = (
        f"{backend}, 1 rank: {len(params)} float32 DTensor parameters and AdamW state, linear layers in bfloat16; "
        f"pg_loss {metrics['actor/pg_loss']:.4g}, grad_norm {metrics['actor/grad_norm']:.4g}, max |dw| {moved:.2g}"
    )
    return figure, {"backend": backend, "grad_norm": metrics["actor/grad_norm"], "max_weight_change": moved}


def check_offload_one_process(ctx: Context) -> Outcome:
    """`worker.actor.fsdp.offload_params=true` in a one-process run (EasyR1's offload_params on one GPU):
    FSDP2's CPU offload over a process group of one, the policy's shards in host memory; two GRPO steps
    that train as the same run without it does (the first step's rollout is the same weights' and scores
    the same; loss and gradient norm within bfloat16's rounding), and the peak GPU memory of each."""
    import torch

    from rlstack.trainer import Trainer
    from rlstack.workers import distributed

    seen: dict[str, object] = {}
    real = distributed.shard_model

    def spy(model, device, param_dtype=None, offload=False):
        out = real(model, device, param_dtype, offload)
        seen["offload"], seen["world"] = offload, distributed.current().world_size
        seen["places"] = sorted({str(p.to_local().device.type) for p in model.parameters()})
        return out

    runs: dict[bool, list[dict]] = {}
    for offload in (False, True):
        cfg = ctx.config(
            "trainer.max_steps=2",
            f"trainer.experiment_name=offload-{offload}",
            f"worker.actor.fsdp.offload_params={str(offload).lower()}",
            # an entropy bonus: a gradient even where every sample of the random model scores the same
            "worker.actor.entropy_coeff=0.01",
        )
        distributed.shard_model = spy
        try:
            Trainer(cfg).fit()
        finally:
            distributed.shard_model = real
            distributed.close_alone_group()
        runs[offload] = [
            json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        _release(ctx)
    if seen.get("offload") is not True or seen.get("world") != 1:
        raise CheckFailed(f"the offloaded run sharded with {seen}: expected offload over a world of one")
    host = "cpu" if ctx.device == "cuda" else seen["places"][0]
    if seen["places"] != [host]:
        raise CheckFailed(f"the offloaded policy's shards live on {seen['places']}, expected {host}")
    if distributed.sharded() or torch.distributed.is_initialized():
        raise CheckFailed("the run's group of one outlived the run")
    plain, off = runs[False], runs[True]
    for rows in (plain, off):
        for r in rows:
            _finite(r, "actor/pg_loss", "actor/grad_norm")
    if plain[0]["critic/score/mean"] != off[0]["critic/score/mean"]:
        raise CheckFailed(
            f"step 1 scored {off[0]['critic/score/mean']} offloaded, {plain[0]['critic/score/mean']} not"
        )
    tol = 0.05 if ctx.dtype == "bfloat16" else 1e-4
    if not plain[0]["actor/grad_norm"] > 0:
        raise CheckFailed(f"step 1 had no gradient ({plain[0]['actor/grad_norm']}): nothing to compare")
    for key in ("actor/entropy", "actor/grad_norm"):
        a, b = plain[0][key], off[0][key]
        if abs(a - b) > tol * max(1.0, abs(a)):
            raise CheckFailed(f"step 1 {key}: {b} offloaded against {a} (tolerance {tol} relative)")
    memory = "perf/max_memory_allocated_gb" if ctx.device == "cuda" else "perf/max_rss_gb"
    peaks = {k: max(r.get(memory, math.nan) for r in rows) for k, rows in runs.items()}
    figure = (
        f"shards on {host} over a group of one; step 1 entropy {off[0]['actor/entropy']:.4g} "
        f"(plain {plain[0]['actor/entropy']:.4g}), grad_norm {off[0]['actor/grad_norm']:.4g} "
        f"(plain {plain[0]['actor/grad_norm']:.4g}); peak {memory.split('/')[1]} {peaks[True]:.2f} GiB "
        f"offloaded, {peaks[False]:.2f} GiB not"
    )
    return figure, {
        "entropy": [off[0]["actor/entropy"], plain[0]["actor/entropy"]],
        "grad_norm": [off[0]["actor/grad_norm"], plain[0]["actor/grad_norm"]],
        "peak_offloaded_gib": peaks[True],
        "peak_plain_gib": peaks[False],
    }


def check_grpo(ctx: Context, name: str) -> Outcome:
    """A few GRPO steps of rlstack's `Trainer` on the model of shape `name`: steps/s (1 / the median
    `timing_s/step` after the warm-up) and the peak memory (GPU: allocated; CPU: resident)."""
    from rlstack.trainer import Trainer

    w = ctx.work
    steps = w.warmup_steps + w.timed_steps
    _, n_params = ctx.model(name)
    cfg = ctx.config(f"trainer.max_steps={steps}", f"trainer.experiment_name=grpo-{name}", model=name)
    Trainer(cfg).fit()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    if [r["step"] for r in rows] != list(range(1, steps + 1)):
        raise CheckFailed(f"metrics of steps {[r['step'] for r in rows]}, expected 1..{steps}")
    timed = rows[w.warmup_steps :]
    for r in rows:
        _finite(r, "actor/pg_loss", "actor/grad_norm", "timing_s/step")
    steps_per_s = 1 / statistics.median(r["timing_s/step"] for r in timed)
    memory = "perf/max_memory_allocated_gb" if ctx.device == "cuda" else "perf/max_rss_gb"
    peak = max(r.get(memory, math.nan) for r in rows)
    if not (math.isfinite(steps_per_s) and math.isfinite(peak)):
        raise CheckFailed(f"steps/s {steps_per_s}, {memory} {peak}")
    length = statistics.mean(r["response_length/mean"] for r in timed)
    phases = {
        k.split("/", 1)[1]: statistics.median(r[k] for r in timed)
        for k in timed[0]
        if k.startswith("timing_s/") and k != "timing_s/step"
    }
    what = "GPU memory allocated" if ctx.device == "cuda" else "resident memory"
    figure = (
        f"{steps_per_s:.3g} steps/s, peak {peak:.2f} GiB {what} ({n_params / 1e6:.3g}M parameters, {ctx.dtype}; "
        f"{w.prompts} prompts x {w.samples}, responses {length:.0f} tokens mean of <= {w.response_tokens}; "
        f"median of {w.timed_steps} steps after {w.warmup_steps}; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items() if v >= 0.01)
        + ")"
    )
    return figure, {
        "steps_per_s": steps_per_s,
        "peak_memory_gib": peak,
        "parameters": n_params,
        "response_length_mean": length,
        "step_s": [r["timing_s/step"] for r in timed],
        "phases_s": list(phases.values()),
        "phases": ", ".join(phases),
    }


def _engine_model(ctx: Context, dtype: str):
    """The SmolLM2-shaped model of the checks, in `dtype` on the device, for sampling (eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlstack.models.tiny import build_char_tokenizer

    path, _ = ctx.model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(ctx.device).eval()
    return model, build_char_tokenizer()


def _ending_tokens(vocab: int) -> list[int]:
    """A fiftieth of the vocabulary's ids, made end-of-sequence tokens: a random model, whose next-token
    distribution is near uniform, then ends each row at a different step (about 2% a step)."""
    return list(range(vocab - vocab // 50, vocab))


def _agreement(got: list[list[int]], want: list[list[int]], got_logp, want_logp) -> tuple[float, float]:
    """(share of rows sampled exactly alike, largest |log-prob difference| over the tokens each row shares
    with its reference before they first differ)."""
    same, worst = 0, 0.0
    for a, b, la, lb in zip(got, want, got_logp, want_logp):
        same += a == b
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        n = n + 1 if n < min(len(a), len(b)) else n  # the first differing token's own log-prob too
        worst = max([worst, *(abs(x - y) for x, y in zip(la[:n], lb[:n]))])
    return same / len(got), worst


TURN_TOLERANCE = 1e-3
"""Largest |log-prob| difference (float32) between a turn continued from a kept cache and the same turn
prefilled whole: rounding of kernels over differently laid-out columns (the CPU tests hold 1e-5)."""


def check_turn_cache(ctx: Context) -> Outcome:
    """The HF engine's KV caches kept between an agent's turns (`Request.keep` / `Request.cache`) on the
    device: a second turn (the first's response, then a reply of its own length) continued from its kept
    cache prefills only its new tokens and samples what the same turn prefilled whole samples (float32;
    rows end at different steps), and the time of each second turn."""
    import torch

    from rlstack.rollout.engine import Request, SamplingSettings
    from rlstack.rollout.hf import HFEngine

    model, tok = _engine_model(ctx, "float32")
    w = ctx.work
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, vocab, (40,), generator=g).tolist()  # a worked example every prompt shares
    prompts = [prefix + torch.randint(3, vocab, (5 + 3 * i,), generator=g).tolist() for i in range(w.prompts)]
    engines = {
        kept: HFEngine(model, tok, seed=0, multimodal=False, keep_turns=kept) for kept in (True, False)
    }
    for engine in engines.values():
        engine.eos_token_ids = set(_ending_tokens(vocab))
    settings = SamplingSettings(max_tokens=w.response_tokens)
    firsts = engines[True].generate(
        [
            Request(p, seed=i * w.samples + j, keep=True)
            for i, p in enumerate(prompts)
            for j in range(w.samples)
        ],
        settings,
    )
    lengths = [len(c.token_ids) for c in firsts]
    if not all(c.cache is not None for c in firsts):
        raise CheckFailed("the engine kept no cache for a request that asked (Request.keep)")
    replies = [torch.randint(3, vocab, (1 + k % 7,), generator=g).tolist() for k in range(len(firsts))]
    seconds_ids = [prompts[k // w.samples] + c.token_ids + r for k, (c, r) in enumerate(zip(firsts, replies))]
    timed, outs = {}, {}
    for kept in (True, False):
        engine = engines[kept]
        requests = [
            Request(ids, seed=1000 + k, cache=firsts[k].cache if kept else None)
            for k, ids in enumerate(seconds_ids)
        ]
        before = engine.prefilled_tokens
        _sync(ctx)
        start = time.perf_counter()
        outs[kept] = engine.generate(requests, settings)
        _sync(ctx)
        timed[kept] = (time.perf_counter() - start, engine.prefilled_tokens - before)
    new_tokens = sum(1 + len(r) for r in replies)  # the first turn's last token and the reply
    if timed[True][1] != new_tokens:
        raise CheckFailed(f"the continued turn prefilled {timed[True][1]} tokens, expected {new_tokens}")
    same, worst = _agreement(
        [c.token_ids for c in outs[True]],
        [c.token_ids for c in outs[False]],
        [c.logprobs for c in outs[True]],
        [c.logprobs for c in outs[False]],
    )
    if not worst <= TURN_TOLERANCE or same < 0.9:
        raise CheckFailed(
            f"continued and whole second turns: {same:.0%} of rows alike, log-probs up to {worst:.3g} apart "
            f"(tolerance {TURN_TOLERANCE})"
        )
    figure = (
        f"{len(firsts)} second turns: kept caches prefill {timed[True][1]} tokens, whole {timed[False][1]}; "
        f"{same:.0%} of rows sample alike, |log-prob diff| <= {worst:.2g} (float32); first turns "
        f"{min(lengths)}-{max(lengths)} tokens; second turn {timed[True][0]:.2f} s kept, {timed[False][0]:.2f} s whole"
    )
    return figure, {
        "prefilled_kept": timed[True][1],
        "prefilled_whole": timed[False][1],
        "rows_alike": same,
        "logprob_max_diff": worst,
        "seconds_kept": timed[True][0],
        "seconds_whole": timed[False][0],
    }


def check_lean_decoding(ctx: Context) -> Outcome:
    """The lean decoding step (`rlstack.models.decoding.LeanDecoder`) against the model's own forward on this
    device: what it samples (float32, 32 tokens: log-probs up to rounding) and its tokens/s in the policy's
    dtype (the response length), the same rows and seeds."""
    import torch

    import rlstack.rollout.hf_sampling as hf_sampling
    from rlstack.models.decoding import LeanDecoder, why_not_lean
    from rlstack.rollout.hf_sampling import sample

    w = ctx.work
    rows = w.prompts * w.samples
    forced = lambda model, positions: LeanDecoder(model)  # noqa: E731
    real = hf_sampling.lean_decoder
    values: dict[str, float | str | list[float]] = {}
    parts = []
    for dtype, steps in (("float32", min(32, w.response_tokens)), (ctx.dtype, w.response_tokens)):
        model, _ = _engine_model(ctx, dtype)
        reason = why_not_lean(model, 64 + steps)
        if reason:
            raise CheckFailed(f"the model does not qualify for the lean step: {reason}")
        g = torch.Generator().manual_seed(2)
        prompts = [
            torch.randint(3, model.config.vocab_size, (24 + i % 8,), generator=g).tolist()
            for i in range(rows)
        ]
        runs = {}
        for lean in (False, True):
            hf_sampling.lean_decoder = forced if lean else (lambda model, positions: None)
            try:
                call = partial(
                    sample, model, prompts, steps, eos_token_id=[], pad_token_id=0, temperature=1.0,
                    seeds=torch.arange(rows), share_prefix=False,
                )  # fmt: skip
                call()  # warm-up
                _sync(ctx)
                start = time.perf_counter()
                out = call()
                _sync(ctx)
                runs[lean] = (out, time.perf_counter() - start)
            finally:
                hf_sampling.lean_decoder = real
        (a, ta), (b, tb) = runs[True], runs[False]
        P = max(map(len, prompts))
        same, worst = _agreement(
            a["input_ids"][:, P:].tolist(), b["input_ids"][:, P:].tolist(),
            a["rollout_logprobs"][:, P:].tolist(), b["rollout_logprobs"][:, P:].tolist(),
        )  # fmt: skip
        tokens = rows * steps
        values |= {
            f"{dtype}_rows_alike": same,
            f"{dtype}_logprob_max_diff": worst,
            f"{dtype}_lean_tokens_per_s": tokens / ta,
            f"{dtype}_forward_tokens_per_s": tokens / tb,
        }
        if dtype == "float32" and not worst <= TURN_TOLERANCE:
            raise CheckFailed(f"float32: the lean step's log-probs are up to {worst:.3g} from the forward's")
        parts.append(
            f"{dtype}, {steps} tokens: {same:.0%} of rows alike, |log-prob diff| <= {worst:.2g}, {tokens / ta:.0f} tokens/s lean "
            f"against {tokens / tb:.0f} forward ({tb / ta:.2f}x)"
        )
        del model
        _release(ctx)
    return f"{rows} rows; " + "; ".join(parts), values


CHECKS: list[tuple[str, Callable[[Context], Outcome]]] = [
    ("device_placement", check_device_placement),
    ("hf_rollout", check_hf_rollout),
    ("turn_cache", check_turn_cache),
    ("lean_decoding", check_lean_decoding),
    ("padding_free", check_padding_free),
    ("lora", check_lora),
    ("fsdp2_bf16", check_fsdp2_bf16),
    ("offload_one_process", check_offload_one_process),
    ("grpo_smollm2_135m", partial(check_grpo, name="smollm2-135m")),
    ("grpo_qwen2.5_1.5b", partial(check_grpo, name="qwen2.5-1.5b")),
]


# ------------------------------------------------------------------------------------------ runner


def _sync(ctx: Context) -> None:
    import torch

    if ctx.device == "cuda":
        torch.cuda.synchronize()


def _release(ctx: Context) -> None:
    """Free what a check left behind before the next one (its models are garbage by now)."""
    import torch

    gc.collect()
    if ctx.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def run_checks(cpu: bool, only: list[str] | None = None) -> dict:
    """Every check (or those named in `only`), one line each as it ends; the results by name."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    device = "cpu" if cpu else "cuda"
    print(f"# gpu_check on {device}: " + ", ".join(f"{k} {v}" for k, v in versions().items()), flush=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="rlstack-gpu-check-") as tmp:
        os.environ.setdefault("RLSTACK_CACHE", str(Path(tmp) / "cache"))
        ctx = Context(device, Path(tmp), CPU_WORK if cpu else GPU_WORK, "float32" if cpu else "bfloat16")
        for name, check in CHECKS:
            if only and name not in only:
                continue
            start = time.perf_counter()
            try:
                if not cpu and not torch.cuda.is_available():
                    raise CheckFailed("torch sees no CUDA GPU (`run --cpu` is the dry run on the CPU)")
                figure, values = check(ctx)
                passed = True
            except Exception as e:
                traceback.print_exc()
                passed, figure, values = False, _reason(e), {}
            finally:
                _release(ctx)
            results[name] = {
                "passed": passed,
                "figure": figure,
                "seconds": time.perf_counter() - start,
                "values": values,
            }
            print(f"{'PASS' if passed else 'FAIL'} {name}: {figure}", flush=True)
    return results


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "accelerate", "rlstack", *EXTRAS):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


# ------------------------------------------------------------------------------------------ bundle

RUN_SH = """#!/bin/sh
# Install rlstack and {extras} from this folder (no package index), then run the GPU checks:
#   sh run.sh [--cpu] [--json OUT] [--only CHECK,CHECK]
# PYTHON names the interpreter that holds torch, transformers, peft and accelerate (default python3).
# Packages already installed there are kept (--no-deps: nothing else is resolved); rlstack is replaced.
set -e
here=$(cd "$(dirname "$0")" && pwd)
py=${{PYTHON:-python3}}
"$py" -m pip install --quiet --no-index --no-deps --force-reinstall "$here"/rlstack-*.whl
"$py" -m pip install --quiet --no-index --no-deps --find-links "$here" {extras}
exec "$py" "$here/gpu_check.py" run "$@"
"""


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def build_rlstack_wheel(out: Path) -> None:
    """rlstack's wheel, built from a copy of the sources (the build leaves nothing in the repository)."""
    with tempfile.TemporaryDirectory(prefix="rlstack-wheel-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(ROOT / "rlstack", src / "rlstack", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, src / name)
        _pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(src))


def download_extras(out: Path, *pip_options: str) -> None:
    """The wheels of `EXTRAS` at the versions installed here, for the GPU machine's Python, from the
    package index; `pip_options` go to `pip download`."""
    from importlib.metadata import version

    platforms = [arg for p in TARGET_PLATFORMS for arg in ("--platform", p)]
    pinned = [f"{name}=={version(name)}" for name in EXTRAS]
    _pip(
        "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", TARGET_PYTHON,
        *platforms, *pip_options, "--dest", str(out), *pinned,
    )  # fmt: skip


def build_bundle(out: Path) -> list[tuple[str, int]]:
    """Write the bundle into `out` (its old wheels replaced); the (file, bytes) it holds."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    build_rlstack_wheel(out)
    download_extras(out)
    shutil.copy2(Path(__file__), out / "gpu_check.py")
    (out / "run.sh").write_text(RUN_SH.format(extras=" ".join(EXTRAS)))
    return sorted((p.name, p.stat().st_size) for p in out.iterdir() if p.is_file())


def bundle_main(out: Path) -> int:
    files = build_bundle(out)
    total = sum(size for _, size in files)
    for name, size in files:
        print(f"{size / 2**20:8.2f} MiB  {name}")
    print(f"{total / 2**20:8.2f} MiB  total in {out} (limit {BUNDLE_LIMIT / 2**20:.0f} MiB)")
    if total > BUNDLE_LIMIT:
        print(f"the bundle is over {BUNDLE_LIMIT / 2**20:.0f} MiB", file=sys.stderr)
        return 1
    print(f"on the GPU machine: sh {out}/run.sh [--json OUT]")
    return 0


def run_main(cpu: bool, json_out: str | None, only: list[str] | None = None) -> int:
    unknown = sorted(set(only or ()) - {name for name, _ in CHECKS})
    if unknown:
        print(
            f"gpu_check: no check named {unknown}; the checks: {[name for name, _ in CHECKS]}",
            file=sys.stderr,
        )
        return 2
    results = run_checks(cpu, only)
    failed = [name for name, r in results.items() if not r["passed"]]
    print(f"gpu_check: {len(results) - len(failed)} of {len(results)} checks passed", flush=True)
    if json_out:
        report = {"device": "cpu" if cpu else "cuda", "versions": versions(), "checks": results}
        Path(json_out).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("bundle", help="build the wheels a CUDA machine without a package index needs")
    b.add_argument("out_dir", type=Path)
    r = sub.add_parser("run", help="run the checks")
    r.add_argument("--cpu", action="store_true", help="on this CPU with tiny shapes and gloo (the dry run)")
    r.add_argument("--json", dest="json_out", help="write every check's result and figures here")
    r.add_argument("--only", type=lambda s: s.split(","), help="run only these checks (comma-separated)")
    r.add_argument(
        "--forward-decoding",
        action="store_true",
        help="decode every token through the model's forward, not the lean step (the side it is compared with)",
    )
    a = p.parse_args(argv)
    if a.mode == "run" and a.forward_decoding:
        import rlstack.rollout.hf_sampling as hf_sampling

        hf_sampling.lean_decoder = lambda model, positions: None
    return bundle_main(a.out_dir) if a.mode == "bundle" else run_main(a.cpu, a.json_out, a.only)


if __name__ == "__main__":
    sys.exit(main())
