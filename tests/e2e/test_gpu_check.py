"""bench/gpu_check.py: its checks' dry run on this CPU, in a Python that holds only what the lent GPU machine
is promised (torch, transformers, peft, accelerate and what they require) and the bundle's packages; and
the bundle itself (wheels from the package index: skipped where the index cannot be reached)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_check  # noqa: E402

ON_THE_GPU_MACHINE = ("torch", "transformers", "peft", "accelerate")


def requirement_closure(names: tuple[str, ...]) -> set[str]:
    """`names` and every distribution they require (installed here, markers evaluated without extras)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:  # an optional platform's requirement, not installed here
            continue
        seen.add(name)
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def site_of(names: set[str], folder: Path) -> Path:
    """A folder of links to the installed files (packages, modules, metadata) of the distributions `names`
    only: on the path of a Python started without its site-packages (`-S`), it is a bare machine's."""
    folder.mkdir()
    for name in names:
        dist = distribution(name)
        for top in {f.parts[0] for f in dist.files or []}:
            src = Path(dist.locate_file(top))
            if top != ".." and not top.endswith(".pth") and src.exists() and not (folder / top).exists():
                (folder / top).symlink_to(src)
    return folder


@pytest.mark.timeout(180)
def test_cpu_dry_run_passes_every_check_with_only_the_gpu_machines_packages_and_the_bundles(tmp_path: Path):
    present = requirement_closure(ON_THE_GPU_MACHINE) | requirement_closure(gpu_check.EXTRAS)
    site = site_of(present - {"rlstack"}, tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "PYTHONNOUSERSITE": "1"}
    out = tmp_path / "checks.json"
    run = subprocess.run(
        [sys.executable, "-S", str(SCRIPT), "run", "--cpu", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith(("PASS ", "FAIL "))]
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    names = [name for name, _ in gpu_check.CHECKS]
    assert [line.split()[1].rstrip(":") for line in lines] == names
    assert all(line.startswith("PASS ") for line in lines), "\n".join(lines)

    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and list(report["checks"]) == names
    assert report["versions"]["omegaconf"] != "missing" and report["versions"]["pillow"] != "missing"
    for line, (name, result) in zip(lines, report["checks"].items()):
        assert result["passed"] and line == f"PASS {name}: {result['figure']}"
        numbers = [v for v in result["values"].values() if isinstance(v, (int, float))]
        assert numbers and all(math.isfinite(v) for v in numbers), (name, result["values"])
    for name in ("grpo_smollm2_135m", "grpo_qwen2.5_1.5b"):
        assert report["checks"][name]["values"]["steps_per_s"] > 0

    offload = report["checks"]["offload_one_process"]["values"]
    assert (
        offload["grad_norm"][0] == pytest.approx(offload["grad_norm"][1], rel=1e-4)
        and offload["grad_norm"][0] > 0
    )


def test_only_runs_the_named_checks_and_refuses_an_unknown_name(capsys):
    assert gpu_check.main(["run", "--cpu", "--only", "padding_free,no_such_check"]) == 2
    assert "no check named ['no_such_check']" in capsys.readouterr().err
    assert gpu_check.main(["run", "--cpu", "--only", "padding_free"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("PASS ", "FAIL "))]
    assert [line.split()[1] for line in lines] == ["padding_free:"]


def _index_reachable(folder: Path) -> bool:
    """Whether pip reaches its package index for the bundle's downloads (one try, a short timeout)."""
    try:
        gpu_check.download_extras(folder, "--retries", "0", "--timeout", "10")
    except subprocess.CalledProcessError:
        return False
    return True


@pytest.mark.timeout(180)
def test_bundle_holds_installable_wheels_of_rlstack_and_its_extras_under_64_mib(tmp_path: Path):
    if not _index_reachable(tmp_path / "probe"):
        pytest.skip("pip cannot reach its package index: the bundle downloads wheels from it")
    bundle = tmp_path / "bundle"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "bundle", str(bundle)], capture_output=True, text=True, timeout=150
    )
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    files = {p.name: p.stat().st_size for p in bundle.iterdir()}
    assert {"run.sh", "gpu_check.py"} <= set(files)
    wheels = sorted(name.split("-")[0].lower() for name in files if name.endswith(".whl"))
    assert wheels == sorted(["rlstack", *gpu_check.EXTRAS])
    total = sum(files.values())
    assert total <= gpu_check.BUNDLE_LIMIT
    assert f"{total / 2**20:8.2f} MiB  total" in run.stdout
    for name, size in files.items():
        assert f"{size / 2**20:8.2f} MiB  {name}" in run.stdout

    # what run.sh installs, resolved from the bundle alone for the GPU machine's Python
    platforms = [arg for p in gpu_check.TARGET_PLATFORMS for arg in ("--platform", p)]
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--no-deps",
            "--find-links",
            str(bundle),
        ]
        + ["--only-binary=:all:", "--python-version", gpu_check.TARGET_PYTHON, *platforms]
        + ["--target", str(tmp_path / "target"), "rlstack", *gpu_check.EXTRAS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    would = install.stdout.strip().splitlines()[-1]
    assert would.startswith("Would install") and "rlstack-0.1.0" in would
    assert all(f"{name}-" in would for name in gpu_check.EXTRAS)
