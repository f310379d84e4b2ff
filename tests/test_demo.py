"""`rlstack demo` in miniature: its options reach every run, and the warm-start cache is reused only
for the same resolved config (another seed or thread count gets its own warm start)."""

from __future__ import annotations

import json

import yaml

from rlstack.cli import main

# A few steps of each phase and a few held-out problems: the wiring, not the learning.
SMALL = [
    "--sft-override",
    "trainer.max_steps=2",
    "--grpo-override",
    "data.val_max_samples=16",
    "--grpo-override",
    "trainer.save_freq=-1",
    # Two warm-start steps teach nothing: no group has a right answer to keep.
    "--grpo-override",
    "algorithm.online_filtering=false",
    "--grpo-steps",
    "2",
]


def _demo(workdir, capsys, *args: str) -> str:
    assert main(["demo", "--workdir", str(workdir), *SMALL, *args]) == 0
    return capsys.readouterr().out


def test_demo_seed_threads_and_warm_start_cache(tmp_path, capsys):
    out = _demo(tmp_path, capsys, "--seed", "2", "--num-threads", "1")
    assert "supervised warm start: 2 steps" in out
    run = tmp_path / "demo" / "grpo_seed2_threads1"
    result = json.loads((run / "demo_result.json").read_text())
    assert result["seed"] == 2 and result["num_threads"] == 1 and result["held_out_problems"] == 16
    assert result["wall_time_s"] >= result["sft_time_s"] + result["grpo_time_s"]
    for name in ("sft_seed2_threads1", "grpo_seed2_threads1", "warm_start_eval_seed2_threads1"):
        cfg = yaml.safe_load((tmp_path / "demo" / name / "config.yaml").read_text())
        seeds = (cfg["trainer"]["seed"], cfg["data"]["seed"], cfg["worker"]["rollout"]["seed"])
        assert seeds == (2, 2, 2) and cfg["trainer"]["num_threads"] == 1, name

    out = _demo(tmp_path, capsys, "--seed", "2", "--num-threads", "1")
    assert "reusing the warm start" in out and "supervised warm start" not in out

    out = _demo(tmp_path, capsys, "--seed", "3", "--num-threads", "1")
    assert "supervised warm start: 2 steps" in out and (tmp_path / "demo" / "grpo_seed3_threads1").is_dir()

    # The same run directory with a changed recipe: the cached warm start is not reused.
    out = _demo(
        tmp_path, capsys, "--seed", "3", "--num-threads", "1", "--sft-override", "trainer.max_steps=3"
    )
    assert "supervised warm start: 3 steps" in out


def test_code_demo_end_to_end(tmp_path, capsys):
    """`rlstack demo --task code` in miniature: warm start, GRPO with the sandboxed unit-test reward,
    held-out pass@1 before/after and the share of each test status, all in demo_result.json."""
    small_batch = [
        "data.rollout_batch_size=4",
        "worker.rollout.n=2",
        "worker.actor.global_batch_size=4",
        "worker.actor.micro_batch_size_per_device_for_update=8",
    ]
    out = _demo(tmp_path, capsys, "--task", "code", *(a for o in small_batch for a in ("--grpo-override", o)))
    result = json.loads((tmp_path / "demo_code" / "grpo" / "demo_result.json").read_text())
    assert result["task"] == "code" and result["held_out_problems"] == 16
    for when in ("before", "after"):
        shares = result[f"test_status_{when}_grpo"]
        assert set(shares) <= {
            "passed",
            "wrong_answer",
            "runtime_error",
            "time_limit",
            "memory_limit",
            "no_code",
        }
        assert abs(sum(shares.values()) - 1.0) < 1e-9, shares
        assert result[f"accuracy_{when}_grpo"] == shares.get("passed", 0.0)
    assert "test statuses of the held-out answers" in out and "programming problems" in out
    cfg = yaml.safe_load((tmp_path / "demo_code" / "grpo" / "config.yaml").read_text())
    assert cfg["worker"]["reward"]["reward_function"] == "builtin:code"


def test_visual_demo_end_to_end(tmp_path, capsys):
    """`rlstack demo --task visual` in miniature: a warm start on tool-using trajectories, agentic
    GRPO with the sandboxed Python tool, the tool figures before/after, and example trajectories
    with their pictures saved for a person to read."""
    small_batch = [
        "data.rollout_batch_size=2",
        "worker.rollout.n=2",
        "worker.actor.global_batch_size=2",
        "worker.actor.micro_batch_size_per_device_for_update=4",
    ]
    out = _demo(
        tmp_path,
        capsys,
        "--task",
        "visual",
        "--sft-override",
        "trainer.max_steps=3",
        "--grpo-override",
        "data.val_max_samples=4",
        *(a for o in small_batch for a in ("--grpo-override", o)),
    )
    run = tmp_path / "demo_visual" / "grpo"
    result = json.loads((run / "demo_result.json").read_text())
    assert result["task"] == "visual" and result["held_out_problems"] == 4
    for when in ("before", "after"):
        assert 0.0 <= result[f"accuracy_{when}_grpo"] <= 1.0
        assert 0.0 <= result[f"tool_success_rate_{when}_grpo"] <= 1.0
        assert 1.0 <= result[f"turns_per_answer_{when}_grpo"] <= 3.0
        assert result[f"tool_calls_per_answer_{when}_grpo"] >= 0.0
    assert "tool calls per answer" in out and "turns per answer" in out and "examples/" in out
    examples = (run / "examples" / "README.md").read_text()
    assert examples.count("Where is the") == 4 and examples.count("warm start (score") == 4
    assert examples.count("after GRPO (score") == 4 and (run / "examples" / "0_1.png").is_file()
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["worker"]["rollout"]["agent"]["tools"][0]["name"] == "python"
