"""LoRA adapters on the policy, through `peft`.

The policy becomes a `PeftModel`: the base weights are frozen, only the adapters train (and sit in the
optimizer). What the rest of rlstack needs from it:
- `merged_weights`: the base weights with each adapter's update added, under the base model's Hugging
  Face names: what a rollout engine that does not share the module loads, and what the final model
  and `rlstack merge` write. Computed out of place, so the base weights never drift from merging and
  unmerging.
- the reference model is the base with the adapters switched off (`peft_model.disable_adapter()`),
  not a second copy.
- checkpoints hold the adapters only (`save_adapter` / `load_adapter`).

Each adapted linear layer (peft's `lora.Linear`, its class swapped for `FusedLoraLinear`) computes peft's
`base(x) + lora_B(lora_A(dropout(x))) * scaling` as `base(x) + lora_B(lora_A(dropout(x)) * scaling)`, the
sum inside the last matrix product (`_fused_forward`): the scaling multiplies the rank-r activations
instead of the layer's output, and no pass adds two outputs. With a power-of-two scaling (alpha = 2 x rank,
rlstack's default) the products are the same numbers; the sum rounds within the product. Where the input
and the adapters differ in dtype (peft keeps adapters in float32 on a bfloat16 model), peft's own forward
runs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rlstack.config import LoraConfig
from rlstack.errors import RLStackError

ADAPTER = "default"
"""peft's name of the one adapter."""


def _peft():
    try:
        import peft
    except ImportError as e:
        raise RLStackError(
            "worker.actor.model.lora.rank > 0 needs the peft package: pip install 'rlstack[lora]'"
        ) from e
    return peft


def add_lora(model: torch.nn.Module, cfg: LoraConfig, freeze_vision_tower: bool = False) -> torch.nn.Module:
    """`model` with LoRA adapters (`cfg`) and its base weights frozen; with `freeze_vision_tower` a
    vision-language model's vision encoder (`model.visual`) gets no adapters, so it does not train; nor
    do the modules whose whole name `cfg.exclude_modules` matches."""
    peft = _peft()
    targets = cfg.target_modules
    excluded = [r".*\bvisual\b.*"] if freeze_vision_tower else []
    excluded += [cfg.exclude_modules] if cfg.exclude_modules is not None else []
    config = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules="all-linear" if list(targets) == ["all-linear"] else list(targets),
        exclude_modules="|".join(f"(?:{x})" for x in excluded) or None,
        task_type="CAUSAL_LM",
    )
    try:
        model = peft.get_peft_model(model, config)
    except ValueError as e:
        raise RLStackError(f"worker.actor.model.lora.target_modules={list(targets)}: {e}") from e
    from peft.tuners.lora import Linear

    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = _fused_class()  # peft's layer with `_fused_forward` (picklable by name)
    return model


def _fused_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """peft's `lora.Linear.forward` with one active adapter of two plain linear layers without biases, all
    in `x`'s dtype: `base(x) + lora_B(lora_A(dropout(x)) * scaling)`, the sum in the last product (see the
    module's docstring); anything else (adapters off or merged, several, a LoRA variant, adapters in another
    dtype than the input, as peft keeps them in float32 on a bfloat16 model, extra arguments) goes to
    peft's own forward."""
    base = self.base_layer
    active = [name for name in self.active_adapters if name in self.lora_A]
    plain = not (args or kwargs or self.disable_adapters or self.merged) and len(active) == 1
    if plain:
        name = active[0]
        a, b = self.lora_A[name], self.lora_B[name]
        plain = (
            name not in self.lora_variant
            and type(base) is nn.Linear
            and type(a) is nn.Linear
            and type(b) is nn.Linear
            and a.bias is None
            and b.bias is None
            and x.dtype == base.weight.dtype == a.weight.dtype == b.weight.dtype
        )
    if not plain:
        return _fused_class().__bases__[0].forward(self, x, *args, **kwargs)
    y = F.linear(x, base.weight, base.bias)
    h = F.linear(self.lora_dropout[name](x), a.weight) * self.scaling[name]
    return torch.addmm(y.reshape(-1, y.shape[-1]), h.reshape(-1, h.shape[-1]), b.weight.t()).view(y.shape)


@functools.cache
def _fused_class() -> type:
    """peft's `lora.Linear` with `_fused_forward`, made once (peft is imported only with LoRA)."""
    from peft.tuners.lora import Linear

    return type("FusedLoraLinear", (Linear,), {"forward": _fused_forward, "__module__": __name__})


def __getattr__(name: str):
    if name == "FusedLoraLinear":  # where pickle finds the class of a policy's adapted layers
        return _fused_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights with the adapters' updates added, under the base model's names."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            weight = module.get_base_layer().weight
            merged[f"{name}.weight"] = weight.detach() + module.get_delta_weight(ADAPTER).detach().to(
                weight.dtype
            )
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        yield name, merged.get(name, tensor.detach())


def save_adapter(model: torch.nn.Module, path: Path) -> None:
    """The adapters (`adapter_model.safetensors`, `adapter_config.json`: peft's format) into `path`."""
    model.save_pretrained(path)


def load_adapter(model: torch.nn.Module, path: Path) -> None:
    """The adapters saved in `path` into `model`'s own parameters (in place: an optimizer stays attached)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(path / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys:
        raise RLStackError(
            f"the adapters in {path} do not fit worker.actor.model.lora (missing {missing[:3]}, unexpected "
            f"{list(result.unexpected_keys)[:3]}): resume with the LoRA settings the run was started with"
        )


def merge_adapter_dir(adapter_dir: Path, base_path: str) -> torch.nn.Module:
    """The base model at `base_path` with the adapters of `adapter_dir` merged into its weights."""
    peft = _peft()
    from rlstack.models.loading import load_causal_lm

    base = load_causal_lm(base_path)
    return peft.PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
