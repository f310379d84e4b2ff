"""GGUF checkpoints (llama.cpp's single-file format) as ordinary model directories.

`worker.actor.model.model_path` may name a `.gguf` file, or a folder together with
`worker.actor.model.gguf_file`. transformers reads the file (with the `gguf` package) and dequantizes
its weights into float32; rlstack writes the result once into a cached Hugging Face directory
(safetensors, config.json, the tokenizer and its chat template) under
`$RLSTACK_CACHE/models/gguf/`, keyed by the file's path, size and modification time. Every part of a
run then reads that directory like any other model: the policy, the reference, the rollout engines
(vLLM included), Ray workers on the same machine, and what rlstack saves (checkpoints, `huggingface/`,
`rlstack merge`) is plain safetensors that `from_pretrained` loads without the GGUF file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from rlstack.checkpoint import model_dir_once, write_dir_atomically
from rlstack.errors import RLStackError

SOURCE_FILE = "rlstack_gguf_source.json"
"""Written into the converted directory: which file it came from and what was done to it."""
FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}


class GGUFError(RLStackError, RuntimeError):
    """A GGUF file that cannot be read or converted, with what to do about it."""


def gguf_path(model_path: str, gguf_file: str | None = None) -> Path | None:
    """The GGUF file a model setting names (`model_path` a `.gguf` file, or a folder plus `gguf_file`), or None."""
    if gguf_file:
        folder = Path(os.path.expanduser(model_path))
        if not folder.is_dir():
            raise GGUFError(
                f"worker.actor.model.gguf_file={gguf_file!r} is set, so model_path must be the local folder that "
                f"holds it, but {model_path!r} is not a directory (a GGUF on the Hugging Face Hub: download it "
                "first, e.g. `huggingface-cli download ORG/NAME FILE.gguf --local-dir DIR`; or set model_path to "
                "the .gguf file itself)"
            )
        return folder / gguf_file
    if model_path.lower().endswith(".gguf"):
        return Path(os.path.expanduser(model_path))
    return None


def converted_dir(file: Path, cache: Path) -> Path:
    """Where the dequantized copy of `file` lives: one folder per (path, size, modification time) and
    transformers version (which does the dequantizing)."""
    import transformers

    st = file.stat()
    source = f"{file.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}"
    return cache / "models" / "gguf" / f"{file.stem}-{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def weight_types(file: Path) -> dict[str, int]:
    """How many tensors of each GGUF type the file holds (`{"Q4_1": 210, "F32": 61, ...}`)."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for tensor in GGUFReader(file).tensors:
        name = tensor.tensor_type.name
        counts[name] = counts.get(name, 0) + 1
    return counts


def resolve_gguf(file: Path, cache: Path) -> str:
    """The converted model directory of GGUF `file` (written on first use, under a lock; a one-line note)."""
    if not file.is_file():
        raise GGUFError(f"GGUF file {str(file)!r} does not exist (check the path, relative to {os.getcwd()})")
    out = converted_dir(file, cache)

    def make() -> None:
        types = _convert(file, out)
        _drop_older_copies(file, out)
        quantized = sorted(set(types) - FLOAT_TYPES)
        what = f"{'/'.join(quantized)}-quantized weights dequantized" if quantized else "weights converted"
        print(
            f"[rlstack] {file.name}: {what} to float32 safetensors in {out} (once; reused)", file=sys.stderr
        )

    return model_dir_once(out, make)


def _convert(file: Path, out: Path) -> dict[str, int]:
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError as e:
        raise GGUFError(f"reading {file.name} needs the `gguf` package: pip install gguf") from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        types = weight_types(file)
        with _quiet():
            model = AutoModelForCausalLM.from_pretrained(
                file.parent, gguf_file=file.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except Exception as e:  # the gguf reader raises IndexError/ValueError/KeyError on damaged files
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = (
            "transformers reads GGUF files of the architectures listed in "
            "transformers.modeling_gguf_pytorch_utils.GGUF_SUPPORTED_ARCHITECTURES; convert others to a "
            "Hugging Face directory another way"
            if "not supported" in first.lower()
            else "is the file whole (compare its size with the source's) and a GGUF model file?"
        )
        raise GGUFError(
            f"transformers could not load {str(file)!r} as a causal language model: {first}. {hint}"
        ) from e
    # save_pretrained refuses a model that carries a GGUF quantization config: the weights are
    # already float32, so they move into the same architecture built without it.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True, strict=False)
    plain.tie_weights()
    missing = [n for n, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise GGUFError(f"{file.name}: the converted model has no weights for {missing[:5]}")

    def write(tmp: Path) -> None:
        with _quiet():
            plain.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        source = {"gguf_file": str(file.resolve()), "size": file.stat().st_size, "weight_types": types}
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2))

    write_dir_atomically(out, write)
    return types


def _drop_older_copies(file: Path, out: Path) -> None:
    """Remove the copies of `file` made before it changed (or by another transformers): only `out` is current."""
    for other in out.parent.iterdir():
        source = other / SOURCE_FILE
        if other == out or not source.is_file():
            continue
        try:
            stale = json.loads(source.read_text()).get("gguf_file") == str(file.resolve())
        except (OSError, ValueError):
            continue
        if stale:
            shutil.rmtree(other, ignore_errors=True)


@contextlib.contextmanager
def _quiet():
    """transformers' progress bars while it dequantizes (one per tensor pass), off: the note says it once."""
    from transformers import modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    bar = getattr(reader, "tqdm", None)
    reader.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        if bar is not None:
            reader.tqdm = bar
        if was:
            hf_logging.enable_progress_bar()
