"""Clean stops: SIGINT and SIGTERM finish the step in progress, save a checkpoint, say in one line where
the run is and how to resume, and exit with 128 + the signal; a second signal stops at once. No traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_runs import _metrics, _overrides

MARKED_REWARD = """
import pathlib, time
REWARD_TYPE = "batch"

def compute_score(reward_inputs):
    pathlib.Path(__file__).with_suffix(".called").touch()  # the step is under way
    time.sleep(1.0)
    return [{"overall": float(x["response"].strip() == str(x["ground_truth"]))} for x in reward_inputs]
"""


def _start(model: Path, out: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    reward = out / "marked.py"
    out.mkdir(parents=True, exist_ok=True)
    reward.write_text(MARKED_REWARD)
    cmd = [
        sys.executable,
        "-m",
        "rlstack",
        "train",
        *_overrides(model, out, "trainer.max_steps=3", "trainer.val_before_train=false", "data.val_files="),
        f"worker.reward.reward_function={reward}:compute_score",
        *extra,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = reward.with_suffix(".called")
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.05)
    return proc, out / "rlstack" / "default"


@pytest.mark.slow
def test_ctrl_c_finishes_the_step_saves_and_the_same_command_resumes(tiny_model_dir: Path, tmp_path: Path):
    proc, run_dir = _start(tiny_model_dir, tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in out + err
    assert "rlstack: stopped by SIGINT after step 1 of 3; checkpoint " in err
    assert "the same command resumes from it" in err
    assert sorted(_metrics(run_dir)) == [1]
    # the run said where it writes before it trained, and showed progress with no console logger
    assert out.splitlines()[0] == f"[rlstack] run directory: {run_dir}  (watch it: rlstack board {run_dir})"
    assert "[rlstack] step 1/3" in err
    assert (run_dir / "checkpoints" / "global_step_1" / "trainer_state.pt").is_file()
    assert not (run_dir / "huggingface").exists()  # the final model is the finished run's

    again = subprocess.run(proc.args, capture_output=True, text=True, env={**os.environ}, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stdout and "global_step_1" in again.stdout
    assert sorted(_metrics(run_dir)) == [1, 2, 3]


@pytest.mark.slow
def test_sigterm_without_saving_says_so(tiny_model_dir: Path, tmp_path: Path):
    proc, run_dir = _start(tiny_model_dir, tmp_path, "trainer.save_on_interrupt=false")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in out + err
    assert "stopped by SIGTERM after step 1 of 3; nothing saved (trainer.save_on_interrupt=false)" in err
    assert not (run_dir / "checkpoints").exists()


@pytest.mark.slow
def test_a_second_signal_stops_at_once_without_a_traceback(tiny_model_dir: Path, tmp_path: Path):
    proc, run_dir = _start(tiny_model_dir, tmp_path)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)  # inside the same step: the reward sleeps for a second
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in out + err
    assert "stopped at once by SIGINT" in err
    assert not (run_dir / "checkpoints").exists()
