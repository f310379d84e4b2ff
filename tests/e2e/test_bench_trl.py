"""bench/bench_trl.py runs its sides on the tiny model: rlstack's trainer and the raw-torch floor (TRL is in
the `bench` extra, not installed by `make test`), with LoRA and fixed-length responses, and writes the
comparison it reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.long
def test_rlstack_and_raw_torch_sides_do_the_same_fixed_length_work(tmp_path: Path):
    out = tmp_path / "bench.json"
    args = ["--sides", "rlstack,torch", "--prompts", "2", "--n", "2", "--max-response-length", "6"]
    args += ["--micro-batch", "2", "--warmup", "1", "--steps", "1", "--rounds", "1", "--threads", "1"]
    other = tmp_path / "other-checkout"  # another checkout: here this one's package under another root
    other.mkdir()
    (other / "rlstack").symlink_to(ROOT / "rlstack")
    args += ["--lora-rank", "4", "--fixed-length", "--output", str(out), "--before", str(other)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_trl.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rlstack, torch_ = result["results"]["rlstack"], result["results"]["torch"]
    # every response ran to the limit on both sides: rlstack's worker.rollout.ignore_eos, torch's min_new_tokens
    assert rlstack["response_length_mean"] == torch_["response_length_mean"] == 6
    assert rlstack["prompt_length_mean"] == torch_["prompt_length_mean"] > 0  # the same chat prompts
    assert rlstack["trajectories_per_step"] == torch_["trajectories_per_step"] == 4
    for side in (rlstack, torch_):
        assert side["timed_steps"] == 1 and side["step_s_median"] > 0 and side["peak_rss_gb"] > 0.1
    ratio = result["ratios"]["rlstack_step_over_torch_step"]
    assert ratio == pytest.approx(rlstack["step_s_median"] / torch_["step_s_median"], rel=0.01)
    assert "rlstack_over_trl_steps_per_s" not in result["ratios"]  # TRL did not run
    assert result["settings"]["lora_rank"] == 4 and result["settings"]["fixed_length"] is True
    assert "rlstack step / raw torch step (median)" in proc.stdout
    # the other checkout's side (here this one), and every phase of rlstack's step with what lies between them
    before = result["results"]["rlstack_before"]
    assert before["response_length_mean"] == 6 and result["before"]["root"] == str(other)
    assert before["runs"][0]["rlstack_path"] == str(other / "rlstack")  # the other checkout's package ran it
    assert rlstack["runs"][0]["rlstack_path"] == str(ROOT / "rlstack")
    assert result["ratios"]["rlstack_over_before_steps_per_s"] > 0
    phases = rlstack["phases_s"]
    assert {"generate", "reward", "advantages", "update", "sync", "between_phases", "outside_step"} <= set(
        phases
    )
    parts = sum(v for k, v in phases.items() if k not in ("in_loop_step", "between_phases", "outside_step"))
    assert parts + phases["between_phases"] == pytest.approx(
        phases["in_loop_step"], abs=1e-3
    )  # rounded to 4 places
