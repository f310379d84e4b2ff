"""A sandboxed program sees none of the packages installed on the machine (the interpreter's
site-packages, the system's dist-packages), even with their directories put on `sys.path`: each is
an empty, read-only directory in its root. Only what its caller binds in is there (the Python tool's
Pillow, NumPy and Matplotlib), also when that lies inside such a directory."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tempfile

import pytest
from nobody import CAN_BECOME_NOBODY, NOBODY, as_nobody

from rlstack.rewards import sandbox
from rlstack.rewards.sandbox import SandboxLimits, run_python
from rlstack.rewards.sandbox.probe import _interpreter
from rlstack.tools import python_packages
from rlstack.tools.base import ToolCall
from rlstack.tools.python import PythonTool

LIMITS = SandboxLimits(wall_s=30.0, cpu_s=30.0, memory_mb=2048, max_processes=64)
BASE_SITE = next(
    (p for p in site.getsitepackages([sys.base_prefix]) if os.path.isdir(p)),
    site.getsitepackages([sys.base_prefix])[0],
)
"""The site-packages of the interpreter this one is made from (pyenv's, the system's)."""
DEBIAN = "/usr/lib/python3/dist-packages"
WANTED = ("scipy", "pytest", "sympy", "numpy", "yaml", "distro", "six", "certifi", "idna", "jwt", "requests")
"""Packages to look for first (big and well known); any other importable one of the directory will do."""
STANDALONE = ("certifi", "idna", "six", "colorama", "iniconfig", "pluggy", "mpmath", "distro", "wcwidth")
"""Packages that import with nothing else of their directory."""

TRY_IMPORTS = """
import json, os, sys
where, names = sys.argv[1], sys.argv[2:]
sys.path.insert(0, where)
found = []
for name in names:
    try:
        __import__(name)
        found.append(name)
    except BaseException:
        pass
print(json.dumps(found))
"""


def _candidates(directory: str, first: tuple[str, ...]) -> list[str]:
    """Top-level modules in `directory`: `first` (those there), then others, up to 40."""
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return []
    names = []
    for entry in entries:
        path = os.path.join(directory, entry)
        if entry.isidentifier() and os.path.isfile(os.path.join(path, "__init__.py")):
            names.append(entry)
        elif entry.endswith(".py") and entry[:-3].isidentifier() and os.path.isfile(path):
            names.append(entry[:-3])
    return [n for n in first if n in names] + [n for n in names if n not in first][:40]


def _importable(directory: str, names: list[str], python: str | None = None) -> list[str]:
    """Which of `names` the sandbox's interpreter imports from `directory`, run outside the sandbox."""
    if not names:
        return []
    python = python or _interpreter()
    out = subprocess.run(
        [python, "-I", "-S", "-c", TRY_IMPORTS, directory, *names],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if out.returncode == 0 and lines else []


def _one_importable(directory: str, first: tuple[str, ...], exclude: set[str] = frozenset()) -> str:
    if not os.path.isdir(directory) or not os.listdir(directory):
        pytest.skip(f"{directory} does not exist or is empty on this machine")
    names = [n for n in _candidates(directory, first) if n not in exclude]
    for i in range(0, len(names), 10):  # few at a time: the first that imports is enough
        found = _importable(directory, names[i : i + 10])
        if found:
            return found[0]
    pytest.skip(f"no package in {directory} imports with {_interpreter()} (-I -S) on this machine")


def _probe_program(directory: str, name: str) -> str:
    """A program that puts `directory` on sys.path and prints what it can import and list of it."""
    return (
        f"import json, os, sys\nsys.path.insert(0, {directory!r})\nfound = {{}}\n"
        f"try:\n    __import__({name!r})\n    found['import'] = True\n"
        "except ImportError as e:\n    found['import'] = str(e)\n"
        f"try:\n    found['listing'] = sorted(os.listdir({directory!r}))[:20]\n"
        "except OSError as e:\n    found['listing'] = e.errno\n"
        f"try:\n    open({directory!r} + '/planted.py', 'w')\n    found['write'] = True\n"
        "except OSError as e:\n    found['write'] = e.errno\n"
        "print(json.dumps(found))"
    )


def _assert_hidden(result: sandbox.SandboxResult, name: str) -> None:
    assert result.status == "ok", result
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["import"] is not True, f"{name} imported inside the sandbox: {found}"
    assert found["listing"] in ([], 2), found  # empty (or absent): nothing installed there to read
    assert found["write"] in (13, 30), found  # EACCES or EROFS


def test_the_base_interpreter_site_packages_are_hidden():
    """A program that puts the base interpreter's site-packages on sys.path imports nothing from it and
    sees it empty (here: whatever is installed into pyenv's or the system's interpreter)."""
    name = _one_importable(BASE_SITE, WANTED)
    _assert_hidden(run_python(_probe_program(BASE_SITE, name), limits=LIMITS), name)


def test_the_system_dist_packages_are_hidden():
    """Debian's /usr/lib/python3/dist-packages (and every other dist-packages under /usr) is empty too."""
    name = _one_importable(DEBIAN, WANTED)
    _assert_hidden(run_python(_probe_program(DEBIAN, name), limits=LIMITS), name)


@pytest.mark.skipif(
    not CAN_BECOME_NOBODY,
    reason="needs root (to become nobody), setpriv, a system python3 and a checkout nobody can enter",
)
def test_the_system_dist_packages_are_hidden_without_root():
    """Not root (a user namespace of its own; the system's python3 as the sandbox's interpreter): the
    same masks, which the program, owner of its namespace, cannot write to or take away."""
    check = as_nobody("import rlstack.rewards.sandbox as s; print(s.isolation_problem())")
    if check.returncode != 0 or check.stdout.strip() != "None":
        pytest.skip(
            f"this machine gives no user namespaces to uid {NOBODY}: {check.stdout[-300:]}{check.stderr[-300:]}"
        )
    python = os.path.realpath("/usr/bin/python3")
    if not os.path.isdir(DEBIAN) or not os.listdir(DEBIAN):
        pytest.skip(f"{DEBIAN} does not exist or is empty on this machine")
    names = _importable(DEBIAN, _candidates(DEBIAN, WANTED), python)
    if not names:
        pytest.skip(f"no package in {DEBIAN} imports with {python} on this machine")
    program = (
        _probe_program(DEBIAN, names[0])
        + "\nimport ctypes\nprint(ctypes.CDLL(None).umount2("
        + (f"{DEBIAN!r}.encode(), 2))")
    )
    out = as_nobody(
        "from rlstack.rewards.sandbox import run_python, SandboxLimits\n"
        f"r = run_python({program!r}, limits=SandboxLimits(wall_s=30, cpu_s=30, memory_mb=1024))\n"
        "print(r.status, r.uid)\nprint(r.stdout, end='')\nprint(r.stderr[-2000:])"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "ok None", out.stdout
    found = json.loads(lines[1])
    assert found["import"] is not True and found["listing"] in ([], 2), found
    assert found["write"] == 30, found  # EROFS: it owns the mask, which is read-only
    assert lines[2] == "-1", out.stdout  # the mask cannot be taken off


def test_the_python_tool_sees_its_packages_and_nothing_else_installed():
    """The tool's Pillow, NumPy and Matplotlib import; a package of the base interpreter's
    site-packages does not, even with that directory on sys.path, and the directory shows no more than
    what the tool binds from it (nothing, where the tool's packages live in a virtual environment)."""
    packages = python_packages._packages()
    offered = {
        os.path.relpath(b, BASE_SITE).split(os.sep)[0]
        for b in packages.binds
        if b.startswith(BASE_SITE + os.sep)
    }
    exclude = {n.split(".")[0].split("-")[0] for n in offered} | {"PIL", "numpy", "matplotlib"}
    name = _one_importable(BASE_SITE, ("scipy", *WANTED), exclude)
    tool = PythonTool(timeout_s=30.0, cpu_s=30.0, memory_mb=2048, max_processes=64, startup_timeout_s=60.0)
    tool.reset([], {})
    try:
        code = (
            "import json, os, sys\nimport PIL.Image, numpy, matplotlib.pyplot as plt\n"
            "plt.plot(numpy.arange(3))\nplt.show()\n"
            f"sys.path.insert(0, {BASE_SITE!r})\nfound = {{}}\n"
            f"try:\n    __import__({name!r})\n    found['import'] = True\n"
            "except ImportError as e:\n    found['import'] = str(e)\n"
            f"try:\n    found['extra'] = sorted(set(os.listdir({BASE_SITE!r})) - {offered!r})[:20]\n"
            "except OSError as e:\n    found['extra'] = []\n"
            "print(json.dumps(found))"
        )
        obs = tool.execute(ToolCall("python", {"code": code}, ""))
    finally:
        tool.close()
    assert obs.ok and len(obs.images) == 1, obs.text
    found = json.loads(next(line for line in obs.text.splitlines() if line.startswith("{")))
    assert found["import"] is not True, f"{name} imported in the tool: {found}"
    assert found["extra"] == [], found  # what the tool does not bind from there is not there


def _standalone(directory: str, names: list[str]) -> list[str]:
    """Those of `names` (entries of `directory`) that import with nothing else of `directory` there."""
    found = []
    with tempfile.TemporaryDirectory() as alone:
        for name in names:
            entry = name if os.path.isdir(os.path.join(directory, name)) else f"{name}.py"
            os.symlink(os.path.join(directory, entry), os.path.join(alone, entry))
            if _importable(alone, [name]):
                found.append(name)
            os.unlink(os.path.join(alone, entry))
    return found


def test_a_path_the_caller_shows_inside_a_hidden_directory_is_still_there():
    """A package the caller binds (`read_only`) from inside a hidden site-packages (the tool's, when its
    packages are installed into the base interpreter) is there, at its own path and read-only, on top
    of the mask; the other packages beside it are not."""
    candidates = _candidates(BASE_SITE, STANDALONE)
    importable = _importable(BASE_SITE, candidates)
    alone = _standalone(BASE_SITE, [n for n in STANDALONE if n in importable])
    packages = [n for n in alone if os.path.isdir(os.path.join(BASE_SITE, n))]
    modules = [n for n in alone if os.path.isfile(os.path.join(BASE_SITE, f"{n}.py"))]
    if not packages:
        pytest.skip(f"no package of {BASE_SITE} that imports alone ({STANDALONE}) on this machine")
    shown = [packages[0], *modules[:1]]
    siblings = [n for n in importable if n not in shown]
    if not siblings:
        pytest.skip(f"no other importable package in {BASE_SITE}")
    sibling = siblings[0]
    read_only = tuple(os.path.join(BASE_SITE, n if n in packages else f"{n}.py") for n in shown)
    script = (
        f"import json, os, sys\nsys.path.insert(0, {BASE_SITE!r})\nfound = {{'imported': []}}\n"
        f"for name in {shown!r}:\n    __import__(name)\n    found['imported'].append(name)\n"
        f"try:\n    __import__({sibling!r})\n    found['sibling'] = True\n"
        "except ImportError as e:\n    found['sibling'] = str(e)\n"
        f"found['listing'] = sorted(os.listdir({BASE_SITE!r}))[:20]\n"
        f"for path in [{BASE_SITE!r} + '/planted.py', {read_only[0]!r} + '/planted.py']:\n"
        "    try:\n        open(path, 'w')\n        found.setdefault('writes', []).append(True)\n"
        "    except OSError as e:\n        found.setdefault('writes', []).append(e.errno)\n"
        "print(json.dumps(found))"
    )
    process = sandbox.SandboxProcess(script, {}, LIMITS, read_only=read_only)
    try:
        out, err = process.stdout.read().decode(), process.stderr.read().decode()
    finally:
        process.close()
    assert out.strip(), err[-2000:]
    found = json.loads(out.strip().splitlines()[-1])
    assert found["imported"] == shown, (found, err[-2000:])
    assert found["sibling"] is not True, f"{sibling} imported beside {shown}: {found}"
    assert found["listing"] == sorted(os.path.basename(p) for p in read_only), found
    assert all(w in (13, 30) for w in found["writes"]), found
