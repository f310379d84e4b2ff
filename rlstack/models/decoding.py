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

`lean_decoder` says which models qualify; any other model (LoRA adapters, another architecture, a
sliding window shorter than the generation, training mode) decodes through its own `forward`. The two agree up to float rounding (tests/integration/test_lean_decoding.py). On the GRPO
benchmark's generation (the tiny model, 128 rows, 16 new tokens), a whole `sample` call takes 57-63 ms
with the lean step against 67-75 ms through the module (two runs) (`python bench/bench_cpu_paths.py`, "decoding").
On one H200 (`bench/gpu_check.py`'s `lean_decoding`, a SmolLM2-135M-shaped model, 32 rows x 128 tokens),
1,429 tokens/s against 1,046 in bfloat16 (1.37x) and 2,058 against 1,585 in float32 (1.30x), where the
samples agree with the module's to 1.9e-6 in log-prob.
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


def why_not_lean(model: nn.Module, positions: int) -> str | None:
    """Why `model` cannot decode through `LeanDecoder` for `positions` positions (prompt and response), or
    None when it can."""
    name = type(model).__name__
    if name not in ARCHITECTURES:
        return f"{name} is not one of {sorted(ARCHITECTURES)}"
    if model.training:
        return "the model is in training mode (the step has no dropout)"
    layer_class, norm_class = ARCHITECTURES[name]
    core = _text_model(model)
    norms = [core.norm]
    for i, layer in enumerate(core.layers):
        attn, mlp = layer.self_attn, layer.mlp
        if type(layer).__name__ != layer_class:
            return f"layer {i} is a {type(layer).__name__}"
        linears = [
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        ]
        if any(type(m) is not nn.Linear for m in linears):
            return f"layer {i} has projections that are not plain linear layers (adapters?)"
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


def _linear_add(residual: torch.Tensor, x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """`residual + linear(x)` in one matrix product where the layer has no bias."""
    if linear.bias is None:
        return torch.addmm(residual, x, linear.weight.t())
    return residual + linear(x)


class LeanDecoder:
    """The decoding step of a qualifying model (see `why_not_lean`), over its own parameters."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.core = _text_model(model)
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
        for layer, k_cache, v_cache in zip(self.core.layers, keys, values):
            attn, mlp = layer.self_attn, layer.mlp
            h = _rms_norm(x, layer.input_layernorm)
            q = attn.q_proj(h).view(B, -1, D)
            k = attn.k_proj(h).view(B, -1, D)
            if self.qk_norm:
                q, k = _rms_norm(q, attn.q_norm), _rms_norm(k, attn.k_norm)
            q, k = self.rope(q, k, cos, sin, unsqueeze_dim=1)
            k_cache[:, :, column] = k
            v_cache[:, :, column] = attn.v_proj(h).view(B, -1, D)
            grouped = q.view(
                B, k_cache.shape[1], g, 1, D
            )  # query heads kv*g .. kv*g+g-1 read key/value head kv
            out = grouped_attention(grouped, k_cache[:, :, :L], v_cache[:, :, :L], self.scaling, blocked=mask)
            out = out.view(B, -1)  # [B, H * D]
            x = _linear_add(x, out, attn.o_proj)
            h = _rms_norm(x, layer.post_attention_layernorm)
            x = _linear_add(x, mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h), mlp.down_proj)
        return self.model.lm_head(_rms_norm(x, self.core.norm))
