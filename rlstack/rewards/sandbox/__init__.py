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
- **Its own processes.** A new PID namespace with its own `/proc`: the program is process 2, under
  an init (process 1) that reaps orphans and, when the program ends, exits, which kills everything
  left in the namespace. It cannot see or signal any process of the machine.
- **No IPC with anything.** A new IPC namespace in which System V shared memory and message queues
  and POSIX message queues are off (their limits are 0): `shmget` / `msgget` fail with ENOSPC.
  POSIX shared memory is files in its `/dev/shm`, inside `disk_mb`.
- **No network.** A new, empty network namespace: no interface but a loopback that is down, so even
  127.0.0.1 is unreachable. A new UTS namespace hides the host name.
- **Limits.** `setrlimit` of CPU time (SIGXCPU at `cpu_s`, SIGKILL a second later), address space,
  file size (SIGXFSZ), process count, POSIX message-queue bytes (0), and no core files.
- **No namespaces of its own.** A seccomp filter refuses `unshare`, `setns` and a `clone` that
  asks for a new namespace (threads and forks are fine): without it, a program could become root
  of a new user namespace and mount a tmpfs, or make shared memory, past its budget.
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
- `probe.py`: `isolation_problem` (there is no weaker fallback), and the interpreter the sandbox uid
  can run.
- `serve.py`: the launcher process's loop (`rlstack/rewards/launcher.py` is the caller's side).
"""

from rlstack.rewards.sandbox.api import LocalProcess, SandboxProcess, run_python, run_python_here
from rlstack.rewards.sandbox.limits import DEFAULT_LIMITS, SandboxLimits, SandboxResult, is_disk_full
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
]
