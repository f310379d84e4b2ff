"""`worker.actor.model.*`: the policy model, its LoRA adapters and its chat template."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rlstack.config.fields import field
from rlstack.config.paths import (
    BUILTIN_MODEL,
    BUILTIN_MODELS,
    chat_template_text,
    is_template_text,
    path_problem,
    path_problems,
)

if TYPE_CHECKING:
    from rlstack.config.schema import Config


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank of the policy's adapters (peft); 0: train every weight."""
    alpha: int = 16
    """LoRA scaling numerator: the adapter's update is scaled by alpha / rank."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Modules that get adapters, by name (q_proj, v_proj, ...); [all-linear]: every linear layer but the output head (peft's all-linear)."""
    dropout: float = 0.0
    """Dropout on the adapters' input in training."""
    exclude_modules: str | None = None
    """Modules that get no adapters: a regular expression their whole name matches (EasyR1's `.*visual.*`: not the vision encoder; peft's exclude_modules)."""


@dataclass
class ModelConfig:
    model_path: str = BUILTIN_MODEL
    """Hugging Face model: a local directory, a Hub name (org/name[@revision], fetched into the Hub cache), `builtin:tiny-qwen2`, a GGUF file (`.gguf`, dequantized once into a cached directory), or a NeMo RL checkpoint (`step_N` or its `policy/weights`, written once as a Hugging Face directory)."""
    gguf_file: str | None = None
    """A GGUF file inside the `model_path` folder to load instead of its Hugging Face weights (transformers' `gguf_file`)."""
    tokenizer_path: str | None = None
    """Tokenizer directory when it differs from `model_path`."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the trained model (bfloat16 on a GPU; on CPU only where the CPU supports it)."""
    trust_remote_code: bool = False
    """Allow model code shipped inside the model directory."""
    chat_template: str | None = None
    """Policy: a Jinja chat template (or a .jinja file) in place of the tokenizer's own, for prompts and the agent's turns, saved with checkpoints (EasyR1's data.override_chat_template)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them (less memory, ~30% more compute)."""
    attn_implementation: Literal["sdpa", "flash_attention_2", "eager"] = "sdpa"
    """Attention kernel (flash_attention_2 needs a CUDA GPU and the flash-attn package); with sdpa on CPU, blocks of at most 16 queries per row (decoding steps, short continuations) take matrix products instead of SDPA's CPU kernel, up to 3x faster over short contexts (`rlstack.models.attention`)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Policy only: train LoRA adapters instead of every weight (`pip install 'rlstack[lora]'`); the reference is the base with the adapters switched off, checkpoints hold the adapters, the rollout engine gets the merged weights."""


def model_rules(cfg: Config, p: list[str]) -> None:
    """LoRA's settings, the model's paths, its attention kernel, its chat template."""
    m, t = cfg.worker.actor.model, cfg.trainer
    lora = m.lora
    if lora.rank < 0 or lora.alpha <= 0 or not 0 <= lora.dropout < 1 or not lora.target_modules:
        p.append(
            f"worker.actor.model.lora: rank = {lora.rank} (0: off, else > 0), alpha = {lora.alpha} (> 0), "
            f"dropout = {lora.dropout} (in [0, 1)), target_modules = {list(lora.target_modules)} (not empty): fix "
            "the one out of range"
        )
    if lora.exclude_modules is not None:
        try:
            re.compile(lora.exclude_modules)
        except re.error as e:
            p.append(
                f"worker.actor.model.lora.exclude_modules = {lora.exclude_modules!r} is not a regular expression "
                f"({e}): write one that the whole name of each module to leave out matches, e.g. '.*visual.*'"
            )
    world = t.nnodes * t.n_gpus_per_node
    if t.backend == "ray" and min(t.nnodes, t.n_gpus_per_node) >= 1 and world > 1 and lora.rank > 0:
        p.append(
            f"worker.actor.model.lora.rank = {lora.rank} with {world} policy ranks: LoRA is "
            "built for one policy rank so far (trainer.nnodes=1 trainer.n_gpus_per_node=1); FSDP2-sharded "
            "adapters are not"
        )
    path_problems(
        p,
        ("worker.actor.model.model_path", m.model_path),
        ("worker.actor.model.tokenizer_path", m.tokenizer_path),
    )
    builtin_model_problems(p, "worker.actor.model.model_path", m.model_path)
    if m.gguf_file and not path_problem("worker.actor.model.model_path", m.model_path):
        gguf = Path(os.path.expanduser(m.model_path)) / m.gguf_file
        if not gguf.is_file():
            p.append(
                f"worker.actor.model.gguf_file: {str(gguf)!r} does not exist (gguf_file names a file inside the "
                f"local model_path folder, relative to {os.getcwd()}; a GGUF on the Hugging Face Hub must be "
                "downloaded first; or set model_path to the .gguf file itself and leave gguf_file unset)"
            )
    if m.attn_implementation == "flash_attention_2" and m.dtype == "float32":
        p.append(
            "worker.actor.model.attn_implementation = flash_attention_2 with worker.actor.model.dtype = float32: "
            "FlashAttention computes only in bfloat16 or float16; set worker.actor.model.dtype=bfloat16 "
            "(the trained weights keep float32 master copies), or use sdpa"
        )
    p += chat_template_problems(m.chat_template)


def builtin_model_problems(p: list[str], key: str, path: str | None) -> None:
    """A `builtin:` model path that names no built-in model."""
    if path and path.startswith("builtin:") and path not in BUILTIN_MODELS:
        p.append(f"{key}: unknown built-in model {path!r}; built-in models: {', '.join(BUILTIN_MODELS)}")


def chat_template_problems(template: str | None) -> list[str]:
    """A chat template file that is not there, or a template Jinja cannot parse (with the line it stops at)."""
    if not template:
        return []
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    key = "worker.actor.model.chat_template"
    if not is_template_text(template) and not os.path.isfile(template):
        return [
            f"{key}: file {template!r} does not exist (the value is Jinja text, with {{{{ or {{%, or a template file)"
        ]
    text = chat_template_text(template)
    # the environment Hugging Face renders chat templates in: loop controls, and its {% generation %} tag
    extensions = [jinja2.ext.loopcontrols, _generation_tag()]
    try:
        jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=extensions).parse(text)
    except jinja2.TemplateSyntaxError as e:
        where = "the template" if is_template_text(template) else template
        return [f"{key}: {where}, line {e.lineno}: {e.message}; fix the Jinja there"]
    return []


def _generation_tag() -> type:
    import jinja2.ext

    class GenerationTag(jinja2.ext.Extension):
        """Hugging Face's `{% generation %}...{% endgeneration %}` (assistant-token masks), parsed as its body."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return GenerationTag
