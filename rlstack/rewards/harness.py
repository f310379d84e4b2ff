"""The program that runs an assert-style test in the sandbox, and says so only when the test ran to its end.

An assert test used to pass when `program + assert` exited 0, so a program that exits early
(`sys.exit(0)`, `raise SystemExit`, `os._exit(0)`, `atexit.register(os._exit, 0)`, killing itself,
a signal handler that exits) passed every test it never ran. Now the sandbox runs this harness as
`main.py` instead, with the program, the test and a per-run secret:

- The secret (a random token the reward draws for each run) arrives on the harness's stdin and is
  read before any of the program's code runs; then stdin is replaced by /dev/null (its file cannot
  be rewound to read the secret again) and `main.py` is deleted (the test's text is in no file).
  The reward checks for the secret outside the sandbox.
- The modules the test imports, and the standard-library modules it names without importing
  (`math.isclose` relying on the program's `import math`), are imported first: they are among the
  modules whose state is put back below, the program gets the same modules, and the test gets the
  real ones under those names whatever the program bound to them (but a function the program
  defined under such a name).
- A row's fixed code (a HumanEval prompt's helpers, e.g. `encode_cyclic`) is run first in a
  namespace of its own; the test sees those definitions, not the program's, except the function
  under test. The test is compiled before the program runs, and audit hooks are refused (one
  could read the test's source as it is compiled).
- The program runs with `exec` as the `__main__` module; then the test runs. Any exception on the
  way (`AssertionError`, `SystemExit`, `KeyboardInterrupt`, ...) fails the test.
- Before the test runs, and again after each call the test makes into the program, what the
  program may have patched is put back: the builtins, the attributes of every module loaded
  before it ran and the entries of `sys.modules` for them, `sys.path` and the import hooks, trace
  and profile hooks, signal handlers and interval timers. What is taken away is kept alive, so no
  finalizer of the program's runs while the state is put back; the garbage collector runs once
  after the program and is then off. A program that leaves threads running gets no credit (they
  could change what the test sees). The test's globals are the program's names minus those that
  shadow a builtin.
- Each callable the program defined (functions, `lru_cache` wrappers, callable objects) reaches
  the test through a check of what it returns: a value holding an object that says it equals
  fresh objects and random values, or is below -inf or above +inf (the "always equal" hack and its
  kin: `__eq__`, `__lt__` that always answer True), fails the test; containers are looked into,
  subclasses (namedtuples, `defaultdict`) included.
- Only when the test returns does the harness write `<secret> passed` to a copy of stdout it made
  before the program ran, then ends the process at once (`os._exit`, so exit hooks the program
  registered never run). The functions it needs were taken before the program ran.

So every route out of the run before the test's end (an exit, an exception, a kill, a closed or
redirected stdout) leaves no report and gets no credit: the reward counts a test as passed only
when the report with the secret is there.

What this cannot stop, because the program and the test share one interpreter: a program that
walks the interpreter's frames (`sys._getframe(1)`, `f_back`) can read the secret from the
harness's variables and forge the report, or read the test's constants; one that patches classes
(rather than module attributes) of modules loaded before it keeps those patches. These take
knowing this harness, not an exit. Closing them takes running the test in another process than
the program (not done).

The harness is one self-contained program (the program and the test are string literals in it),
so it runs the same in the local sandbox and on a SandboxFusion server.
"""

from __future__ import annotations

import ast
import functools
import re
import secrets
import sys

_TEMPLATE = r"""
def _rlstack_run_test(program, test, fixed, keep, preload, module_names):
    import _signal
    import _thread
    import builtins
    import gc
    import math
    import os
    import sys

    write, exit_now, read, dup, dup2 = os.write, os._exit, os.read, os.dup, os.dup2
    catch, to_list, to_dict, get_type, to_id, to_bool = BaseException, list, dict, type, id, bool
    exit_types, is_instance = (SystemExit, KeyboardInterrupt), isinstance
    secret = b""
    while not secret.endswith(b"\n"):
        chunk = read(0, 256)
        if not chunk:
            break
        secret += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    dup2(null, 0)
    os.close(null)
    try:
        os.unlink(sys.argv[0])
    except OSError:
        pass
    report = dup(1)
    for name in preload:
        try:
            __import__(name)
        except catch:
            pass
    test_code = compile(test, "test", "exec")

    def no_hooks(event, args):
        if event == "sys.addaudithook":
            raise RuntimeError("audit hooks are not allowed here")

    sys.addaudithook(no_hooks)
    settrace, setprofile, modules, importer_cache = sys.settrace, sys.setprofile, sys.modules, sys.path_importer_cache
    collect, thread_count, stdout, function_type = gc.collect, _thread._count, sys.stdout, get_type(no_hooks)
    set_signal, get_signal, set_timer, alarm = _signal.signal, _signal.getsignal, _signal.setitimer, _signal.alarm
    timers = (_signal.ITIMER_REAL, _signal.ITIMER_VIRTUAL, _signal.ITIMER_PROF)
    handlers = {}
    for number in range(1, _signal.NSIG):
        try:
            handlers[number] = get_signal(number)
        except catch:
            pass
    reference = {"__name__": "__main__", "__builtins__": builtins}
    if fixed:
        exec(compile(fixed, "fixed", "exec"), reference)
    main = get_type(sys)("__main__")
    namespace = main.__dict__
    namespace["__builtins__"] = builtins
    modules["__main__"] = main
    builtins_before = to_dict(builtins.__dict__)
    modules_before = to_dict(modules)
    attributes_before = [
        (m.__dict__, to_dict(m.__dict__))
        for m in modules_before.values()
        if m is not main and get_type(getattr(m, "__dict__", None)) is dict
    ]
    lists_before = [(getattr(sys, name), to_list(getattr(sys, name))) for name in ("path", "meta_path", "path_hooks")]
    kept = []  # what a restore takes away is kept alive: no finalizer of the program's runs during one

    def fail(error, why=""):
        import traceback

        text = "".join(traceback.format_exception(error))
        if why:
            text += why + " (" + text.strip().splitlines()[-1] + ")\n"
        try:
            write(2, text.encode(errors="replace"))
        finally:
            exit_now(1)

    def restore():
        settrace(None)
        setprofile(None)
        alarm(0)
        for timer in timers:
            set_timer(timer, 0)
        for number, handler in handlers.items():
            try:
                if get_signal(number) is not handler:
                    kept.append(set_signal(number, handler))
            except catch:
                pass
        for name in preload:
            if name not in modules_before and name in modules:
                kept.append(modules.pop(name))
        for name, module in modules_before.items():
            if modules.get(name) is not module:
                kept.append(modules.get(name))
                modules[name] = module
        for current, attributes in attributes_before:
            for key in to_list(current):
                if get_type(key) is not str or key not in attributes:
                    kept.append(current.pop(key))
                elif current[key] is not attributes[key]:
                    kept.append(current[key])
                    current[key] = attributes[key]
            for key, value in attributes.items():
                if key not in current:
                    current[key] = value
        for current, items in lists_before:
            if len(current) != len(items) or any(a is not b for a, b in zip(current, items)):
                kept.append(to_list(current))
                current[:] = items
        importer_cache.clear()
        if thread_count():
            raise RuntimeError(__THREADS__)

    class Probe:
        pass

    plain = (int, float, complex, bool, str, bytes, bytearray, get_type(None))
    probes = (Probe(), object(), -7306392951583920461, "b3c1f0e9a7d24c68", 0.6180339887498949)
    low, high = -math.inf, math.inf
    sequences, sets, mapping = (list, tuple), (set, frozenset), dict

    def says_equal_to_anything(item):
        checks = [lambda probe=probe: item == probe for probe in probes]
        checks += [lambda probe=probe: not (item != probe) for probe in probes]
        checks += [lambda: item < low, lambda: item > high]
        for check in checks:
            try:
                if to_bool(check()):
                    return True
            except catch:
                pass
        return False

    def equal_to_anything(value):
        todo, seen, steps = [value], set(), 0
        while todo and steps < 100000:
            steps += 1
            item = todo.pop()
            kind = get_type(item)
            if kind in plain or to_id(item) in seen:
                continue
            seen.add(to_id(item))
            if kind not in sequences and kind not in sets and kind is not mapping and says_equal_to_anything(item):
                return True
            if is_instance(item, sequences):
                todo.extend(tuple.__iter__(item) if is_instance(item, tuple) else list.__iter__(item))
            elif is_instance(item, sets):
                todo.extend(frozenset.__iter__(item) if is_instance(item, frozenset) else set.__iter__(item))
            elif is_instance(item, mapping):
                todo.extend(dict.keys(item))
                todo.extend(dict.values(item))
        return False

    def checked(function):
        def call(*args, **kwargs):
            try:
                result = function(*args, **kwargs)
            finally:
                restore()
            if get_type(result) in plain:  # nothing of the program's to ask
                return result
            try:
                hacked = equal_to_anything(result)
            finally:
                restore()
            if hacked:
                raise AssertionError(__HACKED__)
            return result

        for name in ("__name__", "__qualname__", "__doc__"):
            try:
                setattr(call, name, getattr(function, name))
            except catch:
                pass
        call.__wrapped__ = function
        return call

    try:
        exec(compile(program, "main.py", "exec"), namespace)
        restore()
        collect()
        restore()
        gc.disable()
    except catch as error:
        fail(error, __EXITED__ if is_instance(error, exit_types) else "")
    test_globals = {
        key: value
        for key, value in namespace.items()
        if get_type(key) is str and (key not in builtins_before or value is builtins_before[key])
    }
    for key, value in to_list(test_globals.items()):
        if key.startswith("__") or get_type(value) is get_type(sys) or is_instance(value, get_type):
            continue
        if callable(value):
            test_globals[key] = checked(value)
    for name in module_names:
        if name in modules and get_type(test_globals.get(name)) is not function_type:
            test_globals[name] = modules[name]
    for key, value in reference.items():
        if key != keep and not key.startswith("__"):
            test_globals[key] = value
    test_globals["__builtins__"] = builtins
    try:
        restore()
        exec(test_code, test_globals)
        restore()
    except catch as error:
        fail(error, __EXITED__ if is_instance(error, exit_types) else "")
    try:
        stdout.flush()
    except catch:
        pass
    write(report, b"\n" + secret.strip() + b" passed\n")
    exit_now(0)


_rlstack_run_test(__PROGRAM__, __TEST__, __FIXED__, __KEEP__, __PRELOAD__, __MODULE_NAMES__)
"""

EXITED = "the program exited before its test ran to the end: no credit for that test"
HACKED = "the function returned an object that says it equals anything: no credit for that test"
THREADS = "the program left threads running while its test ran: no credit for that test"


def harness_program(program: str, test: str, fixed: str = "", keep: str = "") -> str:
    """The harness (see module docstring) that runs `program` and then `test`; `fixed`: code whose
    definitions the test sees instead of the program's, except `keep` (the function under test)."""
    names = used_module_names(test)
    values = {
        "__PROGRAM__": program,
        "__TEST__": test,
        "__FIXED__": fixed,
        "__KEEP__": keep,
        "__PRELOAD__": tuple(dict.fromkeys(test_imports(test + "\n" + fixed) + names)),
        "__MODULE_NAMES__": names,
        "__EXITED__": EXITED,
        "__HACKED__": HACKED,
        "__THREADS__": THREADS,
    }
    return _PLACEHOLDER.sub(lambda match: repr(values[match.group(0)]), _TEMPLATE)


_PLACEHOLDER = re.compile(r"__(PROGRAM|TEST|FIXED|KEEP|PRELOAD|MODULE_NAMES|EXITED|HACKED|THREADS)__")
"""The template's placeholders, all replaced in one pass (so the program's text is never searched)."""


@functools.lru_cache(maxsize=4096)
def test_imports(code: str) -> tuple[str, ...]:
    """The absolute modules `code` imports anywhere (top level or inside functions), in order."""
    tree = _parse(code)
    if tree is None:
        return ()
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found = [node.module]
        else:
            continue
        names += [name for name in found if name not in names]
    return tuple(names)


@functools.lru_cache(maxsize=4096)
def used_module_names(code: str) -> tuple[str, ...]:
    """Standard-library module names `code` reads as plain names (`math.isclose(...)` without an
    import: the program's `import math` is relied on). The test gets the real modules under them."""
    tree = _parse(code)
    if tree is None:
        return ()
    loaded = {
        node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    return tuple(
        sorted(name for name in loaded if name in sys.stdlib_module_names and not name.startswith("_"))
    )


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def new_secret() -> str:
    """A fresh secret for one run: give it on stdin (with a newline) and check the run's stdout with `passed`."""
    return secrets.token_hex(16)


def passed(stdout: str, secret: str) -> bool:
    """Whether the harness reported that its test ran to the end (the report's line is in `stdout`)."""
    return f"{secret} passed" in stdout.splitlines()
