"""Running code as an unprivileged user (`nobody`), to try the sandbox's not-root mode from a root test."""

from __future__ import annotations

import os
import shutil
import subprocess

NOBODY = 65534
CAN_BECOME_NOBODY = (
    os.geteuid() == 0
    and shutil.which("setpriv") is not None
    and shutil.which("python3", path="/usr/bin:/bin") is not None
)
"""Root, setpriv and a system python3: what `as_nobody` needs."""


def as_nobody(code: str) -> subprocess.CompletedProcess:
    """`code` run by the system's python3 as `nobody`, importing this checkout (the sandbox, its
    launcher and the code reward need only the standard library)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    python = shutil.which("python3", path="/usr/bin:/bin")
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": root},
    )
