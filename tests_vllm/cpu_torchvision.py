"""Install torchvision for the vLLM lane on a machine whose package registry has no CPU build of it.

vLLM's Qwen2-VL / Qwen2.5-VL support imports transformers' torchvision-based image processor, so a
vision-language model cannot load in vLLM without torchvision. For torch 2.13 the registry here
holds only the CUDA build of torchvision 0.28, whose compiled operators (`_C.so`: detection ops
such as nms, roi_align) cannot load next to a CPU torch. Its Python part, the image transforms
vLLM uses, is plain torch. This script installs that build without dependencies, removes `_C.so`
and registers the two fake kernels torchvision declares unconditionally (nms, qnms) only when the
compiled operators exist. Nothing else changes: image transforms run torchvision's own code.

Where a CPU wheel of torchvision exists (pip install torchvision --index-url
https://download.pytorch.org/whl/cpu), install that instead; this script is then not needed.

    python tests_vllm/cpu_torchvision.py      # run by `make test-vllm` in .venv-vllm
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

VERSION = "0.28.0"  # the torchvision release paired with torch 2.13
GUARDED = ("nms", "qnms")


def main() -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", f"torchvision=={VERSION}"],
        check=True,
    )
    package = Path(sysconfig.get_paths()["purelib"]) / "torchvision"
    compiled = package / "_C.so"
    if compiled.exists():
        compiled.unlink()
    meta = package / "_meta_registrations.py"
    text = meta.read_text()
    if "rlstack: compiled operators removed" not in text:
        for op in GUARDED:
            decorator = f'@torch.library.register_fake("torchvision::{op}")\n'
            if decorator not in text:
                raise SystemExit(f"{meta}: no {decorator.strip()} to guard; torchvision {VERSION} expected")
            text = text.replace(decorator, "")
        text += "\n\nif torchvision.extension._has_ops():  # rlstack: compiled operators removed on CPU\n"
        text += "".join(
            f'    torch.library.register_fake("torchvision::{op}")(meta_{op})\n' for op in GUARDED
        )
        meta.write_text(text)
    subprocess.run([sys.executable, "-c", "import torchvision.transforms.v2.functional, vllm"], check=True)
    print(f"torchvision {VERSION} (Python transforms only) importable at {package}")


if __name__ == "__main__":
    main()
