"""Tiny models and tokenizers built entirely offline.

`build_char_tokenizer` makes a character-level `PreTrainedTokenizerFast` (a `tokenizers`
WordLevel model over printable ASCII) with Qwen-style `<|im_start|>` / `<|im_end|>` special
tokens and a Jinja chat template; `build_tiny_qwen2` makes a randomly initialised Qwen2 causal LM
sized for CPU. Both save with `save_pretrained` and reload with the `Auto*` classes.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character, plus the three special tokens."""
    chars = sorted(set(string.printable) - {"\x0b", "\x0c", "\r"})
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, *chars])}
    vocab["<unk>"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token=PAD,
        eos_token=EOS,
        bos_token=None,
        additional_special_tokens=[BOS],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def build_tiny_qwen2(
    vocab_size: int,
    hidden_size: int = 128,
    num_layers: int = 3,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    pad_token_id: int = 0,
    eos_token_id: int = 2,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def init_model(
    out_dir: str | Path,
    hidden_size: int = 128,
    num_layers: int = 3,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
) -> Path:
    """Write a tiny Qwen2 model and its tokenizer to `out_dir` (what `rlstack init-model` does)."""
    out = Path(out_dir)
    tok = build_char_tokenizer()
    model = build_tiny_qwen2(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        seed=seed,
    )
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
