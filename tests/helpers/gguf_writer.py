"""A tiny random Llama written as a GGUF file the way llama.cpp's converter writes one, for the GGUF tests.

`write_tiny_gguf(path)` builds a `LlamaForCausalLM` (hidden 64, 2 layers, 4 query heads, 2 key/value
heads, tied embeddings) over a small byte-level BPE vocabulary with ChatML special tokens, and writes it
with `gguf.GGUFWriter`: `llama.*` metadata, tensors under llama.cpp's names with the query/key rows
permuted as llama.cpp permutes them (transformers' `LlamaTensorProcessor` undoes it at load), and the
tokenizer as `tokenizer.ggml.*` (`gpt2`, i.e. byte-level BPE) plus `tokenizer.chat_template`. With
`quantize` the 2-D weight matrices are stored as Q8_0 blocks (`gguf.quants.quantize`), the norms as F32,
as in a `*-Q8_0.gguf` from llama.cpp; without it every tensor is F32. The source model (float weights,
before quantization) comes back so a test can compare what the GGUF loads as against it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quantize as gguf_quantize
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A few byte-level BPE merges ("Ġ" is the space byte), so the vocabulary is more than single bytes.
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("i", "s"), ("Ġ", "is"), ("a", "n"), ("Ġa", "n")]
SIZES = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
CONTEXT_LENGTH = 512
ROPE_THETA = 5000.0  # not the config default, so a file whose rope base were lost would not match
RMS_NORM_EPS = 1e-5


def tokenizer_vocab() -> tuple[list[str], list[int]]:
    """(tokens, token types): the 256 bytes in the byte-level alphabet, the merged tokens, then the specials."""
    spelling = bytes_to_unicode()
    tokens = [spelling[b] for b in range(256)] + [a + b for a, b in MERGES]
    types = [TokenType.NORMAL] * len(tokens)
    tokens += [PAD, IM_START, IM_END]
    types += [TokenType.CONTROL] * 3
    return tokens, [int(t) for t in types]


def build_tiny_llama(vocab_size: int, pad_id: int, eos_id: int, seed: int = 0) -> LlamaForCausalLM:
    """A random Llama whose weights are large enough that attention and every norm change the logits."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=CONTEXT_LENGTH,
        rms_norm_eps=RMS_NORM_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **SIZES,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:  # RMSNorm weights: around 1, but not all equal
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.15)
    return model


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py): rotary halves to interleaved pairs, per head."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    """The model's weights as float32 arrays under llama.cpp's llama tensor names (no `output.weight`: tied)."""
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {
        "token_embd.weight": sd["model.embed_tokens.weight"],
        "output_norm.weight": sd["model.norm.weight"],
    }
    for i in range(cfg.num_hidden_layers):
        hf = f"model.layers.{i}."
        blk = f"blk.{i}."
        out[blk + "attn_norm.weight"] = sd[hf + "input_layernorm.weight"]
        out[blk + "attn_q.weight"] = llama_cpp_permute(
            sd[hf + "self_attn.q_proj.weight"], cfg.num_attention_heads, cfg.num_attention_heads
        )
        out[blk + "attn_k.weight"] = llama_cpp_permute(
            sd[hf + "self_attn.k_proj.weight"], cfg.num_attention_heads, cfg.num_key_value_heads
        )
        out[blk + "attn_v.weight"] = sd[hf + "self_attn.v_proj.weight"]
        out[blk + "attn_output.weight"] = sd[hf + "self_attn.o_proj.weight"]
        out[blk + "ffn_norm.weight"] = sd[hf + "post_attention_layernorm.weight"]
        out[blk + "ffn_gate.weight"] = sd[hf + "mlp.gate_proj.weight"]
        out[blk + "ffn_up.weight"] = sd[hf + "mlp.up_proj.weight"]
        out[blk + "ffn_down.weight"] = sd[hf + "mlp.down_proj.weight"]
    return out


def write_tiny_gguf(path: Path, quantize: bool = True, seed: int = 0) -> LlamaForCausalLM:
    """Write a tiny Llama with its tokenizer to `path` as GGUF (Q8_0 matrices with `quantize`, else all F32);
    return the source model."""
    tokens, types = tokenizer_vocab()
    pad_id, eos_id = tokens.index(PAD), tokens.index(IM_END)
    model = build_tiny_llama(len(tokens), pad_id, eos_id, seed)
    cfg = model.config

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, "llama")
    writer.add_name("tiny-llama")  # a name with "mistral" in it would make transformers read a Mistral
    writer.add_file_type(LlamaFileType.MOSTLY_Q8_0 if quantize else LlamaFileType.ALL_F32)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    writer.add_vocab_size(len(tokens))

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_bos_token_id(pad_id)
    writer.add_eos_token_id(eos_id)
    writer.add_pad_token_id(pad_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    for name, weights in gguf_tensors(model).items():
        if quantize and weights.ndim == 2:
            blocks = gguf_quantize(weights, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, np.ascontiguousarray(weights, dtype=np.float32))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
