"""The program's process: runs the program and answers the test's calls, and nothing else.

Forked by the test's process (`judge.py`) as the first thing that process does, before it has read
its job: so nothing of the test (its text, the row's fixed code) was ever in this process's memory.
The child then drops what it inherited (stdin, where the job will arrive, is /dev/null; stdout, the
verdict's pipe, becomes the run's stderr) and keeps two pipes, one for the test's requests and one
for its answers. Only then does the program exist here. Whatever the program does in this process
(walk the frames, patch modules, fork, read its own memory, exit) changes only what it answers.

Requests (`plain.py` messages) and their answers:
- `load` (program, names): run the program as `__main__`; answer `ok` with, for each of `names` it
  defines, `("value", v)` for plain data or `(kind, id)` for a function, class or other object that
  stays here (`callable`, `class`, `object`).
- `call` (id, args, kwargs): call it; answer `ok` (result, the list and dict arguments afterwards,
  the same for keyword arguments), where the result is plain data in which anything else (an object
  of the program's class, a generator) is a handle;
- `attribute` (id, name): `ok` (`("value", v)` or `(kind, id)`);
- `items` (id): `ok` (a list of what iterating over the object gives, plain data or handles).
Any request may be answered `raised` (type name, message, whether it is an Exception, the first
builtin class of its ancestry) or `not_plain` (what could not cross).
"""

import builtins
import sys

if __name__ in ("__main__", "answers"):  # in the sandbox: the script's first lines made `plain` from plain.py
    import plain
else:
    from rlstack.rewards.harness import plain


def serve(requests: int, answers: int) -> None:
    """Answer the test's requests (on descriptor `requests`, answers on `answers`) until it hangs up."""
    kind_of, is_callable, Module = type, callable, type(sys)  # taken before the program can rebind them
    objects: dict = {}

    def keep(value, kind: str) -> int:
        objects[len(objects) + 1] = (value, kind)
        return len(objects)

    def describe(value) -> list:
        """The wire form of ("value", value) for plain data, else of (kind, id) for a handle."""
        try:
            return ["t", "value", plain.to_wire(value)]
        except plain.NotPlain:
            pass
        if issubclass(kind_of(value), type):
            return ["t", "class", keep(value, "class")]
        return ["t", "callable" if is_callable(value) else "object", keep(value, "object")]

    def answer(kind: str, *parts) -> None:
        plain.send(answers, plain.pack(kind, *parts))

    def raised(error: BaseException) -> None:
        kind = kind_of(error)
        try:
            message = str(error)[:2000]
        except BaseException:  # noqa: BLE001 - its own __str__ may fail
            message = ""
        base = next(k for k in kind.__mro__ if type.__getattribute__(k, "__module__") == "builtins")
        name = type.__getattribute__(kind, "__name__")
        answer("raised", name, str.__str__(message), issubclass(kind, Exception), base.__name__)

    def handle(value) -> list:
        """The wire form of a handle to `value`, which stays here."""
        kind = kind_of(value)
        return ["h", keep(value, "class" if issubclass(kind, type) else "object"), plain.type_name(kind)]

    kind, parts = plain.unpack(plain.receive(requests))
    program, names = parts[0], plain.from_wire(parts[1])
    module = Module("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    try:
        exec(compile(program, "program.py", "exec"), module.__dict__)
    except BaseException as error:  # noqa: BLE001 - what the program raised is the answer
        raised(error)
        return
    answer("ok", ["d", *_manifest(module.__dict__, names, describe, Module)])
    while True:
        try:
            kind, parts = plain.unpack(plain.receive(requests))
        except EOFError:
            return
        try:
            if kind == "call":
                _call(parts, objects, kind_of, handle, answer)
            elif kind == "items":
                answer("ok", plain.to_wire(list(objects[parts[0]][0]), handle))
            else:  # "attribute"
                target, name = objects[parts[0]][0], parts[1]
                answer("ok", describe(getattr(target, name)))
        except plain.NotPlain as e:
            answer("not_plain", str(e))
        except BaseException as error:  # noqa: BLE001
            raised(error)


def _manifest(namespace: dict, names: list, describe, Module) -> list:
    """The wire form of {name: description} for the `names` the program defines (modules left out)."""
    out = []
    for name in names:
        if name in namespace and type(namespace[name]) is not Module:
            out += [name, describe(namespace[name])]
    return out


def _call(parts: list, objects: dict, kind_of, handle, answer) -> None:
    target = objects[parts[0]][0]
    handles = lambda ident, _: objects[ident][0]  # noqa: E731 - the test hands back a handle of ours
    args = plain.from_wire(parts[1], handles)
    kwargs = plain.from_wire(parts[2], handles)
    result = target(*args, **kwargs)
    name = getattr(target, "__name__", "the function")
    wire = plain.to_wire(result, handle, f"what {name} returned")
    after = [a if kind_of(a) in plain.MUTABLE else None for a in args]
    after_kw = {k: (v if kind_of(v) in plain.MUTABLE else None) for k, v in kwargs.items()}
    where = f"an argument of {name} after the call"
    answer("ok", wire, plain.to_wire(after, None, where), plain.to_wire(after_kw, None, where))
