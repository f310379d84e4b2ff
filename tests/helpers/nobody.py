"""Running code as an unprivileged user (`nobody`), to try the sandbox's not-root mode from a root test."""

from __future__ import annotations

import os
import shutil
import subprocess

NOBODY = 65534
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""This checkout, which `nobody` imports."""


def _anyone_may_enter(path: str) -> bool:
    """Whether every directory from / down to `path` lets anyone through (a `mktemp -d` does not)."""
    parts = path.split(os.sep)
    return all(os.stat(os.sep.join(parts[:i]) or os.sep).st_mode & 0o001 for i in range(1, len(parts) + 1))


CAN_BECOME_NOBODY = (
    os.geteuid() == 0
    and shutil.which("setpriv") is not None
    and shutil.which("python3", path="/usr/bin:/bin") is not None
    and _anyone_may_enter(_ROOT)
)
"""Root, setpriv, a system python3 and a checkout `nobody` can enter: what `as_nobody` needs."""


def as_nobody(code: str) -> subprocess.CompletedProcess:
    """`code` run by the system's python3 as `nobody`, importing this checkout (the sandbox, its
    launcher and the code reward need only the standard library)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": _ROOT},
    )
