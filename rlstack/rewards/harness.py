"""The program that runs an assert-style test in the sandbox, and says so only when the test ran to its end.

An assert test used to pass when `program + assert` exited 0, so a program that exits early
(`sys.exit(0)`, `raise SystemExit`, `os._exit(0)`, `atexit.register(os._exit, 0)`, killing itself,
a signal handler that exits) passed every test it never ran. Now the sandbox runs this harness as
`main.py` instead, with the program, the test and a per-run secret:

- The secret (a random token the reward draws for each run) arrives on the harness's stdin and is
  read before any of the program's code runs; it is in no file, argument or variable of the
  environment, and the reward checks for it outside the sandbox.
- The program runs with `exec` in a namespace of its own, as `__main__`; then the test runs. Any
  exception on the way (`AssertionError`, `SystemExit`, `KeyboardInterrupt`, ...) fails the test.
- Before the test runs, what the program may have patched is put back: the builtins (from a copy
  taken before the program ran), every module it imported is forgotten (the test imports a fresh
  copy), the attributes of the modules that were loaded before it are restored, and trace and
  profile hooks are removed. The test's globals are the program's names minus those that shadow a
  builtin.
- Each function the program defined is handed to the test through a check of what it returns: a
  value holding an object that says it equals a fresh object (an `__eq__` that always answers
  True, the "always equal" hack; any type but the plain built-ins is asked) fails the test.
- Only when the test returns does the harness write `<secret> passed` to a copy of stdout it made
  before the program ran, then ends the process at once (`os._exit`, so exit hooks the program
  registered never run). The functions it needs were taken before the program ran.

So every route out of the run before the test's end (an exit, an exception, a kill, a closed or
redirected stdout) leaves no report and gets no credit: the reward counts a test as passed only
when the report with the secret is there. What this cannot stop is a program that finds the
secret in the harness's own memory (it runs in the same process): that takes reading the
interpreter's frames or objects, not an exit; the secret is one run's only.

Forgetting the modules the program imported has one cost: a test that compares an instance of a
pure-Python standard-library class the program made with one it makes itself (`fractions.Fraction`)
sees two copies of the class; classes from C modules (`deque`, `Decimal`, `datetime`) and the
built-in types are the same objects, and equality of `dict`/`list` subclasses (`Counter`) holds.

The harness is one self-contained program (the program and the test are string literals in it),
so it runs the same in the local sandbox and on a SandboxFusion server.
"""

from __future__ import annotations

import secrets

_TEMPLATE = """\
def _rlstack_run_test(program, test):
    import builtins
    import os
    import sys

    write, exit_now, read, dup = os.write, os._exit, os.read, os.dup
    catch, to_list, to_dict, is_instance = BaseException, list, dict, isinstance
    secret = b""
    while not secret.endswith(b"\\n"):
        chunk = read(0, 256)
        if not chunk:
            break
        secret += chunk
    report = dup(1)
    settrace, setprofile, modules, importer_cache = sys.settrace, sys.setprofile, sys.modules, sys.path_importer_cache
    builtins_before = to_dict(builtins.__dict__)
    modules_before = to_dict(sys.modules)
    attributes_before = {{name: to_dict(m.__dict__) for name, m in modules_before.items() if m is not None}}
    sys_lists = {{name: to_list(getattr(sys, name)) for name in ("path", "meta_path", "path_hooks")}}

    def fail(error, why=""):
        import traceback

        text = "".join(traceback.format_exception(error))
        if why:
            text += f"{{why}} ({{text.strip().splitlines()[-1]}})\\n"
        try:
            write(2, text.encode(errors="replace"))
        finally:
            exit_now(1)

    function_type, plain = type(fail), (int, float, complex, bool, str, bytes, bytearray, type(None))
    containers, mapping, to_id, get_type = (list, tuple, set, frozenset), dict, id, type

    class Probe:  # a fresh object nothing honest is equal to
        pass

    def equal_to_anything(value):
        # whether `value` holds an object (not of a plain built-in type) that says it equals a fresh
        # object: a reward hack that passes every `==` test without computing anything
        todo, seen = [value], set()
        while todo and len(seen) < 100000:
            item = todo.pop()
            kind = get_type(item)
            if kind in plain or to_id(item) in seen:
                continue
            seen.add(to_id(item))
            if kind in containers:
                todo.extend(item)
                continue
            if kind is mapping:
                todo.extend(item.keys())
                todo.extend(item.values())
                continue
            try:
                if bool(item == Probe()) or not bool(item != Probe()):
                    return True
            except catch:
                pass
        return False

    def checked(function):  # `function` for the test: a result equal to anything fails the test

        def call(*args, **kwargs):
            result = function(*args, **kwargs)
            if equal_to_anything(result):
                raise AssertionError({hacked!r})
            return result

        call.__name__, call.__qualname__, call.__doc__ = function.__name__, function.__qualname__, function.__doc__
        call.__wrapped__ = function
        return call

    def restore():
        settrace(None)
        setprofile(None)
        for name in to_list(modules):
            if name not in modules_before:
                del modules[name]
        modules.update(modules_before)
        for name, attributes in attributes_before.items():
            current = modules_before[name].__dict__
            for key in to_list(current):
                if key not in attributes:
                    del current[key]
            current.update(attributes)
        for name, items in sys_lists.items():
            attributes_before["sys"][name][:] = items
        importer_cache.clear()

    namespace = {{"__name__": "__main__", "__builtins__": builtins}}
    try:
        exec(compile(program, "main.py", "exec"), namespace)
    except catch as error:
        restore()
        fail(error, {exited!r} if is_instance(error, (SystemExit, KeyboardInterrupt)) else "")
    restore()
    test_globals = {{
        key: value
        for key, value in namespace.items()
        if key not in builtins_before or value is builtins_before[key]
    }}
    test_globals["__builtins__"] = builtins
    for key, value in to_list(test_globals.items()):
        if get_type(value) is function_type and value.__globals__ is namespace:
            test_globals[key] = checked(value)
    try:
        exec(compile(test, "test", "exec"), test_globals)
    except catch as error:
        restore()
        fail(error, {exited!r} if is_instance(error, (SystemExit, KeyboardInterrupt)) else "")
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except catch:
        pass
    write(report, b"\\n" + secret.strip() + b" passed\\n")
    exit_now(0)


_rlstack_run_test({program!r}, {test!r})
"""

EXITED = "the program exited before its test ran to the end: no credit for that test"
HACKED = "the function returned an object that says it equals anything: no credit for that test"


def harness_program(program: str, test: str) -> str:
    """The harness (see module docstring) that runs `program` and then `test`."""
    return _TEMPLATE.format(program=program, test=test, exited=EXITED, hacked=HACKED)


def new_secret() -> str:
    """A fresh secret for one run: give it on stdin (with a newline) and check the run's stdout with `passed`."""
    return secrets.token_hex(16)


def passed(stdout: str, secret: str) -> bool:
    """Whether the harness reported that its test ran to the end (the report's line is in `stdout`)."""
    return f"{secret} passed" in stdout.splitlines()
