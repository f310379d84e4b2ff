"""The test's process: runs one test against a program that lives in another process.

It runs as `main.py` in the sandbox (its script is `plain.py`, `answers.py` and this file, put
together by `harness/__init__.py`), and does, in order:

1. Forks the program's process (`answers.py`) as its very first step, before it has read its job:
   nothing of the test was ever in that child's memory. The child drops every capability, points
   stdin at /dev/null and its stdout (the verdict's pipe) at the run's stderr, and keeps two pipes:
   calls come in on one, answers go out on the other.
2. Makes itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`) before the program exists anywhere: a
   process without CAP_SYS_PTRACE, as the program's is, can then neither ptrace it nor open its
   `/proc/<pid>/mem`, `fd/`, `maps` or `environ`. SIGINT is ignored (no KeyboardInterrupt can be
   sent into the test).
3. Reads its job from stdin (the program, the test, the row's fixed code, which names the test
   reads), then points stdin at /dev/null; its own stdout, where the verdict goes, is kept apart
   and the test's prints go to stderr.
4. Runs the row's fixed code (a HumanEval prompt's helpers) here, asks the program's process to load
   the program, and binds, for each name of the program the test reads, a stand-in (`Remote`): a
   call sends the arguments over as plain data (`plain.py`) and gets back a plain value, the
   arguments as the program left them (copied into the test's own objects), or the type and
   message of what the program raised (raised here as that exception, so the test may catch it).
5. Runs the test with real values only: every comparison, `abs`, `math.isclose` and `random` call
   happens in this process, on objects of its own, so no method of the program's ever runs here.
6. Writes the verdict (`{"status", "reason"}`, one JSON line) on its stdout, and ends.

A failure of the program's process (it exited or was killed during the test, it sent something that
is not plain data) is remembered: the test fails with it even if the test's code caught the
exception it raised. A result that is not plain data (an object of the program's class, a
generator) stays in the program's process and the test gets a handle (`Remote`): it can be called,
its attributes read and iterated over (each answer plain data again), but a handle used as a value
(truth, `==`, `!=`) fails the test (`not_plain_data`): only the program's object could say what it
equals. The program's process may name only what the test asked for (never a builtin), and a
standard-library module the test reads attributes of is always this process's own.
"""

import _signal  # not `signal`, whose import of `enum` costs each run ~3 ms
import posix as os  # not `os` itself: a `-I -S` interpreter has not imported it (~1 ms)
import sys

if __name__ == "__main__":  # in the sandbox: the script's first lines made these from their files' text
    import answers
    import plain
else:
    from rlstack.rewards.harness import answers, plain

_DEVNULL = "/dev/null"
_GET_DUMPABLE, _SET_DUMPABLE, _NO_NEW_PRIVS = (
    3,
    4,
    38,
)  # prctl's PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS


class Failed(BaseException):
    """The test failed because of the program's process (a BaseException: `except Exception` in a test
    does not catch it, and the failure is remembered anyway)."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class Remote:
    """A function, class or object of the program, standing in the test's namespace."""

    def __init__(self, program: "Program", ident: int, kind: str, name: str) -> None:
        self._rlstack_program, self._rlstack_id, self._rlstack_kind = program, ident, kind
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self._rlstack_program.call(self, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._rlstack_program.attribute(self, name)

    def __repr__(self) -> str:
        return f"<{self._rlstack_kind} {self.__name__} of the program>"

    def __iter__(self):
        return iter(self._rlstack_program.items(self))

    # A handle is not a value: the test may call it, read its attributes and iterate over it (each
    # answer plain data again), but one used as a value (truth, equality) fails the test: only the
    # program's object could say what it equals.
    def __bool__(self) -> bool:
        raise self._rlstack_not_a_value()

    def __eq__(self, other) -> bool:
        raise self._rlstack_not_a_value()

    def __ne__(self, other) -> bool:
        raise self._rlstack_not_a_value()

    __hash__ = object.__hash__

    def _rlstack_not_a_value(self) -> "Failed":
        return self._rlstack_program.fail(
            "not_plain_data",
            f"{self.__name__} is not plain data but an object of the program's, which the test used as a value: "
            "only plain data crosses to the test (no credit)",
        )


class Program:
    """The program's process, as the test sees it: one request at a time, one answer each."""

    def __init__(self) -> None:
        """Fork the program's process: called first thing, before the job is read (see `answers.py`)."""
        requests_read, requests_write = os.pipe()
        answers_read, answers_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                null = os.open(_DEVNULL, os.O_RDONLY)
                os.dup2(null, 0)  # where the job will arrive
                os.dup2(2, 1)  # the verdict's pipe
                for fd in (null, requests_write, answers_read):
                    os.close(fd)
                _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
                if _no_privileges():
                    answers.serve(requests_read, answers_write)
                else:
                    os.write(2, b"rlstack judge: the program's process could not drop its privileges\n")
            finally:
                os._exit(0)
        for fd in (requests_read, answers_write):
            os.close(fd)
        self.pid = pid
        self.calls, self.answers = requests_write, answers_read
        self.failure: Failed | None = None

    def ask(self, kind: str, *parts) -> tuple[str, list]:
        """Send one request (parts already in wire form) and read its answer."""
        if self.failure is not None:
            raise self.failure
        try:
            plain.send(self.calls, plain.pack(kind, *parts))
            return plain.unpack(plain.receive(self.answers))
        except (EOFError, BrokenPipeError):
            raise self.fail(*self.gone()) from None
        except plain.NotPlain as e:
            raise self.fail("not_plain_data", f"the program's process sent {e}") from None

    def fail(self, status: str, reason: str) -> Failed:
        """Remember the first failure of the program's process (the verdict, whatever the test does)."""
        if self.failure is None:
            self.failure = Failed(status, reason)
        return self.failure

    def gone(self) -> tuple[str, str]:
        """(status, reason) of a program's process that stopped answering: it has ended."""
        import signal

        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                name = signal.Signals(sig).name
            except ValueError:  # a real-time signal has no name there
                name = f"signal {sig}"
            if sig == signal.SIGXCPU:
                return "time_limit", f"the program's process ran out of CPU time ({name})"
            return "early_exit", f"the program's process was killed by {name} during the test: no credit"
        return "early_exit", (
            f"the program's process exited (status {os.WEXITSTATUS(status)}) during the test: no credit"
        )

    def load(self, program: str, names: list) -> dict:
        """Run the program in its process: the stand-ins (or plain values) for the `names` it defines,
        and none but those (a name the test did not ask for, such as a builtin's, is refused)."""
        kind, parts = self.ask("load", program, plain.to_wire(names))
        self.answered(kind, parts, 1)
        described = self.decode(parts[0], None, "its names")
        if type(described) is not dict or not set(described) <= set(names):
            raise self.fail(
                "not_plain_data", "the program's process named what the test did not ask for (no credit)"
            )
        return {name: self.described(value, name) for name, value in described.items()}

    def described(self, description, name: str):
        """A plain value, or the stand-in for a handle, from ("value", v) or (kind, id)."""
        if type(description) is tuple and len(description) == 2:
            what, value = description
            if what == "value":
                return value
            if what in _KINDS and type(value) is int:
                return Remote(self, value, what, name)
        raise self.fail("not_plain_data", f"the program's process described {name} wrongly (no credit)")

    def handles(self, what: str):
        """What makes the stand-ins for the handles in an answer (`what`: how the test names them)."""
        return lambda ident, kind: Remote(self, ident, "object", f"{what} (a {kind})")

    def call(self, target: Remote, args: tuple, kwargs: dict):
        where = f"an argument the test passes to {target.__name__}"
        wire = [plain.to_wire(list(args), _handle_of, where), plain.to_wire(kwargs, _handle_of, where)]
        kind, parts = self.ask("call", target._rlstack_id, *wire)
        self.answered(kind, parts, 3)
        what = f"what {target.__name__} returned"
        result = self.decode(parts[0], self.handles(what), what)
        after_args, after_kwargs = (
            self.decode(part, None, "an argument after the call") for part in parts[1:]
        )
        if not (
            type(after_args) is list
            and len(after_args) == len(args)
            and type(after_kwargs) is dict
            and set(after_kwargs) <= set(kwargs)
        ):
            raise self.fail(
                "not_plain_data", "the program's process answered with arguments the test did not pass"
            )
        for before, after in zip(args, after_args):
            _copy_back(before, after)
        for key, after in after_kwargs.items():
            _copy_back(kwargs[key], after)
        return result

    def attribute(self, target: Remote, name: str):
        kind, parts = self.ask("attribute", target._rlstack_id, name)
        self.answered(kind, parts, 1)
        return self.described(
            self.decode(parts[0], None, f"{target.__name__}.{name}"), f"{target.__name__}.{name}"
        )

    def items(self, target: Remote) -> list:
        """What iterating over the program's object gives, all at once (plain values or handles)."""
        kind, parts = self.ask("items", target._rlstack_id)
        self.answered(kind, parts, 1)
        items = self.decode(
            parts[0], self.handles(f"an item of {target.__name__}"), f"the items of {target.__name__}"
        )
        if type(items) is not list:
            raise self.fail("not_plain_data", "the program's process answered an iteration with no list")
        return items

    def answered(self, kind: str, parts: list, count: int) -> None:
        """Raise what an answer other than `ok` (with `count` parts) means: the program's exception, or a
        failure."""
        if kind == "ok" and len(parts) == count:
            return
        if kind == "raised" and len(parts) == 4 and [type(p) for p in parts] == [str, str, bool, str]:
            name, message, is_exception, base = parts
            if not is_exception:
                raise self.fail("early_exit", f"the program raised {name} during the test: no credit")
            raise _exception(name, message, base)
        if kind == "not_plain" and len(parts) == 1 and type(parts[0]) is str:
            raise self.fail("not_plain_data", parts[0] + ": only plain data crosses to the test (no credit)")
        raise self.fail("not_plain_data", f"the program's process sent a malformed answer ({kind!r})")

    def decode(self, part, handle, what: str):
        try:
            return plain.from_wire(part, handle)
        except plain.NotPlain as e:
            raise self.fail(
                "not_plain_data", f"{what}: {e}: only plain data crosses to the test (no credit)"
            ) from None

    def end(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, _signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = None


def _handle_of(value) -> list:
    if type(value) is Remote:
        return ["h", value._rlstack_id, ""]
    raise plain.NotPlain(f"a {type(value).__name__}, which is not plain data")


def _copy_back(before, after) -> None:
    """Make the test's own mutable argument hold what the program left in its copy."""
    if after is None or type(after) is not plain.plain_type(type(before)):
        return
    if isinstance(before, list):
        for i, item in enumerate(after[: len(before)]):
            _put(before, i, item)
        del before[len(after) :]
        before.extend(after[len(before) :])
    elif isinstance(before, dict):
        for key in [k for k in before if k not in after]:
            del before[key]
        for key, item in after.items():
            _put(before, key, item)
    elif isinstance(before, set):
        before.clear()
        before.update(after)
    elif isinstance(before, bytearray):
        before[:] = after


def _put(container, key, item) -> None:
    """`container[key] = item`, but a list, dict, set or bytearray already there is kept and made to
    hold `item` (a test may hold a reference to it)."""
    old = container[key] if isinstance(container, list) or key in container else None
    if type(old) in plain.MUTABLE and type(old) is type(item):
        _copy_back(old, item)
    else:
        container[key] = item


_made: dict = {}
_KINDS = ("callable", "class", "object")
_CONTROL_FLOW = ("StopIteration", "StopAsyncIteration")
"""Raised as themselves they would end the test's iteration (`all(map(candidate, ...))` of nothing is
True): the program's are raised as exceptions of their own that only share the name."""


def _exception(name: str, message: str, base: str) -> BaseException:
    """The program's exception as this process raises it: the builtin exception of that name, else a new
    class of that name under `base`, the first builtin exception of its class's ancestry (so a test's
    `except ValueError` catches the program's `class Empty(ValueError)`); marked as the program's."""
    import builtins

    def builtin(name: str):
        kind = getattr(builtins, name, None)
        if isinstance(kind, type) and issubclass(kind, Exception) and name not in _CONTROL_FLOW:
            return kind
        return None

    kind = builtin(name)
    if kind is None:
        parent = builtin(base) or Exception
        kind = _made.setdefault((name, parent), type(name, (parent,), {}))
    try:
        error = kind(message)
    except Exception:  # an exception class that needs other arguments (UnicodeDecodeError, ...)
        error = _made.setdefault((name, Exception), type(name, (Exception,), {}))(message)
    error._rlstack_raised_by_program = True
    return error


def _test_line(error: BaseException, test: str) -> str:
    """`line N: <source>` of the deepest frame of the test in `error`'s traceback, or ''."""
    line, tb = 0, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "test":
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = test.splitlines()
    return f"test line {line}: {lines[line - 1].strip()[:200]}" if 0 < line <= len(lines) else ""


def run(job: dict, program: Program) -> tuple[str, str]:
    """(status, reason) of one test."""
    import builtins

    try:
        test = compile(job["test"], "test", "exec")
        reference = {"__name__": "__main__", "__builtins__": builtins}
        if job["fixed"]:
            exec(compile(job["fixed"], "fixed", "exec"), reference)
    except Exception as e:
        return "bad_tests", f"the test (or the row's fixed code) does not run: {type(e).__name__}: {e}"
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        bound = program.load(job["program"], job["names"])
        namespace.update(bound)
        for name in job["modules"]:  # read as modules (`math.isclose`): the test's own, not the program's
            if name != job["keep"]:
                try:  # noqa: SIM105 - contextlib's import would cost every run
                    namespace[name] = __import__(name)
                except ImportError:
                    pass
        namespace.update({k: v for k, v in reference.items() if k != job["keep"] and not k.startswith("__")})
        exec(test, namespace)
    except BaseException as error:
        if program.failure is not None:
            return program.failure.status, program.failure.reason
        where = _test_line(error, job["test"])
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if getattr(error, "_rlstack_raised_by_program", False):
            return "runtime_error", f"{text} (raised by the program{', at ' + where if where else ''})"
        if isinstance(error, AssertionError):
            return "wrong_answer", f"{text}{' at ' + where if where else ''}"
        if isinstance(error, plain.NotPlain):
            return "bad_tests", f"{error}: the test passes it to the program, and only plain data crosses"
        return "runtime_error", f"{text} (in the test{', ' + where if where else ''})"
    if program.failure is not None:
        return program.failure.status, program.failure.reason
    return "passed", ""


def _libc(name: str):
    import _ctypes

    return lambda *args: _ctypes.call_function(_ctypes.dlsym(_ctypes.dlopen(None, os.RTLD_NOW), name), args)


def _no_privileges() -> bool:
    """In the program's process: no capability at all (`capset` to nothing) and no way to gain one
    (`PR_SET_NO_NEW_PRIVS`). The local sandbox gives it none already; a SandboxFusion server may run
    programs as root, whose CAP_SYS_PTRACE would reach the test's process despite its being
    non-dumpable."""
    version_3 = (0x20080522).to_bytes(4, "little") + bytes(4)  # _LINUX_CAPABILITY_VERSION_3, this process
    return _libc("prctl")(_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 and _libc("capset")(version_3, bytes(24)) == 0


def _not_dumpable() -> bool:
    """`prctl(PR_SET_DUMPABLE, 0)`, through `_ctypes` (what `ctypes` wraps; `ctypes` itself costs ~1 ms more)."""
    prctl = _libc("prctl")
    return prctl(_SET_DUMPABLE, 0, 0, 0, 0) == 0 and not prctl(_GET_DUMPABLE, 0, 0, 0, 0)


def main() -> None:
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    sys.set_int_max_str_digits(0)
    program = Program()  # before the job is read: nothing of the test is ever in the program's process
    if not _not_dumpable():
        os.write(2, b"rlstack judge: prctl(PR_SET_DUMPABLE, 0) failed\n")
        os._exit(3)
    chunks = []
    while chunk := os.read(0, 1 << 20):
        chunks.append(chunk)
    null = os.open(_DEVNULL, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    job = plain.parse_json(b"".join(chunks).decode())
    verdict = os.dup(1)  # the program's process never holds it; the test's own prints go to stderr
    os.dup2(2, 1)
    try:
        status, reason = run(job, program)
    finally:
        program.end()
    os.write(verdict, (plain.json_text({"status": status, "reason": reason[:2000]}) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
