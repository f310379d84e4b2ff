"""`rlstack merge CHECKPOINT --out DIR`: a checkpoint's policy as a Hugging Face model directory.

A checkpoint of a sharded run (`trainer.backend=ray` with several ranks) keeps the policy as
`torch.distributed.checkpoint` shards (`actor_dcp/`) beside its config, tokenizer and processor
(`model/`). Merging loads the shards into one model in this process (any number of ranks may have
written them; no process group is needed) and writes it with `save_pretrained`, so that it loads
with `from_pretrained` (as EasyR1's model merger does for FSDP shards). A one-process checkpoint
already holds the Hugging Face model in `model/`: it is copied. A LoRA run's checkpoint holds the
adapters in `model/` (peft's format, with the base model's path in `adapter_config.json`): they are
merged into the base weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from rlstack.checkpoint import default_modes
from rlstack.errors import RLStackError
from rlstack.models.loading import DTYPES, is_vision_model


def merge_checkpoint(checkpoint: Path, out: Path) -> Path:
    """Write the policy of `checkpoint` (a `global_step_N` directory) to `out` in Hugging Face format."""
    model_dir, shards = checkpoint / "model", checkpoint / "actor_dcp"
    if not (checkpoint / "trainer_state.pt").is_file() or not (model_dir / "config.json").is_file():
        raise RLStackError(
            f"{checkpoint} is not an rlstack checkpoint (no trainer_state.pt and model/config.json): pass a "
            "checkpoints/global_step_N directory of a run"
        )
    out.mkdir(parents=True, exist_ok=True)
    if (model_dir / "adapter_config.json").is_file():
        _merge_adapters(model_dir, out)
    elif not shards.is_dir():
        shutil.copytree(model_dir, out, dirs_exist_ok=True)
    else:
        _merge_shards(model_dir, shards, out)
    default_modes(out)  # save_pretrained's safetensors are 0600; a copy keeps an older checkpoint's modes
    return out


def _merge_shards(model_dir: Path, shards: Path, out: Path) -> None:
    """The `torch.distributed.checkpoint` shards of the policy as one model, with `model_dir`'s tokenizer files."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_dir)
    auto_class = AutoModelForImageTextToText if is_vision_model(str(model_dir)) else AutoModelForCausalLM
    dtype = DTYPES.get(str(getattr(config, "dtype", None) or "float32").removeprefix("torch."), torch.float32)
    model = auto_class.from_config(config, dtype=dtype)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=shards)  # only the model's entries; the optimizer's stay on disk
    model.load_state_dict(state["model"])
    for f in model_dir.iterdir():  # tokenizer, processor, chat template
        if f.is_file() and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    model.save_pretrained(out)


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "config.json", "README.md")


def _merge_adapters(model_dir: Path, out: Path) -> None:
    """The base model named in the adapters' config with the adapters merged in, and the tokenizer files."""
    import json

    from rlstack.models.lora import merge_adapter_dir

    base = json.loads((model_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise RLStackError(
            f"the adapters in {model_dir} were trained on {base!r}, which is not a model directory here: merging "
            "needs the base model they were trained on at that path"
        )
    model = merge_adapter_dir(model_dir, base)
    for f in model_dir.iterdir():  # tokenizer, processor, chat template
        if f.is_file() and f.name not in ADAPTER_FILES:
            shutil.copy2(f, out / f.name)
    model.save_pretrained(out)
