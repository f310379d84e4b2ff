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
BUILTIN_WARM_MODEL = "builtin:tiny-qwen2-addition"
"""Model path of the demo's warm start: the tiny Qwen2 after its supervised run on the addition task
(`rlstack/configs/demo_sft.yaml`), built (once, cached) by the trainer that first needs it
(`rlstack.sft.build_warm_models`): the model the examples start from, so that they learn as shipped."""
BUILTIN_MODELS = (BUILTIN_MODEL, BUILTIN_VISION_MODEL, BUILTIN_WARM_MODEL, "builtin:smollm2-135m-instruct")
"""Every `builtin:` model path: the tiny models built in code, the warm start trained from one, and
SmolLM2-135M-Instruct fetched from the package index (`rlstack.models.registry`)."""
BUILTIN_DIRS = {
    BUILTIN_MODEL: "tiny-qwen2",
    BUILTIN_VISION_MODEL: "tiny-qwen2.5-vl",
    BUILTIN_WARM_MODEL: "tiny-qwen2-addition",
}
"""The models built here: the folder each is built into, under the cache's `models/`."""

HUB_NAME = re.compile(r"\w[\w.-]*/\w[\w.-]*")
"""A Hugging Face Hub repository name, `org/name` (model paths and datasets may be given as one); the Hub
lets neither part start with `.` or `-`, so `./x` and `../x` are never one."""


_HUB_CONFIG = re.compile(r"^(?P<name>.+):(?P<config>[\w.-]+)$")


def hub_config(name: str) -> tuple[str, str | None]:
    """A dataset name's Hub config: `org/name:config` as (`org/name`, `config`); a name without one, or a
    path that exists (a colon in a folder's name), as (name, None)."""
    m = _HUB_CONFIG.match(name)
    if m is None or Path(name).expanduser().exists():
        return name, None
    return m["name"], m["config"]


def local_reason(path: str) -> str | None:
    """Why `path` (without its `@revision`) is read as a local path rather than a Hub name `org/name`; None
    when it is read as a Hub name: one slash, Hub characters, and no local folder `org` (a path that exists
    in part is local)."""
    if path.startswith(("./", "../", "/", "~")):
        return f"it starts with {path.split('/', 1)[0] + '/'!r}"
    if path.count("/") != 1:
        return "it has no '/'" if "/" not in path else "it has more than one '/'"
    first = path.split("/", 1)[0]
    if Path(first).exists():
        return f"its first folder {first!r} exists here"
    if not HUB_NAME.fullmatch(path):
        return "it has characters a Hub name cannot have"
    return None


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


MODEL_KEYS = (".model_path", ".tokenizer_path")
"""Keys (by their ending) whose value is a model folder, a Hub name (`org/name`) or a `builtin:` model."""
HUB_DATA_KEYS = ("data.train_files", "data.val_files")
"""Keys whose value may be a Hub dataset (`org/name@split`; a bare `name` too) besides local files."""


def path_problem(key: str, path: str | None) -> str | None:
    """Local paths must exist: always for the `MUST_EXIST` keys, else where the value reads as one (a file
    suffix, a leading `.`, `/` or `~`, a `/` that `local_reason` reads as local; for model keys, any name
    that is not `org/name`). Hub names (`org/name@split`) and built-ins are checked at load."""
    if not path or path.startswith("builtin:"):
        return None
    local = path.split("@", 1)[0]
    if key in HUB_DATA_KEYS:  # `org/name:config@split`, or a local dataset folder with a config
        local = hub_config(local)[0]
    reason = local_reason(local)
    by_suffix = Path(local).suffix in LOCAL_SUFFIXES
    looks_local = by_suffix or local.startswith((".", "/", "~"))
    hub_key = key.endswith(MODEL_KEYS) or key in HUB_DATA_KEYS
    checked = (
        key in MUST_EXIST
        or looks_local
        or (reason is not None and ("/" in local or key.endswith(MODEL_KEYS)))
    )
    if checked and not Path(os.path.expanduser(local)).exists():
        return missing_path(key, path, reason if hub_key and not by_suffix else None)
    return None


def missing_path(key: str, path: str, reason: str | None = None, form: str = "") -> str:
    """The message for a local path that is not there: the key, the path as given, where it was looked for
    and the working directory relative paths start at; with `reason`, why it is not read as a Hub name;
    with `form`, the form the value takes."""
    given = os.path.expanduser(path.split("@", 1)[0])
    where = f"looked for {os.path.abspath(given)}"
    if not os.path.isabs(given):
        where += f"; relative paths start at the working directory {os.getcwd()}"
    hub = (
        f"; it is read as a local path, not a Hugging Face Hub name (org/name), because {reason}"
        if reason
        else ""
    )
    form = f" (the value's form: {form})" if form else ""
    return (
        f"{key}: {path!r} does not exist ({where}){hub}{form}: fix the path, or run from the folder it is "
        "relative to"
    )


def path_problems(p: list[str], *keyed: tuple[str, str | None]) -> None:
    """`path_problem` of each (key, path), appended to `p`."""
    p += [problem for key, path in keyed if (problem := path_problem(key, path))]


def function_file_problem(key: str, fn: str) -> str | None:
    """A `path/to/file.py:function` whose file is not there."""
    if not fn.startswith("builtin:") and ":" in fn:
        file_part = fn.rsplit(":", 1)[0]
        if file_part.endswith(".py") and not os.path.isfile(file_part):
            return missing_path(key, file_part, form="path/to/file.py:function_name")
    return None
