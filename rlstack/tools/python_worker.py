"""The interpreter loop that runs INSIDE the sandbox, one process per trajectory (see `tools/python.py`).

Never imported by the trainer: `PythonTool` writes this file into the sandbox's work directory as
`main.py` and `SandboxProcess` runs it with the sandbox's interpreter (`python -I -S -B`), so it uses
nothing but the standard library until the init message tells it where Pillow, NumPy and Matplotlib
live.

Protocol: frames of a 4-byte big-endian length and a body: an ASCII JSON object, or a PNG file. The
trainer's requests arrive on the process's original stdin, replies leave on its original stdout.
Before any user code runs, both are moved to new file descriptors that forked children close
(`os.register_at_fork`), fd 0 becomes /dev/null and fd 1 joins fd 2 (the console pipe the trainer
reads as the cell's output), so `print`, `os.write(1, ...)` or a subprocess writing to the terminal
cannot corrupt a reply by accident. A spare handle on the console puts fds 1 and 2 back before every
cell, whatever the previous one did to them.

This file is not a security boundary: a cell runs in this process and can do anything it does (write
frames of its own on the reply descriptor, read the requests, replace `send_reply`). The trainer
(`tools/python_channel.py`) therefore trusts nothing it reads here: it reads at most its limits,
takes a frame's content as no more than what the cell produced, and stops the interpreter on a reply
it cannot parse. The cuts made here (`max_value_chars`, `max_images`, `max_pixels`) only keep honest
replies small and inside those limits.

1. init `{"paths": [...], "images": ["image_1.png", ...], "variables": {name: str}, "max_pixels": int,
   "max_images": int, "max_value_chars": int}` (each image is loaded as the variable its file is named
   after; `variables` are set as they are) -> `{"ready": true}` or `{"ready": false, "error": str, "python": str}`.
2. `{"id": int, "code": str}` -> `{"id": int, "ok": bool, "error": str | None, "traceback": str |
   None, "value": str | None, "evaluated": bool, "images": int, "dropped_images": int, "notes": [str]}`, then `images`
   frames, each one PNG (RGB, at most `max_pixels`; at most `max_images` of them). Each text is at
   most `max_value_chars` characters and a note (an image that could not be encoded) about 500.
3. `{"id": int, "open": [path, ...]}` (paths the last cell printed) -> the same reply, its images those of
   the paths that are regular files and open as images.

A cell runs like a notebook cell: statements in one namespace that persists across requests, the
value of a final expression echoed (its repr, or the image itself when it is a PIL image or a
Matplotlib figure), `plt.show()`, `Figure.show()` and `Image.show()` captured as images.
"""

import ast
import builtins
import contextlib
import io
import json
import linecache
import os
import platform
import signal
import struct
import sys
import traceback

_HEADER = struct.Struct(">I")
_MAX_REQUEST_BYTES = 64 << 20
_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def read_frame(fd: int) -> dict | None:
    """The next message on `fd`, or None at end of file."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > _MAX_REQUEST_BYTES:
        raise ValueError(f"request of {size} bytes is larger than {_MAX_REQUEST_BYTES}")
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_frame(fd: int, message: dict) -> None:
    """`message` as a JSON frame (ASCII: every character at most 12 bytes, which the trainer's limit counts on)."""
    _write_all(fd, json.dumps(message).encode())


def send_reply(fd: int, request_id: int, reply: dict, pngs: list) -> None:
    """A cell's reply: its JSON (`images`: how many frames follow), then each PNG as a frame of its own."""
    write_frame(fd, {"id": request_id, **reply, "images": len(pngs)})
    for png in pngs:
        _write_all(fd, png)


def _write_all(fd: int, body: bytes) -> None:
    view = memoryview(_HEADER.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


def _claim_fds() -> tuple[int, int, int]:
    """Move the protocol off fds 0/1 (see module docstring) and keep a spare handle on the console.

    Returns (requests, replies, console); all three are closed in forked children.
    """
    requests, replies, console = os.dup(0), os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)

    def close_in_child() -> None:
        for fd in (requests, replies, console):
            with contextlib.suppress(OSError):
                os.close(fd)

    os.register_at_fork(after_in_child=close_in_child)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    return requests, replies, console


class Session:
    """One trajectory's namespace plus the hooks that turn shown images into reply images."""

    def __init__(self, init: dict, console: int) -> None:
        from PIL import Image

        self.Image = Image
        self.plt = self.Figure = None  # matplotlib is imported (and hooked) only when a cell imports it
        self.max_pixels = init["max_pixels"]
        self.max_images = init["max_images"]
        self.max_value_chars = init["max_value_chars"]
        self.console, self.stdout, self.stderr = console, sys.stdout, sys.stderr
        self.shown: list = []
        self.cells = 0
        self.namespace = {"__name__": "__main__", "__builtins__": builtins}
        for path in init["images"]:
            with Image.open(path) as img:
                img.load()
                self.namespace[os.path.splitext(path)[0]] = img.copy()
        self.namespace.update(init["variables"])
        shown = self.shown

        def show_image(image, *args, **kwargs) -> None:
            shown.append(image.copy())

        self.Image.Image.show = show_image
        self._hook_imports()

    def _hook_imports(self) -> None:
        """Hook `plt.show()` / `Figure.show()` right after a cell first imports matplotlib.pyplot.

        Importing matplotlib (and numpy under it) takes most of a second, so it is left to the cells
        that use it: the interpreter starts in about a tenth of that. The Agg backend is chosen
        through MPLBACKEND, so that nothing tries to open a window."""
        os.environ["MPLBACKEND"] = "Agg"
        real_import = builtins.__import__
        depth = [0]  # nested imports run while the outer one is still executing its module

        def hooked_import(name, *args, **kwargs):
            depth[0] += 1
            try:
                module = real_import(name, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0 and self.plt is None and "matplotlib.pyplot" in sys.modules:
                depth[0] += 1
                try:
                    self._install_pyplot_hooks()
                finally:
                    depth[0] -= 1
            return module

        builtins.__import__ = hooked_import

    def _install_pyplot_hooks(self) -> None:
        """`plt.show()` and `Figure.show()` hand what they show to the reply."""
        import matplotlib.figure
        import matplotlib.pyplot as plt

        self.plt, self.Figure = plt, matplotlib.figure.Figure
        shown = self.shown

        def show_figures(*args, **kwargs) -> None:
            shown.extend(plt.figure(num) for num in plt.get_fignums())
            plt.close("all")

        def show_figure(figure, *args, **kwargs) -> None:
            shown.append(figure)

        plt.show = show_figures
        self.Figure.show = show_figure

    def _shown_types(self) -> tuple[type, ...]:
        return (self.Image.Image,) if self.Figure is None else (self.Image.Image, self.Figure)

    def run(self, code: str) -> tuple[dict, list]:
        """Run one cell; the reply without its id, and the PNGs of the images it showed.

        Every text is cut here to `max_value_chars` (the trainer cuts again, trusting nothing of this)."""
        _reap_children()  # processes of earlier cells, killed by the trainer: zombies count against RLIMIT_NPROC
        self.cells += 1
        self.shown.clear()
        self._restore_console()
        filename = f"<cell {self.cells}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        reply = {"ok": True, "error": None, "traceback": None, "value": None, "evaluated": False}
        try:
            value, reply["evaluated"] = self._execute(code, filename)
        except BaseException as e:  # SystemExit and KeyboardInterrupt are the cell's errors too
            error = _cut(traceback.format_exception_only(type(e), e)[-1].strip(), self.max_value_chars)
            reply.update(ok=False, error=error, traceback=_short_traceback(e, self.max_value_chars))
            value = None
        for stream in (sys.stdout, sys.stderr, self.stdout, self.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if isinstance(value, self._shown_types()):
            self.shown.append(value)
        elif value is not None:
            reply["value"] = _short_repr(value, self.max_value_chars)
        pngs, notes = self._encode_shown()
        reply.update(notes=notes, dropped_images=max(0, len(self.shown) - self.max_images))
        return reply, pngs

    def open_printed(self, paths: list) -> tuple[dict, list]:
        """The images at `paths` (files the cell printed the path of, CodeV's way of showing a crop), as
        a cell's reply: what is not a regular file is skipped, what does not open as an image is a note."""
        self.shown.clear()
        notes = []
        for path in paths:
            if not isinstance(path, str) or not os.path.isfile(path):
                continue
            try:
                with self.Image.open(path) as image:
                    image.load()
                    self.shown.append(image.copy())
            except Exception as e:
                notes.append(_cut(f"{path} was printed but is not an image: {type(e).__name__}", 500))
        pngs, more = self._encode_shown()
        reply = {"ok": True, "error": None, "traceback": None, "value": None, "evaluated": False}
        reply.update(notes=notes + more, dropped_images=max(0, len(self.shown) - self.max_images))
        return reply, pngs

    def _restore_console(self) -> None:
        """fds 1 and 2, sys.stdout and sys.stderr back on the console pipe, whatever earlier cells did to them."""
        os.dup2(self.console, 1)
        os.dup2(self.console, 2)
        if self.stdout.closed:
            self.stdout = _console_stream(1)
        if self.stderr.closed:
            self.stderr = _console_stream(2)
        sys.stdout, sys.stderr = self.stdout, self.stderr

    def _execute(self, code: str, filename: str):
        """Run the statements; evaluate a final expression (like a notebook): (its value, whether there was one)."""
        tree = ast.parse(code, filename, "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, filename, "exec"), self.namespace)
        if last is None:
            return None, False
        return eval(compile(ast.Expression(last.value), filename, "eval"), self.namespace), True

    def _encode_shown(self) -> tuple[list, list]:
        pngs, notes = [], []
        for item in self.shown[: self.max_images]:
            try:
                pngs.append(self._png(item))
            except Exception as e:
                notes.append(_cut(f"an image could not be returned: {type(e).__name__}: {e}", 500))
        return pngs, notes

    def _png(self, item) -> bytes:
        if self.Figure is not None and isinstance(item, self.Figure):
            buf = io.BytesIO()
            item.savefig(buf, format="png")
            buf.seek(0)
            item = self.Image.open(buf)
        image = item.convert("RGB")
        width, height = image.size
        if width * height > self.max_pixels:  # the trainer refuses more; it fits the size exactly
            scale = (self.max_pixels / (width * height)) ** 0.5
            w = min(max(1, int(width * scale)), self.max_pixels)  # a thin image keeps a side of 1
            h = max(1, min(int(height * scale), self.max_pixels // w))  # and rounding errs down
            image = image.resize((w, h))
        image.info.clear()  # no ICC profile or text chunks: an RGB PNG of at most 4 bytes a pixel
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()


def _console_stream(fd: int) -> io.TextIOWrapper:
    """A fresh sys.stdout / sys.stderr on `fd` (for the rest of the session, so not a context manager)."""
    return open(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _cell_traceback(e: BaseException) -> str:
    """The traceback from the first frame of user code on (this file's frames are noise to the model)."""
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell "):
        tb = tb.tb_next
    if tb is None:  # a syntax error: the cell never ran
        return "".join(traceback.format_exception_only(type(e), e))
    return "".join(traceback.format_exception(type(e), e, tb))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def _short_traceback(e: BaseException, limit: int) -> str:
    """The cell's traceback, each line cut to a quarter of `limit` or 200 characters (a message can
    be megabytes long), then its last `limit` characters."""
    lines = [_cut(line, max(limit // 4, 200)) for line in _cell_traceback(e).splitlines()]
    text = "\n".join(lines)
    return text if len(text) <= limit else "..." + text[len(text) - max(1, limit - 3) :]


def _short_repr(value, limit: int) -> str:
    try:
        text = repr(value)
    except Exception as e:
        return _cut(f"<repr failed: {type(e).__name__}: {e}>", limit)
    return _cut(text, limit)


def _start(init: dict, console: int):
    """Make the trainer's packages importable and build the session; an error message when that fails."""
    for var in _THREAD_VARS:
        os.environ[var] = "1"  # one BLAS thread: the process limit counts threads, and so does the CPU budget
    sys.path.extend(p for p in init["paths"] if p not in sys.path)
    try:
        import PIL.Image  # noqa: F401

        return Session(init, console), None
    except Exception as e:
        return None, _cut(f"{type(e).__name__}: {e}", 1000)


def main() -> None:
    requests, replies, console = _claim_fds()
    # Past the file size limit, writes fail with OSError (EFBIG) instead of the signal killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    init = read_frame(requests)
    if init is None:
        return
    session, error = _start(init, console)
    if session is None:
        python = f"{sys.executable} {platform.python_version()}"
        write_frame(replies, {"ready": False, "error": error, "python": python})
        return
    write_frame(replies, {"ready": True})
    worker = os.getpid()
    while True:
        request = read_frame(requests)
        if request is None:
            return
        if "open" in request:
            reply, pngs = session.open_printed(request["open"])
        else:
            reply, pngs = session.run(request["code"])
        if os.getpid() != worker:  # a child the cell forked that returned here: it has no protocol
            os._exit(0)
        send_reply(replies, request["id"], reply, pngs)


if __name__ == "__main__":
    main()
