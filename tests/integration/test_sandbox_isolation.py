"""What a sandboxed program can see of the machine, through each of the three ways programs run:
the one-shot sandbox (`run_python`), the code reward (`builtin:code`), and the Python tool.

Each probe prints what it found; a correct answer is only printed when the hole is closed, so the
code reward's unit test (expected output `CLOSED`) passes only then, and `run_python` and the tool
must print `CLOSED` too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

from rlstack.rewards.code import score_code
from rlstack.rewards.sandbox import SandboxLimits, run_python
from rlstack.tools.base import ToolCall
from rlstack.tools.python import PythonTool

SMALL = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=512, max_output_bytes=1 << 16)
CLOSED = {"inputs": ["\n"], "outputs": ["CLOSED\n"]}


@pytest.fixture(scope="module")
def planted():
    """World-readable files where a trainer keeps its data: a dataset with expected outputs, a
    checkpoint and a secret under /root, /home and /tmp, and this project's own source."""
    base = tempfile.mkdtemp(prefix="rlstack-planted-", dir="/tmp")
    os.chmod(base, 0o755)
    paths = {}
    for name, text in (("data.jsonl", json.dumps({"outputs": ["42"]})), ("ckpt.bin", "weights")):
        paths[name] = os.path.join(base, name)
        with open(paths[name], "w") as f:
            f.write(text)
        os.chmod(paths[name], 0o644)
    paths["source"] = os.path.abspath(__file__)
    paths["root"] = "/root"
    paths["home"] = "/home"
    yield paths
    shutil.rmtree(base)


def _probes(planted: dict[str, str]) -> dict[str, str]:
    """name -> program that prints CLOSED when the hole is closed, and what it found otherwise."""
    files = [planted["data.jsonl"], planted["ckpt.bin"], planted["source"]]
    return {
        # SysV shared memory: off in the run's own IPC namespace (and gone with it)
        "sysv_shm": (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "ids = [libc.shmget(0x5EED + i, 8 << 20, 0o1666) for i in range(4)]\n"
            "print('CLOSED' if all(i == -1 for i in ids) else f'OPEN {ids}')"
        ),
        "ipc_limits": (
            "try:\n    open('/proc/sys/kernel/shmmni', 'w').write('4096')\n    print('OPEN')\n"
            "except OSError:\n    print('CLOSED')"
        ),
        "sysv_msg": (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('CLOSED' if libc.msgget(0x5EED, 0o1666) == -1 else 'OPEN')"
        ),
        # /proc: only the run's own processes (its init is 1, the program 2)
        "proc": (
            "import os\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "cmds = [open(f'/proc/{p}/cmdline', 'rb').read() for p in pids if os.access(f'/proc/{p}/cmdline', os.R_OK)]\n"
            "print('CLOSED' if pids[:2] == [1, 2] and max(pids) < 50 and not any(b'pytest' in c for c in cmds) "
            "else f'OPEN {pids[:20]}')"
        ),
        # files: the dataset, a checkpoint, the project's source, /root, /home are not there
        "files": (
            "import os\n"
            f"found = [p for p in {files!r} if os.path.exists(p)]\n"
            f"found += [p for p in ({planted['root']!r}, {planted['home']!r}) if os.path.isdir(p) and "
            "[e for e in os.listdir(p) if e != '.pyenv']]\n"
            "print('CLOSED' if not found else f'OPEN {found}')"
        ),
        # the machine's /tmp is not there: only the run's work dir, and the directories leading to
        # what is bound in read-only when it lies under /tmp (a checkout's venv: the tool's packages)
        "machine_tmp": (
            f"import os\nplanted = {os.path.dirname(planted['data.jsonl'])!r}\n"
            "others = set(os.listdir('/tmp')) - {os.path.basename(os.getcwd())}\n"
            "print('CLOSED' if not os.path.exists(planted) and not any(os.access('/tmp/' + e, os.W_OK) for e in others) "
            "else f'OPEN {sorted(others)}')"
        ),
        # a namespace of its own (root in a new user namespace) would let it mount a tmpfs or make
        # shared memory past its budget: no unshare, setns or clone with a new namespace
        "new_namespace": (
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "made = [libc.unshare(flags) for flags in (0x10000000, 0x10020000, 0x18000000)]\n"
            "made.append(libc.syscall(435, None, 0) == -1 and ctypes.get_errno() == 38 and -1)\n"  # clone3: ENOSYS
            "pid = libc.syscall(56 if os.uname().machine == 'x86_64' else 220, 0x10000000 | 17, 0, 0, 0, 0)\n"
            "if pid == 0:\n    os._exit(0)\nmade.append(pid)\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
            "print('CLOSED' if made == [-1] * 5 else f'OPEN {made}')"
        ),
        "write_root": (
            "import os\ntry:\n    open('/planted', 'w')\n    print('OPEN')\nexcept OSError:\n    print('CLOSED')"
        ),
    }


PROBES = ("sysv_shm", "ipc_limits", "sysv_msg", "proc", "files", "machine_tmp", "new_namespace", "write_root")


def _shm_segments() -> str:
    with open("/proc/sysvipc/shm") as f:
        return f.read()


@pytest.mark.parametrize("probe", PROBES)
def test_one_shot_sandbox(probe, planted):
    before = _shm_segments()
    r = run_python(_probes(planted)[probe], limits=SMALL)
    assert (r.status, r.stdout) == ("ok", "CLOSED\n"), r
    assert _shm_segments() == before  # nothing left on the machine
    assert not os.path.exists("/planted")


@pytest.mark.parametrize("probe", PROBES)
def test_code_reward(probe, planted):
    out = score_code(f"```python\n{_probes(planted)[probe]}\n```", CLOSED, test_time_s=5.0)
    assert out["overall"] == 1.0, out


@pytest.fixture(scope="module")
def tool():
    t = PythonTool(timeout_s=10.0, startup_timeout_s=60.0)
    t.reset([], {})
    yield t
    t.close()


@pytest.mark.parametrize("probe", PROBES)
def test_python_tool(probe, planted, tool):
    obs = tool.execute(ToolCall(name="python", arguments={"code": _probes(planted)[probe]}, raw=""))
    assert obs.ok and obs.text == "CLOSED", obs


def test_the_dataset_cannot_be_read_for_its_expected_outputs(planted):
    """The reward hack that needs no intelligence: print the dataset's expected output."""
    program = f"import json\nprint(json.load(open({planted['data.jsonl']!r}))['outputs'][0])"
    out = score_code(f"```python\n{program}\n```", {"inputs": ["\n"], "outputs": ["42\n"]}, test_time_s=5.0)
    assert out["overall"] == 0.0 and "FileNotFoundError" in out["reason"], out


def test_ipc_is_gone_after_the_run_even_where_a_segment_is_made():
    """No segment outlives the run: the run's IPC namespace dies with it."""
    before = _shm_segments()
    r = run_python(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.shmget(0x5EED, 1 << 20, 0o1666))",
        limits=SMALL,
    )
    assert r.stdout == "-1\n" and _shm_segments() == before
