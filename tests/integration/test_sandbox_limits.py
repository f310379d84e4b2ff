"""Limits that cover the whole run, not each process of it: memory over every process and every page
the run makes the kernel hold (memfd, shared memory, files), the OOM killer's first choice, the
kernel keyrings, and a stdin that cannot be written (issue 42, item 6).

Each test is a hostile tester's finding: a program that held what it should not, now refused.
"""

from __future__ import annotations

import logging
import os

import pytest
from nobody import CAN_BECOME_NOBODY, NOBODY, as_nobody

from rlstack.rewards import launcher, sandbox
from rlstack.rewards.sandbox import SandboxLimits, cgroups, probe, processes, run_python, runs

SMALL = SandboxLimits(wall_s=10.0, cpu_s=10.0, memory_mb=512, max_output_bytes=1 << 16)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="gives runs a uid of their own, which only root can"
)
HAS_CGROUP = cgroups.problem() is None

MEMFD_240_MIB = (
    "import os\nfds = []\n"
    "for i in range(6):\n"  # 6 x 40 MiB: each under file_size_mb, none in any address space
    "    fds.append(os.memfd_create(f'hold{i}'))\n"
    "    os.posix_fallocate(fds[-1], 0, 40 << 20)\n"
    "print('HELD', sum(os.fstat(fd).st_size for fd in fds) >> 20)"
)


def test_memfd_pages_count_in_the_runs_memory():
    """240 MiB of memfd under memory_mb=64: the run's cgroup counts those pages (memory_limit), or,
    where the machine gives no cgroup, memfd_create is refused."""
    r = run_python(MEMFD_240_MIB, limits=SMALL._replace(memory_mb=64))
    assert "HELD" not in r.stdout, r
    if HAS_CGROUP:
        assert r.status == "memory_limit", r
        assert "memory limit of 64 MiB for the whole run" in r.error_line, r
    else:
        assert r.status == "runtime_error" and "PermissionError" in r.error_line, r


def test_without_a_cgroup_memfd_create_is_refused(monkeypatch):
    """The fallback where no cgroup can be had (forced here): the seccomp filter refuses memfd_create."""
    monkeypatch.setattr(runs.cgroups, "new", lambda memory_mb: None)
    r = sandbox.run_python_here(MEMFD_240_MIB, limits=SMALL._replace(memory_mb=64))
    assert r.status == "runtime_error" and "PermissionError" in r.error_line and "HELD" not in r.stdout, r
    r = sandbox.run_python_here("print('fine')", limits=SMALL._replace(memory_mb=64))
    assert (r.status, r.stdout) == ("ok", "fine\n"), r


FOUR_CHILDREN = (
    "import os, select\n"
    "held_r, held_w = os.pipe()\ngo_r, go_w = os.pipe()\nkids = []\n"
    "for i in range(4):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os.close(go_w)\n"
    "        try:\n"
    "            x = b'x' * (106 << 20)\n"  # touched: 106 MiB of RSS, under RLIMIT_AS of 128 MiB
    "        except MemoryError:\n"
    "            os._exit(3)\n"
    "        os.write(held_w, b'1')\n"
    "        os.read(go_r, 1)\n"  # hold it until the parent has counted
    "        os._exit(0)\n"
    "    kids.append(pid)\n"
    "os.close(held_w)\nos.close(go_r)\nheld = 0\n"
    "while held < 4:\n"
    "    if select.select([held_r], [], [], 0.05)[0]:\n"
    "        held += len(os.read(held_r, 4))\n"
    "    elif os.waitpid(-1, os.WNOHANG)[0]:\n"  # a child ended before holding: it will never say so
    "        break\n"
    "os.close(go_w)\n"
    "for pid in kids:\n"
    "    try:\n        os.waitpid(pid, 0)\n    except ChildProcessError:\n        pass\n"
    "print('HELD', held)"
)


@pytest.mark.skipif(not HAS_CGROUP, reason=f"no memory cgroup here: {cgroups.problem()}")
def test_memory_is_counted_over_every_process_of_the_run():
    """4 children of ~106 MiB each under memory_mb=128 (RLIMIT_AS lets each have it): they cannot all
    hold it at once, and the run is memory_limit although its main process exits 0."""
    r = run_python(FOUR_CHILDREN, limits=SMALL._replace(memory_mb=128))
    assert r.status == "memory_limit", r
    assert "HELD 4" not in r.stdout, r


KEYRING = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "add_key, keyctl = (248, 250) if os.uname().machine == 'x86_64' else (217, 219)\n"
    "user_keyring, search, read = -4, 10, 11\n"
    "if {add}:\n"
    "    key = libc.syscall(add_key, b'user', b'rlstack-secret', b'hunter2', 7, user_keyring)\n"
    "    print('ADDED' if key > 0 else f'REFUSED {{ctypes.get_errno()}}')\n"
    "else:\n"
    "    key = libc.syscall(keyctl, search, user_keyring, b'user', b'rlstack-secret', 0)\n"
    "    buf = ctypes.create_string_buffer(64)\n"
    "    n = libc.syscall(keyctl, read, key, buf, 64) if key > 0 else -1\n"
    "    print(buf.raw[:n].decode() if n > 0 else f'NOTHING {{ctypes.get_errno()}}')\n"
)


@needs_root
def test_a_key_does_not_pass_to_a_later_run_with_the_same_uid(monkeypatch):
    """The kernel keyring is the uid's, not the run's: keyring calls are refused, so a later run given
    the same uid (uids are drawn again and again over a long training run) finds nothing."""
    uid = processes._allocate_uid()
    try:
        monkeypatch.setattr(runs, "_allocate_uid", lambda: uid)
        monkeypatch.setattr(runs, "_release_uid", lambda uid: None)
        first = sandbox.run_python_here(KEYRING.format(add=True), limits=SMALL)
        second = sandbox.run_python_here(KEYRING.format(add=False), limits=SMALL)
    finally:
        processes._release_uid(uid)
    assert (first.uid, second.uid) == (uid, uid)
    assert (first.status, first.stdout) == ("ok", "REFUSED 1\n"), first  # EPERM
    assert (second.status, second.stdout) == ("ok", "NOTHING 1\n"), second


def test_stdin_cannot_be_written():
    """fd 0 was a writable deleted file on the machine's /tmp: now neither it nor /proc/self/fd/0
    reopened for writing takes a byte, and the input is still there to read."""
    program = (
        "import os, sys\nfound = []\n"
        "try:\n    os.write(0, b'x' * (1 << 20))\n    found.append('fd 0 written')\n"
        "except OSError as e:\n    found.append(e.errno)\n"
        "try:\n"
        "    with open('/proc/self/fd/0', 'r+b') as f:\n"
        "        f.seek(0, 2)\n"
        "        for _ in range(40):\n            f.write(b'x' * (1 << 20))\n"
        "    found.append('reopened and written')\n"
        "except OSError as e:\n    found.append(e.errno)\n"
        "print(found, repr(sys.stdin.read()))"
    )
    r = run_python(program, stdin="the input\n", limits=SMALL._replace(disk_mb=8))
    assert r.status == "ok", r
    assert "written" not in r.stdout and r.stdout.endswith("'the input\\n'\n"), r


def test_every_process_of_a_run_is_the_oom_killers_first_choice():
    """oom_score_adj 1000 for the run's first process (outside its namespace), its init, the program
    and its children; none can lower its own."""
    program = (
        "import os, time\n"
        "pid = os.fork()\nif pid == 0:\n    time.sleep(30)\n    os._exit(0)\n"
        "seen = {p: open(f'/proc/{p}/oom_score_adj').read().strip() for p in os.listdir('/proc') if p.isdigit()}\n"
        "try:\n    fd = os.open('/proc/self/oom_score_adj', os.O_WRONLY)\n    os.write(fd, b'0')\n    lowered = 'LOWERED'\n"
        "except OSError as e:\n    lowered = e.errno\n"
        "print(len(seen), set(seen.values()), lowered, flush=True)\n"
        "import sys\nsys.stdin.read()\n"
    )
    process = sandbox.SandboxProcess(program, {}, SMALL)
    try:
        count, values, lowered = process.stdout.readline().decode().rsplit(" ", 2)
        with open(f"/proc/{process.pid}/oom_score_adj") as f:
            first = f.read().strip()
    finally:
        process.close()
    assert (count, values, first) == ("3", "{'1000'}", "1000")  # init, program, child; and P
    assert lowered.strip() == "30"  # EROFS: its /proc is read-only


def _launchers_cgroups() -> list[str]:
    """The runs' cgroups this process and its launchers have now."""
    parent = cgroups._hierarchy().parent
    ours = {str(pid) for pid in (os.getpid(), *launcher.pool().pids())}
    return [e for e in os.listdir(parent) if e.startswith(cgroups._PREFIX) and e.split("-")[2] in ours]


@pytest.mark.skipif(not HAS_CGROUP, reason=f"no memory cgroup here: {cgroups.problem()}")
def test_each_runs_cgroup_is_removed_whatever_the_end():
    """No cgroup outlives its run: after a normal end, an OOM kill, a timeout with a daemon left
    running, a failed start, and a long-lived process closed."""
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nwhile True:\n    pass"
    assert run_python("print(1)", limits=SMALL).status == "ok"
    assert run_python(FOUR_CHILDREN, limits=SMALL._replace(memory_mb=128)).status == "memory_limit"
    assert run_python(daemon, limits=SMALL._replace(wall_s=0.5)).status == "time_limit"
    assert run_python("pass", limits=SMALL, files={"../out": b""}).status == "sandbox_error"
    assert sandbox.run_python_here("print(1)", limits=SMALL).status == "ok"
    process = sandbox.SandboxProcess("import sys\nsys.stdin.read()", {}, SMALL)
    assert len(_launchers_cgroups()) == 1
    process.close()
    assert _launchers_cgroups() == []
    assert cgroups._leftovers == []


def test_what_the_machine_cannot_give_is_said_once(monkeypatch, caplog):
    """Without a memory cgroup the caller is told once, at the first probe, what that means."""
    monkeypatch.setattr(cgroups, "problem", lambda: "no memory controller (test)")
    said = probe.weaker_limits()
    assert said.startswith("rlstack sandbox: no memory cgroup for sandbox runs (no memory controller (test))")
    assert "max_processes x memory_mb" in said and "memfd_create is refused" in said

    class Pool:
        asked = 0

        def ask(self, request):
            Pool.asked += 1
            return None, said

    monkeypatch.setattr(launcher, "pool", Pool)
    probe._isolation_problem.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="rlstack.rewards.sandbox"):
            assert probe.isolation_problem() is None
            assert probe.isolation_problem() is None
    finally:
        probe._isolation_problem.cache_clear()
    assert Pool.asked == 1 and [r.getMessage() for r in caplog.records] == [said]


@pytest.mark.skipif(
    not CAN_BECOME_NOBODY,
    reason="needs root (to become another user), setpriv, a system python3 and a checkout nobody can enter",
)
def test_not_root_the_limits_fall_back_and_say_so():
    """Not root (no cgroup it may write here): one warning at the probe, memfd_create and the keyrings
    refused, oom_score_adj 1000; the run itself is fine."""
    program = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "keyctl = 250 if os.uname().machine == 'x86_64' else 219\n"
        "try:\n    os.memfd_create('m')\n    memfd = 'MADE'\nexcept OSError as e:\n    memfd = e.errno\n"
        "try:\n    os.write(os.open('/proc/self/oom_score_adj', os.O_WRONLY), b'0')\nexcept OSError as e:\n    low = e.errno\n"
        "print(memfd, libc.syscall(keyctl, 0, -4, 0), open('/proc/self/oom_score_adj').read().strip(), low)"
    )
    code = (
        "import rlstack.rewards.sandbox as s\n"
        "problem = s.isolation_problem()\nprint(problem)\n"
        "if problem is None:\n"
        f"    print(s.isolation_problem())\n    print(s.run_python({program!r}).stdout, end='')\n"
    )
    out = as_nobody(code)
    if out.returncode != 0 or out.stdout.splitlines()[:1] != ["None"]:
        pytest.skip(
            f"this machine gives no user namespaces to uid {NOBODY}: {out.stdout[-300:]}{out.stderr[-300:]}"
        )
    assert out.stdout.splitlines() == ["None", "None", "1 -1 1000 30"], out
    warnings = [line for line in out.stderr.splitlines() if "rlstack sandbox:" in line]
    assert len(warnings) == 1 and "no memory cgroup for sandbox runs" in warnings[0], out.stderr


def test_a_program_killed_by_a_signal_python_does_not_name_is_its_own_failure():
    """A real-time signal has no name in `signal.Signals`: the run is `runtime_error` naming it; the
    launcher neither dies nor runs the program again."""
    code = "import os, signal, sys\nprint('ran', file=sys.stderr, flush=True)\nos.kill(os.getpid(), signal.SIGRTMIN + 6)"
    r = run_python(code, limits=SMALL)
    assert (r.status, r.error_line) == (
        "runtime_error",
        f"killed by signal {int(__import__('signal').SIGRTMIN) + 6}",
    )
    assert r.stderr.count("ran") == 1


def test_descriptors_are_few_so_pipe_buffers_are_bounded_without_a_cgroup():
    """Pipes' and sockets' buffers are in no process's address space: each process of a run may
    hold at most 256 descriptors (RLIMIT_NOFILE)."""
    code = (
        "import os\nfds = []\ntry:\n    while True:\n        fds += os.pipe()\nexcept OSError as e:\n"
        "    print(e.errno, len(fds) <= 256)"
    )
    r = run_python(code, limits=SMALL)
    assert r.status == "ok" and r.stdout.split() == ["24", "True"], r
