"""builtin:python: notebook behaviour, images, and hostile code contained in the sandbox.

Each test starts real sandboxed interpreters (about half a second each); limits are short so that
the file runs in well under a minute on two cores.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image
from python_cells import making_tools, run

from rlstack.rewards.sandbox import processes, processes_of_uid
from rlstack.tools import python as python_tool
from rlstack.tools import python_packages
from rlstack.tools.base import MIN_PIXELS, ToolCall
from rlstack.tools.python import PythonTool

ROOT = os.geteuid() == 0
"""As root the sandbox runs code under a uid of its own (rewards/sandbox/); some checks need that."""
needs_root = pytest.mark.skipif(
    not ROOT, reason="checks the interpreter's own uid, which only a root caller gives it"
)
SMALL = dict(
    timeout_s=3.0, cpu_s=20.0, memory_mb=1024, file_size_mb=16, max_processes=16, startup_timeout_s=30.0
)


@pytest.fixture
def spawned(monkeypatch):
    """Every sandboxed process the tests start; afterwards, none of them may have left anything behind."""
    processes = []
    real = python_tool.SandboxProcess

    def spy(*args, **kwargs):
        process = real(*args, **kwargs)
        processes.append(process)
        return process

    monkeypatch.setattr(python_tool, "SandboxProcess", spy)
    yield processes
    uids = {p.uid for p in processes if p.uid is not None}
    for process in processes:
        assert process.poll() is not None, "an interpreter was left running"
        assert not os.path.exists(process.workdir)
    for uid in uids:
        assert processes_of_uid(uid) == []
    assert _files_owned_by(uids) == []


def _files_owned_by(uids: set[int]) -> list[str]:
    """Entries of the world-writable directories owned by `uids` (others' tests may create theirs meanwhile)."""
    found = []
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        for entry in os.scandir(d):
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid in uids:
                    found.append(entry.path)
    return found


@pytest.fixture
def make_tool(spawned):
    with making_tools(**SMALL) as make:
        yield make


def _only_worker_left(tool: PythonTool) -> bool:
    left = processes_of_uid(tool._interpreter.process.uid)
    return len(left) == 1 and processes._pid_in_namespace(left[0]) == 2


@needs_root
def test_state_persists_within_and_is_isolated_between_trajectories(make_tool, spawned):
    a, b = make_tool(), make_tool()
    assert run(a, "x = 41\nimport math").text == "(no output)"
    assert run(b, "x = 1").ok
    obs = run(a, "print(x + 1, math.pi > 3)\nopen('note.txt', 'w').write('a')")
    assert (obs.ok, obs.text) == (True, "42 True\n1")  # printed output, then the final expression's repr
    assert run(b, "print(x, 'math' in dir())").text == "1 False"
    assert run(b, "import os\nos.path.exists('note.txt')").text == "False"
    assert spawned[0].workdir != spawned[1].workdir and spawned[0].uid != spawned[1].uid


def test_input_images_by_name_and_as_files(make_tool):
    red = Image.new("RGB", (64, 48), (255, 0, 0))
    gray = Image.new("L", (20, 30), 7)
    tool = make_tool([red, gray])
    code = (
        "import os\nimport numpy as np\nfrom PIL import Image\n"
        "print(image_1.size, image_2.mode, np.asarray(image_1)[0, 0].tolist())\n"
        "print(sorted(f for f in os.listdir('.') if f.endswith('.png')), Image.open('image_2.png').getpixel((0, 0)))"
    )
    obs = run(tool, code)
    assert obs.ok, obs.text
    assert obs.text == "(64, 48) L [255, 0, 0]\n['image_1.png', 'image_2.png'] 7"
    assert "image_1" in PythonTool.schema["function"]["description"]


def test_input_images_are_named_by_the_tool_contract(make_tool):
    """PyVision's checkpoints read `image_clue_0`, ...; CodeV's open the file named in `image_filename`."""
    red, gray = Image.new("RGB", (64, 48), (255, 0, 0)), Image.new("L", (20, 30), 7)
    pyvision = make_tool([red, gray], contract="pyvision")
    code = "import os\nprint(image_clue_0.size, image_clue_1.mode, sorted(f for f in os.listdir('.') if f.endswith('.png')))"
    assert run(pyvision, code).text == "(64, 48) L ['image_clue_0.png', 'image_clue_1.png']"
    assert "NameError" in run(pyvision, "image_1").text
    lost = run(pyvision, "import os\nos._exit(3)").text  # the restart names the images as the contract does
    assert "with the input images loaded again (image_clue_0, image_clue_1)" in lost
    codev = make_tool([red], contract="codev")
    code = "from PIL import Image\nprint(image_filename, Image.open(image_filename).size)"
    assert run(codev, code).text == "image_1.png (64, 48)"
    assert run(make_tool([], contract="codev"), "print('image_filename' in dir())").text == "False"


def test_reset_gives_the_next_trajectory_its_own_images(make_tool):
    tool = make_tool([Image.new("RGB", (4, 4), (255, 0, 0))])
    assert run(tool, "print(image_1.getpixel((0, 0)))").text == "(255, 0, 0)"
    tool.reset([Image.new("RGB", (4, 4), (0, 0, 255))], {})  # a tool instance reused for another trajectory
    assert (
        run(tool, "print(image_1.getpixel((0, 0)), open('image_1.png', 'rb').read() != b'')").text
        == "(0, 0, 255) True"
    )


def test_shown_images_come_back_resized(make_tool):
    max_pixels = 64 * 28 * 28
    # matplotlib's first import takes seconds on a loaded 2-core machine: past SMALL's 3 s limit
    tool = make_tool(
        [Image.new("RGB", (40, 30), (0, 200, 0))],
        max_pixels=max_pixels,
        max_images_per_call=3,
        timeout_s=20.0,
    )
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 3, 2])\nplt.show()\n"
        "image_1.resize((3000, 2000)).show()\n"
        "image_1.crop((0, 0, 5, 5))"
    )
    obs = run(tool, code)
    assert obs.ok and obs.text == "", obs.text
    assert len(obs.images) == 3
    for img in obs.images:
        w, h = img.size
        assert img.mode == "RGB" and w % 28 == 0 and h % 28 == 0 and MIN_PIXELS <= w * h <= max_pixels
    assert obs.images[2].getpixel((0, 0)) == (0, 200, 0)
    assert obs.images[1].size[0] > obs.images[1].size[1]  # aspect ratio kept (3:2)

    obs = run(tool, "for _ in range(5):\n    image_1.show()\nfig = plt.figure()\nfig")
    assert len(obs.images) == 3 and "3 more were not (at most 3 per call)" in obs.text


def test_a_printed_image_path_comes_back_as_the_image(make_tool):
    """CodeV's programs save a crop and print its path: the file, read in the sandbox, comes back."""
    tool = make_tool([Image.new("RGB", (60, 40), (0, 0, 200))], max_images_per_call=2, contract="codev")
    code = (
        "import os\nos.makedirs('/tmp/out', exist_ok=True)\n"
        "image_1.crop((0, 0, 30, 40)).save('crop.png')\n"
        "Image.new('RGB', (50, 50), (200, 0, 0)).save('/tmp/out/red.jpg')\n"
        "open('fake.png', 'w').write('not an image')\n"
        "print('crop.png')\nprint(\"'/tmp/out/red.jpg'\")\nprint('missing.png')\n"
        "print('saved crop.png and more')"  # a sentence naming a file is not a path
    )
    obs = run(tool, "from PIL import Image\nimage_1 = Image.open(image_filename)\n" + code)
    assert obs.ok and len(obs.images) == 2, obs.text
    assert obs.images[0].getpixel((0, 0)) == (0, 0, 200) and obs.images[1].getpixel((5, 5))[0] > 150
    assert obs.images[0].size[0] < obs.images[0].size[1]  # the crop's aspect ratio (30 x 40), fitted
    assert obs.text.startswith("crop.png\n'/tmp/out/red.jpg'\nmissing.png")
    obs = run(tool, "print('fake.png')")  # a file that is not an image: said, no image
    assert obs.images == [] and "fake.png was printed but is not an image" in obs.text
    obs = run(tool, "image_1.show()\nimage_1.show()\nprint('crop.png')")  # no room left: said
    assert len(obs.images) == 2 and "1 more were not (at most 2 per call)" in obs.text
    off = make_tool([Image.new("RGB", (60, 40))], printed_images=False, contract="codev")
    assert run(off, "print(image_filename)").images == []
    plain = make_tool([Image.new("RGB", (60, 40))])  # rlstack's contract: printed paths are text
    assert run(plain, "print('image_1.png')").images == []
    on = make_tool([Image.new("RGB", (60, 40))], printed_images=True)
    assert len(run(on, "print('image_1.png')").images) == 1


def test_a_cell_ending_in_an_expression_that_ran_is_evaluated(make_tool):
    """NeMo RL's code environment's test for terminate_on_evaluation: the last statement an expression
    (print(...) included), evaluated without error."""
    tool = make_tool()
    assert [run(tool, code).evaluated for code in ("x = 1", "x + 1", "print(x)", "x = 1\n1 / 0", "y")] == [
        False,
        True,
        True,
        False,
        False,
    ]


def test_output_truncation_errors_and_state_kept(make_tool):
    tool = make_tool(max_output_chars=300)  # printed output, value and traceback share the 300 characters
    obs = run(tool, "y = 5\nprint('a' * 1000)")
    assert obs.ok and obs.text.startswith(
        "a" * 300 + "\n[output truncated to 300 characters; 1001 bytes in all]"
    )
    obs = run(tool, "def f():\n    return 1 / 0\nf()")
    assert not obs.ok and obs.error == "ZeroDivisionError: division by zero"
    assert obs.text.splitlines()[-1] == "ZeroDivisionError: division by zero"
    assert 'File "<cell 2>", line 2, in f' in obs.text and "main.py" not in obs.text
    obs = run(tool, "print('partial')\ndef broken(:")
    assert not obs.ok and obs.error.startswith("SyntaxError") and "partial" not in obs.text
    obs = run(tool, "import sys\nsys.stdout.close()\nsys.stdout = None")
    assert obs.ok
    assert run(tool, "print(y)").text == "5"
    assert not run(tool, "").ok and not tool.execute(ToolCall("python", {"cmd": "1"}, "")).ok


# ---------------------------------------------------------------- hostile code


def test_infinite_loop_times_out_and_restarts(make_tool, spawned):
    tool = make_tool([Image.new("RGB", (8, 8))], timeout_s=1.0)
    assert run(tool, "x = 1\nprint('before')").ok
    start = time.monotonic()
    obs = run(tool, "print('spinning', flush=True)\nwhile True:\n    pass")
    assert time.monotonic() - start < 3
    assert not obs.ok and "time limit" in obs.error and "state lost" in obs.error
    assert obs.text.startswith("spinning\nError: the code did not finish within the 1 s time limit")
    assert "All state was lost" in obs.text and "(image_1)" in obs.text
    assert spawned[0].poll() is not None and not os.path.exists(spawned[0].workdir)
    obs = run(tool, "print('x' in dir(), image_1.size)")
    assert obs.ok and obs.text == "False (8, 8)" and len(spawned) == 2


def test_ignoring_sigterm_does_not_help(make_tool):
    tool = make_tool(timeout_s=1.0)
    obs = run(tool, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)")
    assert not obs.ok and "time limit" in obs.error
    assert run(tool, "print(2)").text == "2"


def test_endless_printing_times_out(make_tool):
    tool = make_tool(timeout_s=1.0, max_output_chars=20)
    start = time.monotonic()
    obs = run(tool, "while True:\n    print('y' * 1000)")
    assert time.monotonic() - start < 3
    assert not obs.ok and "time limit" in obs.error and obs.text.startswith("y" * 20 + "\n[output truncated")


@needs_root
def test_fork_bomb_is_bounded_and_reaped(make_tool):
    tool = make_tool()
    obs = run(tool, "import os\nwhile True:\n    os.fork()")
    assert not obs.ok and ("BlockingIOError" in obs.error or "time limit" in obs.error), obs
    assert run(tool, "import subprocess\nprint(subprocess.run(['true']).returncode)").text == "0"
    assert _only_worker_left(tool)


def test_memory_and_file_size_limits_keep_the_state(make_tool):
    tool = make_tool()
    assert run(tool, "z = 'kept'").ok
    obs = run(tool, "x = bytearray(8 * 1024**3)")
    assert not obs.ok and obs.error.startswith("MemoryError")
    obs = run(
        tool, "with open('big.bin', 'wb') as f:\n    for _ in range(2048):\n        f.write(b'x' * 1024**2)"
    )
    assert not obs.ok and "File too large" in obs.error, obs
    assert run(tool, "import os\nprint(z, os.path.getsize('big.bin') <= 16 * 1024**2)").text == "kept True"


def test_printing_200mb_is_truncated(make_tool):
    tool = make_tool(max_output_chars=50)
    obs = run(tool, "import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 1024**2)\nprint('done')")
    assert (
        obs.ok
        and obs.text == "x" * 50 + f"\n[output truncated to 50 characters; {200 * 1024**2 + 5} bytes in all]"
    )
    assert run(tool, "print(1)").text == "1"


def test_secrets_of_the_trainer_are_not_visible(make_tool, monkeypatch):
    monkeypatch.setenv("SECRET_API_KEY", "hunter2-do-not-leak")
    tool = make_tool()
    code = (
        "import os\nleak = 'hunter2' in repr(dict(os.environ))\n"
        "try:\n    leak = leak or 'hunter2' in open(f'/proc/{os.getppid()}/environ').read()\n"
        "except OSError:\n    pass\nprint(leak)"
    )
    assert run(tool, code).text == "False"


def test_no_network_to_localhost(make_tool):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.setblocking(False)
    try:
        tool = make_tool()
        port = srv.getsockname()[1]
        obs = run(tool, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert not obs.ok and "Error" in obs.error
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()


@pytest.mark.skipif(not ROOT, reason="only a separate uid keeps the code from signalling the trainer")
def test_cannot_kill_the_trainer(make_tool):
    tool = make_tool()
    obs = run(tool, "import os\nos.kill(os.getppid(), 9)")
    assert not obs.ok and obs.error.startswith("PermissionError")
    assert run(tool, "print('still here')").text == "still here"


@needs_root
def test_detached_child_does_not_outlive_the_call(make_tool):
    tool = make_tool()
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('parent')"
    )
    obs = run(tool, code)
    assert obs.ok and obs.text == "parent"
    assert _only_worker_left(tool)


def test_segfault_and_exit_lose_the_state(make_tool):
    tool = make_tool()
    assert run(tool, "x = 1").ok
    obs = run(tool, "import ctypes\nctypes.string_at(0)")
    assert not obs.ok and "crashed (SIGSEGV)" in obs.error and "All state was lost" in obs.text
    assert run(tool, "print('x' in dir())").text == "False"
    obs = run(tool, "import os\nos._exit(3)")
    assert not obs.ok and "exited with status 3" in obs.error
    assert run(tool, "print(1)").ok


def test_code_tampering_with_the_protocol_is_contained(make_tool):
    tool = make_tool()
    obs = run(
        tool,
        "import os\nfor fd in range(3, 8):\n    try:\n        os.write(fd, b'\\xff' * 8)\n    except OSError:\n        pass",
    )
    assert not obs.ok and "corrupt reply" in obs.error
    obs = run(
        tool,
        "import os\nfor fd in range(3, 8):\n    try:\n        os.close(fd)\n    except OSError:\n        pass",
    )
    assert not obs.ok and "state lost" in obs.error
    obs = run(tool, "import os\nos.close(1)\nos.close(2)\nprint('lost')")
    assert run(tool, "print(4)").ok


# ---------------------------------------------------------------- threads, start-up, clean-up


def test_four_interpreters_in_four_threads(make_tool):
    tools = [make_tool([Image.new("RGB", (10 + i, 10))]) for i in range(4)]

    def work(i: int) -> tuple[str, str]:
        first = run(tools[i], f"import time\nx = {i}\ntime.sleep(0.2)\nprint(x * 10, image_1.width)").text
        return first, run(tools[i], "x + 100").text

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(4)))
    assert results == [(f"{i * 10} {10 + i}", str(i + 100)) for i in range(4)]
    assert threading.active_count() >= 1  # and the trainer is alive


def test_closing_a_tool_while_another_thread_waits_on_it_ends_that_call_and_reads_no_stranger(make_tool):
    """The agent loop stops waiting for a call past tool_timeout_s and closes its tool while the call's
    thread still reads the interpreter's pipes: that thread must end at once with the program, and the
    pipe numbers it holds, which files opened right after the close take, must not be read by it (a
    blocking stranger's pipe kept it, and pytest's exit, waiting forever)."""
    tool = make_tool(timeout_s=30.0)
    assert run(tool, "1").ok  # the interpreter is up
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(run, tool, "import time\ntime.sleep(60)")
        deadline = time.monotonic() + 10
        while not tool._interpreter._busy and time.monotonic() < deadline:  # the call is in its exchange
            time.sleep(0.01)
        time.sleep(0.2)
        began = time.perf_counter()
        tool.close()
        strangers = [os.pipe() for _ in range(8)]  # blocking pipes, on the lowest free numbers
        try:
            observation = call.result(timeout=15)
        finally:
            for r, w in strangers:
                os.close(r)
                os.close(w)
    assert time.perf_counter() - began < 15
    assert not observation.ok and "stopped before it ended" in observation.error
    assert tool._interpreter is None
    assert run(tool, "2 + 2").text == "4"  # the tool starts a fresh interpreter


def test_closing_a_tool_while_its_interpreter_starts_ends_the_call_and_the_new_interpreter(
    make_tool, monkeypatch
):
    tool = make_tool(timeout_s=30.0)
    starting, go = threading.Event(), threading.Event()
    real = python_tool.SandboxProcess  # the `spawned` fixture's spy: it checks the process is gone at the end

    def slow_start(*args, **kwargs):
        starting.set()
        go.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(python_tool, "SandboxProcess", slow_start)
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(run, tool, "print('ran')")
        assert starting.wait(10)
        tool.close()  # the agent loop gave up on the call while the sandbox was starting
        go.set()
        observation = call.result(timeout=30)
    assert not observation.ok and "stopped before it ended" in observation.error
    assert tool._interpreter is None


def test_startup_failure_names_the_problem(make_tool):
    tool = make_tool()
    tool.package_dirs = ()  # as if the sandbox's Python could not see the trainer's packages
    obs = run(tool, "print(1)")
    assert not obs.ok and "could not set up the interpreter: ModuleNotFoundError" in obs.error
    assert "from the trainer's environment []" in obs.error and "Fix:" in obs.error


def test_unreadable_package_directory_is_reported():
    base = tempfile.mkdtemp()  # under the world-searchable /tmp, unlike pytest's tmp_path
    try:
        os.chmod(base, 0o755)
        private = os.path.join(base, "private")
        os.makedirs(os.path.join(private, "site-packages"))
        os.chmod(private, 0o700)
        why = python_packages._not_world_readable(os.path.join(private, "site-packages"))
        assert why == f"{private} is not searchable by other users (mode drwx------)"
        os.chmod(private, 0o755)
        os.chmod(os.path.join(private, "site-packages"), 0o711)
        assert "is not readable by other users" in python_packages._not_world_readable(
            os.path.join(private, "site-packages")
        )
        assert python_packages._not_world_readable(base) is None
    finally:
        shutil.rmtree(base)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs as another uid only for root")
def test_an_unreadable_environment_is_replaced_by_a_readable_copy(make_tool, monkeypatch):
    """A venv under a 0700 folder (a checkout in `mktemp -d`): the sandbox imports a copy instead."""
    monkeypatch.setattr(python_packages, "_not_world_readable", lambda path: f"{path} is blocked (test)")
    python_packages._packages.cache_clear()
    try:
        tool = make_tool(timeout_s=20.0)  # importing matplotlib from the copy: seconds on a loaded machine
        (copy,) = tool.package_dirs
        assert os.path.basename(copy).startswith("rlstack-sandbox-packages-") and python_packages._trusted(
            Path(copy)
        )
        obs = run(tool, "import numpy, PIL, matplotlib.pyplot as plt\nprint(numpy.__file__, PIL.__file__)")
        assert obs.ok, obs.text
        assert all(path.startswith(copy) for path in obs.text.split())
        obs = run(tool, "plt.plot([1, 2]); plt.show()")
        assert obs.ok and len(obs.images) == 1
    finally:
        python_packages._packages.cache_clear()


@needs_root
def test_reset_and_close_end_the_interpreter(make_tool, spawned):
    tool = make_tool()
    assert run(
        tool, "a = 1\nfor d in ('/tmp', '/dev/shm'):\n    open(f'{d}/rlstack-tool-left-behind', 'w')"
    ).ok
    assert _files_owned_by({spawned[0].uid}) == []  # its own /tmp and /dev/shm: never on the machine
    tool.reset([], {})
    assert spawned[0].poll() is not None
    assert run(tool, "print('a' in dir())").text == "False"
    tool.close()
    tool.close()
    assert spawned[1].poll() is not None and not os.path.exists(spawned[1].workdir)


def test_scratch_files_are_private_to_each_interpreter(make_tool, spawned):
    a, b = make_tool(), make_tool()
    write = "for path in ('/tmp/rlstack-x', '/dev/shm/rlstack-y'):\n    open(path, 'w').write('from a')"
    assert run(a, write).ok
    assert (
        run(a, "open('/tmp/rlstack-x').read() + open('/dev/shm/rlstack-y').read()").text == "'from afrom a'"
    )
    seen = run(b, "import os\n[os.path.exists(p) for p in ('/tmp/rlstack-x', '/dev/shm/rlstack-y')]")
    assert seen.text == "[False, False]"
    assert not os.path.exists("/tmp/rlstack-x") and not os.path.exists("/dev/shm/rlstack-y")


def test_disk_budget_overrun_is_an_exception_that_keeps_the_state(make_tool):
    tool = make_tool(disk_mb=4)
    obs = run(tool, "kept = 1\nwith open('/dev/shm/big', 'wb') as f:\n    f.write(b'x' * (8 << 20))")
    assert not obs.ok and "OSError: [Errno 28] No space left on device" in obs.text
    assert "[disk budget of 4 MiB exceeded: the working directory, /tmp and /dev/shm share it" in obs.text
    assert run(tool, "import os\nos.remove('/dev/shm/big')\nprint(kept)").text == "1"
