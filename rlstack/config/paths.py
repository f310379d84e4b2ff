"""What a path-valued key may name besides a local path: the `builtin:` models, Hugging Face Hub names,
and chat templates given as Jinja text. `rlstack.models.loading` reads these names from here."""

from __future__ import annotations

import os
import re
from pathlib import Path

BUILTIN_MODEL = "builtin:tiny-qwen2"
"""Model path that builds (once, cached) a randomly initialised tiny Qwen2 and its tokenizer."""
BUILTIN_VISION_MODEL = "builtin:tiny-qwen2.5-vl"
"""Model path that builds (once, cached) a randomly initialised tiny Qwen2.5-VL and its processor."""
BUILTIN_MODELS = (BUILTIN_MODEL, BUILTIN_VISION_MODEL, "builtin:smollm2-135m-instruct")
"""Every `builtin:` model path: the tiny models built in code, and SmolLM2-135M-Instruct fetched from the
package index (`rlstack.models.registry`)."""
BUILTIN_DIRS = {BUILTIN_MODEL: "tiny-qwen2", BUILTIN_VISION_MODEL: "tiny-qwen2.5-vl"}
"""The models built in code: the folder each is built into, under the cache's `models/`."""

HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")
"""A Hugging Face Hub repository name, `org/name` (model paths and datasets may be given as one)."""


def is_template_text(template: str) -> bool:
    """Whether a configured chat template is Jinja text (it has a `{{` or `{%`) rather than a file's path."""
    return "{{" in template or "{%" in template


def chat_template_text(template: str) -> str:
    """A chat template given in the config: the template itself (Jinja text), or the text of the file it names."""
    return template if is_template_text(template) else Path(template).read_text()


MUST_EXIST = (
    "data.format_prompt",
    "trainer.load_checkpoint_path",
    "worker.rollout.agent.system_prompt",
    "data.image_dir",
)
"""Keys whose value is always a local path."""
LOCAL_SUFFIXES = {".jsonl", ".json", ".parquet", ".jinja", ".yaml", ".gguf"}


def path_problem(key: str, path: str | None) -> str | None:
    """Local paths must exist; hub names (`org/name@split`) and built-ins are checked at load."""
    if not path or path.startswith("builtin:"):
        return None
    local = path.split("@", 1)[0]
    looks_local = local.startswith((".", "/", "~")) or Path(local).suffix in LOCAL_SUFFIXES
    hub_name = HUB_NAME.fullmatch(local) is not None and not Path(local).exists()
    checked = key in MUST_EXIST or looks_local or (key.startswith("worker.actor.model") and not hub_name)
    if checked and not Path(os.path.expanduser(local)).exists():
        return f"{key}: {path!r} does not exist (check the path, relative to {os.getcwd()})"
    return None


def path_problems(p: list[str], *keyed: tuple[str, str | None]) -> None:
    """`path_problem` of each (key, path), appended to `p`."""
    p += [problem for key, path in keyed if (problem := path_problem(key, path))]


def function_file_problem(key: str, fn: str) -> str | None:
    """A `path/to/file.py:function` whose file is not there."""
    if not fn.startswith("builtin:") and ":" in fn:
        file_part = fn.rsplit(":", 1)[0]
        if file_part.endswith(".py") and not os.path.isfile(file_part):
            return f"{key}: file {file_part!r} does not exist (expected path/to/file.py:function_name)"
    return None
