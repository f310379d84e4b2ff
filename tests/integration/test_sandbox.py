"""Hostile programs through the code reward: clean result, trainer unharmed, nothing left behind."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
import time

import pytest
from nobody import CAN_BECOME_NOBODY, NOBODY, as_nobody

from rlstack.rewards import sandbox
from rlstack.rewards.code import score_code
from rlstack.rewards.sandbox import SandboxLimits, api, probe, processes, processes_of_uid, run_python, runs

SMALL = SandboxLimits(
    wall_s=2.0, cpu_s=2.0, memory_mb=256, file_size_mb=16, max_processes=16, max_output_bytes=1 << 16
)
ONE_TEST = {"verifier_metadata": {"unit_tests": {"inputs": ["1 2\n"], "outputs": ["3\n"]}}}
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="checks the run's own uid, which only a root caller gives it"
)


def _fence(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


@pytest.fixture
def listener():
    """A socket listening on 127.0.0.1 that counts connections it accepts."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            accepted.append(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join()
    srv.close()


def _tmp_entries() -> set[str]:
    """The entries of the temp folder, of /tmp (where the sandbox makes its run roots) and of /dev/shm."""
    return {
        os.path.join(d, name) for d in {tempfile.gettempdir(), "/tmp", "/dev/shm"} for name in os.listdir(d)
    }


def _left_behind(before: set[str], wait_s: float = 15.0) -> set[str]:
    """The entries that appeared since `before` and are still there up to `wait_s` later: under pytest-xdist
    the other worker's sandbox runs come and go in /tmp meanwhile; what a run left behind stays."""
    left = _tmp_entries() - before
    deadline = time.monotonic() + wait_s
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left &= _tmp_entries()
    return left


HOSTILE = {
    "infinite_loop": ("while True:\n    pass", "time_limit"),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", None),
    "allocate_8gb": ("x = bytearray(8 * 1024**3)\nprint(len(x))", "memory_limit"),
    "write_2gb_file": (
        "with open('big.bin', 'wb') as f:\n    for _ in range(2048):\n        f.write(b'x' * 1024**2)",
        "runtime_error",
    ),
    "print_200mb": ("import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 1024**2)", "output_limit"),
    "ignore_sigterm": (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)",
        "time_limit",
    ),
    "deep_recursion": ("def f(n):\n    return f(n + 1)\nf(0)", "runtime_error"),
    # the C stack overflows (SIGSEGV) or the wall clock runs out first, depending on the machine's load
    "deep_recursion_no_limit": (
        "import sys\nsys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1) + 1\nf(0)",
        ("runtime_error", "time_limit"),
    ),
    "segfault": ("import ctypes\nctypes.string_at(0)", "runtime_error"),
    "kill_parent": ("import os\nos.kill(os.getppid(), 9)\nprint(3)", "runtime_error"),
    # 480 MiB in RAM-backed /dev/shm, a file at a time: each is under the file size limit
    "fill_dev_shm": (
        "for i in range(480):\n    open(f'/dev/shm/rlstack-fill-{i}', 'wb').write(b'x' * 1024**2)",
        "disk_limit",
    ),
    "many_files": (
        "import os\nos.mkdir('/tmp/d')\nfor i in range(100_000):\n    open(f'/tmp/d/{i}', 'w').close()",
        "disk_limit",
    ),
    "write_outside": (
        "import os\nfor p in ['/tmp/rlstack-escape', '/dev/shm/rlstack-escape', '/rlstack-escape']:\n"
        "    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\nprint(3)",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@needs_root
def test_hostile_program_scores_zero_and_leaves_nothing(name, monkeypatch):
    code, sandbox_status = HOSTILE[name]
    seen_uids = []
    real_run = sandbox.run_python

    def spy(*args, **kwargs):
        result = real_run(*args, **kwargs)
        seen_uids.append(result.uid)
        return result

    monkeypatch.setattr("rlstack.rewards.code.run_python", spy)
    before = _tmp_entries()
    out = score_code(_fence(code), ONE_TEST, test_time_s=SMALL.wall_s, memory_mb=SMALL.memory_mb)
    if name == "write_outside":
        # It prints the right answer; the point is that the filesystem outside is untouched.
        assert out["status"] == "passed"
    else:
        assert out["overall"] == 0.0 and out["pass_rate"] == 0.0
        assert out["status"] != "passed" and out["reason"]
        if sandbox_status is not None:
            allowed = sandbox_status if isinstance(sandbox_status, tuple) else (sandbox_status,)
            assert out["status"] in allowed, out
    if name == "kill_parent":
        assert "PermissionError" in out["reason"]  # and we are still here
    assert all(uid is not None and processes_of_uid(uid) == [] for uid in seen_uids)
    assert not _left_behind(before)
    assert not os.path.exists("/rlstack-escape")


def test_environment_secrets_are_not_visible(monkeypatch):
    monkeypatch.setenv("SECRET_API_KEY", "hunter2-do-not-leak")
    code = (
        "import os\nleak = 'hunter2' in repr(dict(os.environ))\n"
        "try:\n    leak = leak or 'hunter2' in open(f'/proc/{os.getppid()}/environ').read()\n"
        "except OSError:\n    pass\nprint(3 if not leak else 'LEAK')"
    )
    out = score_code(_fence(code), ONE_TEST, test_time_s=2.0)
    assert out["status"] == "passed", out
    r = run_python("import os; print(sorted(os.environ))", limits=SMALL)
    assert "SECRET_API_KEY" not in r.stdout


def test_socket_to_localhost_cannot_connect(listener):
    port, accepted = listener
    code = (
        "import socket\ntry:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('CONNECTED')\n"
        "except OSError as e:\n    print(3)"
    )
    out = score_code(_fence(code), ONE_TEST, test_time_s=2.0)
    assert out["status"] == "passed", out
    assert accepted == []
    r = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", limits=SMALL)
    assert r.status == "runtime_error" and "Error" in r.error_line
    assert r.network == "namespace"


@needs_root
def test_detached_daemon_is_killed():
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(3)"
    )
    r = sandbox.run_python_here(code, limits=SMALL)
    assert r.status == "ok" and r.stdout == "3\n"
    assert r.uid is not None and processes_of_uid(r.uid) == []
    out = score_code(_fence(code), ONE_TEST, test_time_s=2.0)
    assert out["status"] == "passed"


@needs_root
def test_fork_bomb_is_bounded_and_reaped():
    r = sandbox.run_python_here("import os\nwhile True:\n    os.fork()", limits=SMALL)
    assert r.status in ("runtime_error", "time_limit")
    assert processes_of_uid(r.uid) == []


def test_cpu_limit_and_results():
    r = run_python("while True:\n    pass", limits=SMALL._replace(wall_s=10.0, cpu_s=1.0))
    assert r.status == "time_limit" and r.wall_s < 5
    r = run_python("import sys\nprint('a')\nprint('b', file=sys.stderr)\nraise KeyError('k')", limits=SMALL)
    assert (r.status, r.exit_code, r.stdout, r.error_line) == ("runtime_error", 1, "a\n", "KeyError: 'k'")
    assert "b\n" in r.stderr


def test_files_and_workdir_removed():
    r = run_python(
        "import os\nprint(open('data/in.txt').read(), os.getcwd())",
        limits=SMALL,
        files={"data/in.txt": b"hi"},
    )
    assert r.status == "ok" and r.stdout.startswith("hi ")
    assert not os.path.exists(r.stdout.split()[1])
    r = run_python("pass", limits=SMALL, files={"../escape.txt": b"x"})
    assert r.status == "sandbox_error"


def _owned_by(uid: int) -> list[str]:
    found = []
    for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        for entry in os.scandir(d):
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    found.append(entry.path)
            except OSError:
                pass
    return found


@needs_root
def test_scratch_files_are_not_on_the_machine_while_the_program_runs():
    name = f"rlstack-scratch-{os.getpid()}-{threading.get_ident()}"
    script = (
        "import os, sys\n"
        f"for d in ('/tmp', '/var/tmp', '/dev/shm', '/run/lock', '.'):\n"
        f"    if os.path.isdir(d):\n        open(os.path.join(d, {name!r}), 'w').write('x')\n"
        "print(sorted(os.listdir('.')), os.getcwd(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    process = sandbox.SandboxProcess(script, {"in.txt": b"hi"}, SMALL)
    try:
        assert process.scratch == "private"
        listing, cwd = process.stdout.readline().decode().rsplit(" ", 1)
        assert listing == repr(sorted(["in.txt", "main.py", name]))
        assert cwd.strip() == process.workdir
        # the program is still running, its files are in place for it, and the machine sees none of them
        assert process.poll() is None
        assert not any(
            os.path.exists(os.path.join(d, name)) for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
        )
        assert os.listdir(process.workdir) == []  # the machine's side of the work dir is an empty mount point
        assert _owned_by(process.uid) == []
    finally:
        process.close()
    assert not os.path.exists(process.workdir)


def test_disk_budget_is_shared_and_overrun_is_reported():
    limits = SMALL._replace(disk_mb=4)
    write = "def fill(path, mib):\n    with open(path, 'wb') as f:\n        f.write(b'x' * (mib << 20))\n"
    r = run_python(write + "fill('/tmp/a', 3)\nfill('/dev/shm/b', 3)", limits=limits)
    assert (r.status, r.scratch) == ("disk_limit", "private"), r
    assert r.error_line.startswith(
        "disk budget of 4 MiB exceeded (OSError: [Errno 28] No space left on device"
    )
    # the work dir counts too, and a program that handles the error carries on
    r = run_python(
        write + "fill('big', 3)\ntry:\n    fill('/var/tmp/c', 3)\nexcept OSError as e:\n    print(e.errno)",
        limits=limits,
    )
    assert (r.status, r.stdout) == ("ok", "28\n"), r
    assert run_python(write + "fill('/dev/shm/b', 3)", limits=limits).status == "ok"
    r = run_python("pass", limits=limits, files={"data.bin": b"x" * (5 << 20)})
    assert r.status == "sandbox_error" and "disk budget of 4 MiB" in r.error_line


def test_read_only_dirs_under_tmp_stay_visible():
    shared = tempfile.mkdtemp(prefix="rlstack-read-only-", dir="/tmp")
    try:
        os.chmod(shared, 0o755)
        with open(os.path.join(shared, "lib.txt"), "w") as f:
            f.write("library")
        script = (
            f"import sys\nprint(open({shared!r} + '/lib.txt').read())\n"
            f"try:\n    open({shared!r} + '/planted.py', 'w')\nexcept OSError as e:\n    print(e.errno)\n"
        )
        process = sandbox.SandboxProcess(script, {}, SMALL, read_only=(shared,))
        try:
            out = process.stdout.read().decode()
        finally:
            process.close()
        assert out.split() == ["library", "30"]  # EROFS
        assert os.listdir(shared) == ["lib.txt"]
    finally:
        shutil.rmtree(shared)


def test_isolation_is_available_with_the_trainer_python_under_tmp(monkeypatch):
    """A checkout (and its .venv) in a temporary folder under /tmp: the run's root has its own /tmp, so
    the interpreter's prefix must be bound into it."""
    venv = tempfile.mkdtemp(prefix="rlstack-venv-", dir="/tmp")
    try:
        os.mkdir(f"{venv}/bin")
        os.symlink(os.path.realpath(sys.executable), f"{venv}/bin/python")
        monkeypatch.setattr(sys, "executable", f"{venv}/bin/python")
        probe._interpreter.cache_clear()
        runs._prefixes.cache_clear()
        assert probe._probe() is None
    finally:
        probe._interpreter.cache_clear()
        runs._prefixes.cache_clear()
        shutil.rmtree(venv)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@needs_root
def test_runs_start_in_a_launcher_not_in_the_caller(monkeypatch):
    """`run_python` and `SandboxProcess` hand their programs to small launcher processes: with starting
    disabled in this process they still run, the program's ancestors are the run's init, the run's
    first process and a launcher (never this process), and concurrent callers get launchers of their own."""
    from concurrent.futures import ThreadPoolExecutor

    from rlstack.rewards import launcher

    def refuse(*args, **kwargs):
        raise AssertionError("started in the caller's process")

    monkeypatch.setattr(runs, "_spawn", refuse)
    r = run_python("import os\nprint(os.getpid(), os.getppid())", limits=SMALL)
    assert (r.status, r.stdout) == ("ok", "2 1\n"), r  # process 2 of its own PID namespace, under its init
    process = sandbox.SandboxProcess("import sys\nsys.stdin.read()", {}, SMALL)
    try:
        (program,) = processes_of_uid(process.uid)
        init = _parent(program)
        assert _parent(init) == process.pid and _parent(process.pid) in launcher.pool().pids()
        assert os.getpid() not in (init, process.pid, _parent(process.pid))
    finally:
        process.close()
    with ThreadPoolExecutor(3) as ex:
        outs = list(
            ex.map(lambda i: run_python(f"import time\ntime.sleep(0.3)\nprint({i})", limits=SMALL), range(3))
        )
    assert [o.stdout for o in outs] == ["0\n", "1\n", "2\n"]
    assert len(set(launcher.pool().pids())) >= 3


def test_a_dead_launcher_is_replaced_and_the_run_still_happens():
    from rlstack.rewards import launcher

    pool = launcher.LauncherPool()
    try:
        assert pool.run(("print(1)", "", SMALL, None)).stdout == "1\n"
        (pid,) = pool.pids()
        os.kill(pid, 9)
        with pytest.raises(launcher.LauncherError, match=f"launcher pid {pid} failed"):
            pool.run(("print(2)", "", SMALL, None))
        assert pool.pids() == []
        assert pool.run(("print(3)", "", SMALL, None)).stdout == "3\n"  # a new launcher
    finally:
        pool.shutdown()
    assert pool.pids() == []


def test_without_a_launcher_nothing_starts_in_the_caller(monkeypatch):
    from rlstack.rewards import launcher

    def refuse(*args, **kwargs):
        raise AssertionError("started in the caller's process")

    closed = launcher.LauncherPool()
    closed.shutdown()  # its run() and acquire() raise LauncherError
    monkeypatch.setattr(launcher, "pool", lambda: closed)
    monkeypatch.setattr(runs, "_spawn", refuse)
    r = run_python("print(1)", limits=SMALL)
    assert r.status == "sandbox_error" and "no launcher could start the run" in r.error_line
    with pytest.raises(OSError, match="no launcher could start the sandboxed process"):
        sandbox.SandboxProcess("print(1)", {}, SMALL)


def test_uids_are_reserved_across_processes():
    """A uid held by one process (a launcher, another trainer) is never handed out by another."""
    import subprocess as sp

    held = processes._allocate_uid()
    try:
        code = (
            "import random\nfrom rlstack.rewards.sandbox import processes\n"
            f"real = random.randrange\nseq = iter([{held - processes._UID_BASE}] * 3)\n"
            "random.randrange = lambda n: next(seq, None) or real(n)\n"
            "print(processes._allocate_uid())"
        )
        out = sp.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert int(out) != held
    finally:
        processes._release_uid(held)


def test_a_machine_without_isolation_is_refused_at_load(monkeypatch):
    """No silent fallback: where the namespaces cannot be made, a config that runs programs locally
    is refused at load, naming the setting and the fix; nothing runs weaker."""
    from rlstack.config import ConfigError, load_config

    why = "a test run failed (unshare: Operation not permitted). " + probe._ISOLATION_FIX
    monkeypatch.setattr(sandbox, "isolation_problem", lambda: why)  # what config validation reads
    monkeypatch.setattr(api, "isolation_problem", lambda: why)  # what run_python_here and LocalProcess read
    with pytest.raises(ConfigError) as e:
        load_config(["worker.reward.reward_function=builtin:code"])
    assert "builtin:code (worker.reward.code.sandbox=local)" in str(e.value)
    assert "Fix: run the trainer as root, or allow unprivileged user namespaces" in str(e.value)
    tools = 'worker.rollout.agent.tools=[{import_path: "builtin:python"}]'
    with pytest.raises(ConfigError, match=r"worker.rollout.agent.tools\[0\] \(builtin:python\)"):
        load_config([tools])
    fusion = ["worker.reward.reward_function=builtin:code", "worker.reward.code.sandbox=fusion"]
    load_config([*fusion, "worker.reward.code.sandbox_url=http://127.0.0.1:1"])  # no local runs: fine
    r = sandbox.run_python_here("print(1)", limits=SMALL)
    assert r.status == "sandbox_error" and "Operation not permitted" in r.error_line
    with pytest.raises(OSError, match="Operation not permitted"):
        sandbox.LocalProcess("print(1)", {}, SMALL)


@pytest.mark.skipif(
    not CAN_BECOME_NOBODY,
    reason="needs root (to become another user), setpriv, a system python3 and a checkout nobody can enter",
)
def test_a_caller_that_is_not_root_gets_a_user_namespace():
    """Not root: each run gets a user namespace of its own (the caller's uid is 0 there, without any
    capability) with the same namespaces and root as before, and the same holes closed."""
    check = as_nobody("import rlstack.rewards.sandbox as s; print(s.isolation_problem())")
    if check.returncode != 0 or check.stdout.strip() != "None":
        pytest.skip(
            f"this machine gives no user namespaces to uid {NOBODY}: {check.stdout[-300:]}{check.stderr[-300:]}"
        )
    program = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(os.getuid(), pids[:2], os.path.exists('/home'), os.path.exists("
        + repr(os.path.abspath(__file__))
        + "),"
        " libc.shmget(0x5EED, 1 << 20, 0o1666), libc.unshare(0x10000000), sorted(os.listdir('/tmp')) == "
        "[os.path.basename(os.getcwd())])\n"
        "try:\n    open('/usr/planted', 'w')\nexcept OSError as e:\n    print(e.errno)\n"
        "try:\n    open('/proc/sys/kernel/shmmni', 'w').write('4096')\nexcept OSError as e:\n    print(e.errno)"
    )
    out = as_nobody(
        "from rlstack.rewards.sandbox import run_python, SandboxLimits, SandboxProcess\n"
        f"r = run_python({program!r}, limits=SandboxLimits(wall_s=10))\n"
        "print(r.status, r.uid)\nprint(r.stdout, end='')\n"
        "p = SandboxProcess('import sys\\nprint(sys.stdin.readline().upper(), end=\"\")', {}, SandboxLimits())\n"
        "p.stdin.write(b'hi\\n')\nprint(p.stdout.read().decode().strip())\np.close()\n"
        "r = run_python('import os, signal, time\\nos.kill(1, signal.SIGINT)\\ntime.sleep(0.2)\\nraise SystemExit(3)')\n"
        "print(r.status, r.exit_code)"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "ok None", out.stdout
    assert lines[1] == "0 [1, 2] False False -1 -1 True", out.stdout
    assert lines[2] in ("13", "30"), out.stdout  # EACCES or EROFS: the system is read-only to it
    assert lines[3] == "30", out.stdout  # its IPC limits stay 0: /proc/sys is read-only
    assert lines[4] == "HI", out.stdout
    assert lines[5] == "runtime_error 3", out.stdout  # its init ignores the program's signals


@needs_root
def test_a_program_dies_with_its_launcher():
    """A launcher killed while it holds a program (a tool's interpreter, a run in progress) leaves
    nothing running: P dies with the launcher, X with P, and the namespace with X."""
    import time

    from rlstack.rewards import launcher

    process = sandbox.SandboxProcess("import sys\nsys.stdin.read()", {}, SMALL)
    (program,) = processes_of_uid(process.uid)
    helper = process._helper
    os.kill(helper.proc.pid, 9)
    helper.proc.wait()
    deadline = time.monotonic() + 5
    while processes_of_uid(process.uid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert processes_of_uid(process.uid) == []
    assert not os.path.exists(f"/proc/{program}")
    process.close()  # its launcher is gone: closing still returns
    assert helper not in launcher.pool()._all


def test_passed_pipes_do_not_leak_into_the_callers_children():
    process = sandbox.SandboxProcess("import sys\nsys.stdin.read()", {}, SMALL)
    try:
        for pipe in (process.stdin, process.stdout, process.stderr):
            assert not os.get_inheritable(pipe.fileno())
    finally:
        process.close()
