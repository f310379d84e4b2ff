"""One decoding step of a Llama-family causal LM (Llama, Mistral, Qwen2, Qwen3, and the language model
of Qwen2-VL, Qwen2.5-VL and Qwen3-VL), in as few tensor operations as the architecture allows.

A decoding step gives each row one new token; on a small model its time goes mostly to dispatching
operations (on a GPU: launching kernels), not to arithmetic. The Hugging Face module makes about 400 top-level calls per
step for a 3-layer model: it builds a four-dimensional mask, casts, transposes, repeats key/value heads
and goes through its cache and attention interfaces. `LeanDecoder.step` computes the same function of
the same parameters with about 25 calls per layer: RMS norms through `F.rms_norm`, the projections as
single matrix products, RoPE from the model's own rotary module and function, and attention as two
matrix products over grouped heads (`grouped_attention`, shared with `small_query_attention`) into the
KV buffers the prefill filled. It reads the module's parameters at every
step (never a copy), so weights loaded or trained in place between steps are the weights it uses.

`lean_decoder` says which models qualify: these architectures, their linear layers plain or with peft's
LoRA adapters (`Projection`: the policy with `worker.actor.model.lora.rank > 0` samples through the step
too); any other model (another architecture, a LoRA variant such as DoRA, a sliding window shorter than
the generation, training mode) decodes through its own `forward`. The two agree up to float rounding (tests/integration/test_lean_decoding.py). On the GRPO
benchmark's generation (the tiny model, 128 rows, 16 new tokens), a whole `sample` call takes 57-63 ms
with the lean step against 67-75 ms through the module (two runs) (`python bench/bench_cpu_paths.py`, "decoding").
On one H200 (`bench/gpu_check.py`'s `lean_decoding`, a SmolLM2-135M-shaped model, 32 rows), 1,429
tokens/s against 1,046 in bfloat16 over 128 tokens (1.37x), and 2,058 against 1,585 in float32 over 32
tokens (1.30x), where the samples agree with the module's to 1.9e-6 in log-prob.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from rlstack.models.attention import grouped_attention

ARCHITECTURES = {
    "LlamaForCausalLM": ("LlamaDecoderLayer", "LlamaRMSNorm"),
    "MistralForCausalLM": ("MistralDecoderLayer", "MistralRMSNorm"),
    "Qwen2ForCausalLM": ("Qwen2DecoderLayer", "Qwen2RMSNorm"),
    "Qwen3ForCausalLM": ("Qwen3DecoderLayer", "Qwen3RMSNorm"),
    "Qwen2VLForConditionalGeneration": ("Qwen2VLDecoderLayer", "Qwen2VLRMSNorm"),
    "Qwen2_5_VLForConditionalGeneration": ("Qwen2_5_VLDecoderLayer", "Qwen2_5_VLRMSNorm"),
    "Qwen3VLForConditionalGeneration": ("Qwen3VLTextDecoderLayer", "Qwen3VLTextRMSNorm"),
}
"""Classes whose decoding step `LeanDecoder` computes, with their decoder layer and norm classes. For the
Qwen-VL families it is the language model's step: a decoded token carries no image, and its M-RoPE
position is the same id in all three dimensions, which the model's own rotary module turns into the
plain rotary embedding of that id."""


def _text_model(model: nn.Module) -> nn.Module:
    """The decoder stack (embeddings, layers, final norm, rotary module): a vision-language model's language model."""
    return getattr(model.model, "language_model", model.model)


def _unwrapped(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a peft `PeftModel` (LoRA adapters on the policy), else `model` (a model
    whose layers peft or transformers' `load_adapter` wrapped in place is its own decoder stack)."""
    base = getattr(model, "get_base_model", None)
    return base() if callable(base) else model


PROJECTIONS = (
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
)
"""A decoder layer's linear layers, by (submodule, name)."""


MERGE_ADAPTERS = True
"""Whether float32 LoRA adapters on CPU are merged into one weight per layer for the step (`Projection`);
False computes them apart, as peft does (the benchmark's other side, `bench/bench_decoding.py --compare
merged-lora`)."""

MERGE_BUDGET_BYTES = 2 << 30
"""Most memory the merged weights of one `LeanDecoder` may take (SmolLM2-135M-Instruct's: 425 MB); a larger
model's adapters are computed apart."""


class Projection:
    """One linear layer of the step: a plain `nn.Linear`, or peft's LoRA `Linear` around one, computed as
    peft computes it (the base layer's product plus `lora_B(lora_A(x)) * scaling` of each active adapter,
    the input cast to the adapters' dtype and the sum back to the base's) with fewer calls. It holds the
    modules, not their tensors: weights changed in place between steps are the weights it uses. Which
    adapters are active, merged or disabled, and their scaling, are read when it is made (a `LeanDecoder`
    is made per `sample` call, and nothing switches adapters during one).

    Float32 adapters without biases on CPU are merged (`mergeable`, which `LeanDecoder` keeps within
    `MERGE_BUDGET_BYTES`): the step multiplies by one weight, the base's plus each adapter's
    `scaling * B @ A`, made when first used and made again when any of those tensors has changed in place
    since (their version counters), instead of three products and two passes over the output per adapter
    at every step, which on a CPU cost more than the arithmetic (docs/speed.md). The same function up to
    float rounding; in other dtypes the adapters are computed as peft does (a merged weight would be
    rounded), and on a GPU, where the products are cheap and memory is not."""

    def __init__(self, base: nn.Linear, adapters: tuple[tuple[nn.Linear, nn.Linear, float], ...] = ()):
        self.base = base
        self.adapters = adapters
        """(lora_A, lora_B, scaling) of each active adapter; empty for a plain layer or merged adapters."""
        tensors = [base.weight] + [t for a, b, _ in adapters for t in (a.weight, b.weight)]
        self._tensors = tensors + ([base.bias] if base.bias is not None else [])
        self.mergeable = (
            MERGE_ADAPTERS
            and bool(adapters)
            and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
            and all(a.bias is None and b.bias is None for a, b, _ in adapters)
        )
        self._merged: torch.Tensor | None = None
        self._versions: tuple[int, ...] = ()

    @staticmethod
    def of(module: nn.Module) -> Projection | str:
        """The projection of `module`, or why the step cannot compute it."""
        if type(module) is nn.Linear:
            return Projection(module)
        base = getattr(module, "base_layer", None)
        if type(base) is not nn.Linear or not hasattr(module, "lora_A"):
            return f"a {type(module).__name__}, neither a linear layer nor LoRA adapters on one"
        if module.disable_adapters or module.merged:  # peft computes the base layer alone
            return Projection(base)
        adapters = []
        for name in module.active_adapters:
            if name not in module.lora_A:
                continue
            if name in getattr(module, "lora_variant", {}):
                return f"its adapter {name!r} is a LoRA variant ({type(module.lora_variant[name]).__name__})"
            a, b, dropout = module.lora_A[name], module.lora_B[name], module.lora_dropout[name]
            if type(a) is not nn.Linear or type(b) is not nn.Linear:
                return f"its adapter {name!r} is not a pair of linear layers"
            if not isinstance(dropout, (nn.Identity, nn.Dropout)):
                return f"its adapter {name!r} has a {type(dropout).__name__} on its input"
            adapters.append((a, b, module.scaling[name]))
        return Projection(base, tuple(adapters))

    def versions(self) -> tuple[int, ...]:
        """The version counters of the tensors the merged weight is made of (each in-place change bumps one)."""
        return tuple(t._version for t in self._tensors)

    def merge_into(self, out: torch.Tensor) -> None:
        """Write the merged weight (`[out_features, in_features]`) into `out`."""
        out.copy_(self.base.weight.detach())
        for a, b, scaling in self.adapters:
            out.addmm_(b.weight.detach(), a.weight.detach(), alpha=scaling)

    @property
    def weight(self) -> torch.Tensor:
        """The weight the step multiplies by: the base's, or merged with the adapters (`mergeable`)."""
        if not self.mergeable:
            return self.base.weight
        versions = self.versions()
        if self._merged is None or versions != self._versions:
            if self._merged is None:
                self._merged = torch.empty_like(self.base.weight, requires_grad=False)
            self.merge_into(self._merged)
            self._versions = versions
        return self._merged

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mergeable or not self.adapters:
            return F.linear(x, self.weight, self.base.bias)
        return self._adapted(F.linear(x, self.base.weight, self.base.bias), x)

    def add(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`residual + self(x)`, in one matrix product where the layer is a plain or merged one without a
        bias (with adapters computed apart, in the module's order: the layer's output first, then the
        residual)."""
        if self.base.bias is not None or (self.adapters and not self.mergeable):
            return residual + self(x)
        return torch.addmm(residual, x, self.weight.t())

    def _adapted(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        dtype = y.dtype
        for a, b, scaling in self.adapters:
            x = x.to(a.weight.dtype)
            y = y + F.linear(F.linear(x, a.weight, a.bias), b.weight, b.bias) * scaling
        return y.to(dtype)


class Fused:
    """Merged projections of the same input computed as one product (a layer's q, k and v; its gate and up):
    their merged weights made into one tensor, one after the other (made again when any of their tensors
    changed in place), and the output split back. Only over merged projections, whose weights are copies
    already: it copies nothing more of the module's (the members keep no merged weight of their own)."""

    def __init__(self, members: list[Projection]):
        self.members = members
        self.sizes = [p.base.out_features for p in members]
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self._versions: tuple[int, ...] = ()

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        versions = tuple(v for p in self.members for v in p.versions())
        if self._weight is None or versions != self._versions:
            first = self.members[0].base.weight
            if self._weight is None:
                self._weight = first.new_empty((sum(self.sizes), first.shape[1]), requires_grad=False)
            for p, rows in zip(self.members, self._weight.split(self.sizes)):
                p.merge_into(rows)
            biases = [p.base.bias for p in self.members]
            self._bias = (
                None
                if all(b is None for b in biases)
                else torch.cat(
                    [b.detach() if b is not None else first.new_zeros(n) for b, n in zip(biases, self.sizes)]
                )
            )
            self._versions = versions
        return F.linear(x, self._weight, self._bias).split(self.sizes, -1)


def why_not_lean(model: nn.Module, positions: int) -> str | None:
    """Why `model` cannot decode through `LeanDecoder` for `positions` positions (prompt and response), or
    None when it can."""
    kinds = {str(getattr(c, "peft_type", "LORA")) for c in getattr(model, "peft_config", {}).values()}
    if kinds - {"LORA", "PeftType.LORA"}:
        return f"its peft adapters are {sorted(kinds)}, not LoRA only"
    model = _unwrapped(model)
    name = type(model).__name__
    if name not in ARCHITECTURES:
        return f"{name} is not one of {sorted(ARCHITECTURES)}"
    if model.training:
        return "the model is in training mode (the step has no dropout)"
    layer_class, norm_class = ARCHITECTURES[name]
    core = _text_model(model)
    norms = [core.norm]
    for i, layer in enumerate(core.layers):
        attn = layer.self_attn
        if type(layer).__name__ != layer_class:
            return f"layer {i} is a {type(layer).__name__}"
        for part, name in PROJECTIONS:
            projection = Projection.of(getattr(getattr(layer, part), name))
            if isinstance(projection, str):
                return f"layer {i}'s {part}.{name} is {projection}"
        # Qwen2 / Qwen3 set a window per layer (None: full attention); Mistral's attention reads its config's
        window = (
            attn.sliding_window
            if hasattr(attn, "sliding_window")
            else getattr(model.config.get_text_config(), "sliding_window", None)
        )
        if window is not None and window < positions:
            return (
                f"layer {i} attends through a sliding window of {window} positions, shorter than {positions}"
            )
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [attn.q_norm, attn.k_norm] if hasattr(attn, "q_norm") else []
    if any(type(n).__name__ != norm_class for n in norms):
        return f"a norm is not a {norm_class}"
    return None


def lean_decoder(model: nn.Module, positions: int) -> LeanDecoder | None:
    """A `LeanDecoder` over `model`, or None when the model does not qualify (see `why_not_lean`)."""
    return None if why_not_lean(model, positions) else LeanDecoder(model)


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """The Hugging Face RMSNorm of these models: computed in float32, scaled by the weight in the model's dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), None, norm.variance_epsilon).to(x.dtype)


class LeanDecoder:
    """The decoding step of a qualifying model (see `why_not_lean`), over its own parameters."""

    def __init__(self, model: nn.Module):
        model = _unwrapped(model)
        self.model = model
        self.core = _text_model(model)
        self.projections = [
            {name: Projection.of(getattr(getattr(layer, part), name)) for part, name in PROJECTIONS}
            for layer in self.core.layers
        ]
        """Each layer's linear layers (`Projection`), by name."""
        merged = [p for layer in self.projections for p in layer.values() if p.mergeable]
        if sum(p.base.weight.numel() * 4 for p in merged) > MERGE_BUDGET_BYTES:
            for p in merged:
                p.mergeable = False
        self.fused = [
            {
                group[0]: Fused([layer[n] for n in group])
                for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
                if all(layer[n].mergeable for n in group)
            }
            for layer in self.projections
        ]
        """Per layer, the groups of merged projections of one input computed as one product, by first name."""
        self.mrope = self.core is not model.model
        """A vision-language model: positions go to its rotary module as M-RoPE's three (equal) rows."""
        attn = self.core.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.groups = attn.num_key_value_groups
        self.scaling = attn.scaling
        self.qk_norm = hasattr(attn, "q_norm")
        self.rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        """The model's own RoPE function (its module's `apply_rotary_pos_emb`)."""

    @torch.inference_mode()
    def step(
        self,
        tokens: torch.Tensor,  # [B]: each row's newest token
        positions: torch.Tensor,  # [B]: its position id
        keys: list[torch.Tensor],  # per layer, [B, KV, capacity, D]; columns before `column` filled
        values: list[torch.Tensor],  # per layer, [B, KV, capacity, D]
        column: int,  # the cache column the new token's keys and values go to
        blocked: torch.Tensor,  # [B, capacity] bool: columns a row does not attend (its prompt padding)
    ) -> torch.Tensor:
        """Next-token logits [B, V] after `tokens`, writing their keys and values into column `column`."""
        B, D, g = tokens.shape[0], self.head_dim, self.groups
        x = self.core.embed_tokens(tokens)  # [B, hidden]
        rows = positions[None, :, None].expand(3, B, 1) if self.mrope else positions[:, None]
        cos, sin = self.core.rotary_emb(x[:, None], rows)  # [B, 1, D]
        cos, sin = cos[:, 0], sin[:, 0]  # [B, D]: unsqueezed to [B, 1, D] against [B, heads, D]
        L = column + 1
        mask = blocked[:, None, None, None, :L]  # [B, KV, g, Q=1, L]
        for layer, proj, fused, k_cache, v_cache in zip(
            self.core.layers, self.projections, self.fused, keys, values
        ):
            attn, mlp = layer.self_attn, layer.mlp
            h = _rms_norm(x, layer.input_layernorm)
            if "q_proj" in fused:
                q, k, v = fused["q_proj"](h)
            else:
                q, k, v = proj["q_proj"](h), proj["k_proj"](h), proj["v_proj"](h)
            q, k = q.reshape(B, -1, D), k.reshape(B, -1, D)
            if self.qk_norm:
                q, k = _rms_norm(q, attn.q_norm), _rms_norm(k, attn.k_norm)
            q, k = self.rope(q, k, cos, sin, unsqueeze_dim=1)
            k_cache[:, :, column] = k
            v_cache[:, :, column] = v.view(B, -1, D) if v.is_contiguous() else v.reshape(B, -1, D)
            grouped = q.view(
                B, k_cache.shape[1], g, 1, D
            )  # query heads kv*g .. kv*g+g-1 read key/value head kv
            out = grouped_attention(grouped, k_cache[:, :, :L], v_cache[:, :, :L], self.scaling, blocked=mask)
            out = out.view(B, -1)  # [B, H * D]
            x = proj["o_proj"].add(x, out)
            h = _rms_norm(x, layer.post_attention_layernorm)
            gate, up = (
                fused["gate_proj"](h) if "gate_proj" in fused else (proj["gate_proj"](h), proj["up_proj"](h))
            )
            x = proj["down_proj"].add(x, mlp.act_fn(gate) * up)
        return self.model.lm_head(_rms_norm(x, self.core.norm))
