"""Shared fixtures: a session-wide cache directory and one tiny model built offline."""

from __future__ import annotations

import faulthandler
import os
import shutil
import sys
import tempfile

# Nothing in the tests may reach a model or dataset hub; fail fast instead of waiting on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from rlstack.models.loading import load_causal_lm, load_tokenizer  # noqa: E402

KINDS = ("unit", "integration", "e2e")


WORKER = os.environ.get("PYTEST_XDIST_WORKER")
"""The pytest-xdist worker this process is (`make test` runs two), or None in a plain `pytest`."""
if not WORKER:
    # The folder of the workers' temp folders, made by the controller before it starts them (they inherit
    # the variable) and removed by it after they have exited: a worker's own exit (multiprocessing's
    # finalizers removing their `pymp-*` folders) must still find its temp folder there.
    # A short path: Ray's socket paths under it have to fit in 107 characters.
    os.environ["RLSTACK_TEST_WORKERS_TMP"] = tempfile.mkdtemp(prefix="rlt-")
    Path(os.environ["RLSTACK_TEST_WORKERS_TMP"]).chmod(0o755)
else:
    # One torch thread a worker (and in the processes its tests start), not two threads each contending
    # for one of the two cores; a run's `trainer.num_threads` still sets its own.
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    # A temp folder of its own, /tmp's mode, for temp files and Ray's sessions: a worker's `ray.init()`
    # starts or joins that worker's own cluster, never one the other worker's test started. (The sandbox
    # makes its run roots in /tmp itself, shared: tests/integration/test_sandbox.py allows for it.)
    if "RLSTACK_TEST_WORKERS_TMP" not in os.environ:  # a controller that did not load this conftest
        os.environ["RLSTACK_TEST_WORKERS_TMP"] = tempfile.mkdtemp(prefix=f"rlt-{WORKER}-")
    WORKER_TMP = Path(os.environ["RLSTACK_TEST_WORKERS_TMP"]) / WORKER
    WORKER_TMP.mkdir(mode=0o1777, exist_ok=True)
    WORKER_TMP.chmod(0o1777)  # mkdir's mode is masked by the umask
    os.environ["TMPDIR"] = os.environ["RAY_TMPDIR"] = str(WORKER_TMP)
    tempfile.tempdir = None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test is marked with its folder's kind (`pytest -m unit`, `-m "not e2e"`)."""
    for item in items:
        kind = Path(str(item.fspath)).parent.name
        if kind in KINDS:
            item.add_marker(getattr(pytest.mark, kind))


PACKAGE = Path(__file__).resolve().parents[1] / "rlstack"
PLUMBING = {
    PACKAGE / f for f in ("batch.py", "workers/group.py", "workers/ray_group.py", "workers/training.py")
}
"""Modules that move the columns they are given (split, gather, micro-batch) without naming them: a column
set there belongs to the code that called them."""
COLUMNS_SET: dict[str, str] = {}
"""Every column rlstack's own code set on a Batch during the session, with the first test that did."""


def _setter_in_package() -> str | None:
    """The rlstack file whose code sets a column (the first frame outside `PLUMBING`), or None."""
    frame = sys._getframe(2)
    while frame is not None and Path(frame.f_code.co_filename) in PLUMBING:
        frame = frame.f_back
    if frame is None or PACKAGE not in Path(frame.f_code.co_filename).parents:
        return None
    return str(Path(frame.f_code.co_filename).relative_to(PACKAGE.parent))


@pytest.fixture(scope="session", autouse=True)
def record_batch_columns():
    """Record the column names rlstack's code sets (tests' own batches are theirs to name)."""
    from rlstack.batch import Batch

    real = Batch.__setitem__

    def recording(self, name, col):
        if name not in COLUMNS_SET and (where := _setter_in_package()):
            COLUMNS_SET[name] = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0] + f", {where}"
        return real(self, name, col)

    Batch.__setitem__ = recording
    yield
    Batch.__setitem__ = real


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """Under pytest-xdist (`make test` runs two workers), each worker's columns join the controller's."""
    for name, test in getattr(node, "workeroutput", {}).get("batch_columns_set", {}).items():
        COLUMNS_SET.setdefault(name, test)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The session fails when rlstack's code set a column that `rlstack.batch.COLUMNS` does not declare
    (in a pytest-xdist worker: the columns go to the controller, which decides)."""
    from rlstack.batch import COLUMNS

    if WORKER:
        session.config.workeroutput["batch_columns_set"] = dict(COLUMNS_SET)
        return
    undeclared = {name: test for name, test in COLUMNS_SET.items() if name not in COLUMNS}
    if undeclared:
        lines = "".join(f"\n  {name!r} (first set in {test})" for name, test in sorted(undeclared.items()))
        print(
            f"\nrlstack set Batch columns that rlstack.batch.COLUMNS does not declare:{lines}",
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


EXIT_WATCHDOG_S = 120


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After the last test, the process has EXIT_WATCHDOG_S to exit: Python joins every thread a thread
    pool still runs, and one the code under test left blocked would hold the run (and CI) for ever; past
    it, every thread's stack goes to stderr and the run ends with status 1. Not in a pytest-xdist worker: its
    process waits for the controller, which ends it (after pytest-xdist's own timeout, without stacks) once
    every worker is done; a plain `pytest` run keeps the watchdog for the code under test."""
    if WORKER:
        return
    shutil.rmtree(os.environ["RLSTACK_TEST_WORKERS_TMP"], ignore_errors=True)
    faulthandler.dump_traceback_later(EXIT_WATCHDOG_S, exit=True, file=sys.__stderr__)


EOS_BIAS = 3.0  # P(EOS) ~ e^3 / (e^3 + 100) ~ 0.17 per step for the near-uniform random model


@pytest.fixture(scope="session", autouse=True)
def rlstack_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RLSTACK_CACHE points into a temporary folder for the whole session (nothing goes to ~/.cache). The
    pytest-xdist workers of one run share it (its models are written atomically, the warm start under a
    lock), so that the built-in warm-start model is trained once a run, not once a worker."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if WORKER else base) / "rlstack_cache"  # xdist: <run's temp>/popen-gwN
    cache.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLSTACK_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model and its character-level tokenizer, built once per session."""
    from rlstack.models.loading import write_model_dir

    return write_model_dir(
        tmp_path_factory.mktemp("models") / "tiny",
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
    )


@pytest.fixture(scope="session")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="session")
def model(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir))


@pytest.fixture(scope="session")
def eos_model(tiny_model_dir, tok):
    """The tiny model with a bias towards EOS, so that sampled responses end at different lengths."""
    m = load_causal_lm(str(tiny_model_dir)).eval()
    head = torch.nn.Linear(m.config.hidden_size, m.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(m.lm_head.weight)
        head.bias.zero_()
        head.bias[tok.eos_token_id] = EOS_BIAS
    m.lm_head = head
    return m


@pytest.fixture(scope="session")
def tool_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2.5-VL warm-started to answer with a Python cell that crops the image."""
    from visual_agent import build_tool_vlm

    return build_tool_vlm(tmp_path_factory.mktemp("tool_vlm"), "builtin:tiny-qwen2.5-vl")


@pytest.fixture(scope="session")
def agent_run(tool_vlm: Path, tmp_path_factory: pytest.TempPathFactory):
    """(config, seconds) of a finished 2-step agentic GRPO run of `tool_vlm` on the visual task, with the
    Python tool: its run directory holds metrics, generations with turns, and the images."""
    import time

    from digits_run import AGENT_RUN

    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    start = time.perf_counter()
    cfg = load_config(
        [
            f"worker.actor.model.model_path={tool_vlm}",
            f"trainer.output_dir={tmp_path_factory.mktemp('agent_run')}",
        ]
        + [
            *AGENT_RUN,
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "trainer.train_generations_to_log=8",
        ]
    )
    Trainer(cfg).fit()
    return cfg, time.perf_counter() - start
