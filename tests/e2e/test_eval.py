"""`rlstack eval`: a model or checkpoint on fixed datasets with the run's rewards; greedy accuracy and
pass@k, checked by hand from the trajectories it writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlstack.cli import main

# Solved when the response has an even number of characters: the tiny random model's sampled responses
# differ in length, so some prompts are solved by some of their samples and not others.
REWARD = """
REWARD_TYPE = "batch"

def compute_score(reward_inputs):
    return [{"overall": float(len(x["response"]) % 2 == 0), "accuracy": float(len(x["response"]) % 2 == 0)}
            for x in reward_inputs]
"""


def _data(tmp_path: Path, name: str, source: str, problems: list[tuple[str, str]]) -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text(
        "".join(json.dumps({"problem": q, "answer": a, "data_source": source}) + "\n" for q, a in problems)
    )
    return str(path)


def _args(model: Path, tmp_path: Path, *extra: str) -> list[str]:
    reward = tmp_path / "parity.py"
    reward.write_text(REWARD)
    return [
        f"worker.actor.model.model_path={model}",
        f"trainer.output_dir={tmp_path / 'out'}",
        "trainer.experiment_name=run",
        f"worker.reward.reward_function={reward}:compute_score",
        "data.max_response_length=6",
        "trainer.logger=[file]",
        "trainer.num_threads=1",
        *extra,
    ]


def _pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k)


def test_eval_writes_greedy_accuracy_and_pass_at_k_as_computed_by_hand(
    tiny_model_dir: Path, tmp_path: Path, capsys
):
    a = _data(tmp_path, "a", "sums", [("1+2", "3"), ("2+2", "4"), ("5+3", "8")])
    b = _data(tmp_path, "b", "more", [("9+9", "18"), ("7+1", "8")])
    rc = main(
        ["eval", *_args(tiny_model_dir, tmp_path), "--data", a, "--data", b, "--n", "6", "--k", "1", "2", "5"]
    )
    assert rc == 0
    run = tmp_path / "out" / "rlstack" / "run_eval"
    result = json.loads((run / "eval.json").read_text())
    assert list(result["datasets"]) == [a, b]
    rows = [json.loads(line) for line in (run / "generations" / "val_step_0.jsonl").read_text().splitlines()]
    assert [r["eval"] for r in rows].count("greedy") == 5 and [r["eval"] for r in rows].count("sampled") == 30
    mixed = 0
    for spec, source in ((a, "sums"), (b, "more")):
        entry = result["datasets"][spec]
        greedy = [r for r in rows if r["eval"] == "greedy" and r["data_source"] == source]
        assert entry["greedy"][f"{source}/accuracy"] == pytest.approx(
            sum(len(r["response"]) % 2 == 0 for r in greedy) / len(greedy)
        )
        by_prompt: dict[str, list[bool]] = {}
        for r in rows:
            if r["eval"] == "sampled" and r["data_source"] == source:
                by_prompt.setdefault(r["uid"], []).append(len(r["response"]) % 2 == 0)
        assert all(len(v) == 6 for v in by_prompt.values())
        mixed += sum(0 < sum(v) < 6 for v in by_prompt.values())
        for k in (1, 2, 5):
            want = sum(_pass_at_k(6, sum(v), k) for v in by_prompt.values()) / len(by_prompt)
            assert entry["sampled"][f"{source}/pass@{k}"] == pytest.approx(want), (source, k)
        assert f"{source}/pass@4" not in entry["sampled"]
    assert mixed > 0  # the estimator was tested on prompts neither always nor never solved
    out = capsys.readouterr().out
    assert f"{a}  [sums, 3 prompts]  greedy " in out and "pass@5" in out
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["step"] == 0 and "eval/sampled/sums/pass@2" in metrics


def test_eval_of_a_checkpoint_evaluates_its_weights(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    data = _data(tmp_path, "a", "sums", [("1+2", "3"), ("2+2", "4"), ("5+3", "8"), ("4+4", "8")])
    train = load_config(
        _args(
            tiny_model_dir,
            tmp_path,
            "trainer.max_steps=1",
            "data.rollout_batch_size=4",
            "worker.actor.global_batch_size=4",
            "worker.rollout.n=4",
            "worker.actor.optim.lr=5e-2",
            "data.val_files=",
        )
    )
    Trainer(train).fit()
    ckpt = train.run_dir / "checkpoints" / "global_step_1"
    assert main(["eval", *_args(tiny_model_dir, tmp_path), "--data", data, "--checkpoint", str(ckpt)]) == 0
    from_ckpt = (tmp_path / "out" / "rlstack" / "run_eval" / "generations" / "val_step_0.jsonl").read_text()
    # the same weights given as a model directory generate the same greedy responses
    args = _args(tiny_model_dir, tmp_path, f"worker.actor.model.model_path={ckpt / 'model'}")
    assert main(["eval", *args, "trainer.experiment_name=direct", "--data", data]) == 0
    direct = (tmp_path / "out" / "rlstack" / "direct_eval" / "generations" / "val_step_0.jsonl").read_text()
    assert (
        main(["eval", *_args(tiny_model_dir, tmp_path), "trainer.experiment_name=base", "--data", data]) == 0
    )
    base = (tmp_path / "out" / "rlstack" / "base_eval" / "generations" / "val_step_0.jsonl").read_text()
    responses = [[json.loads(x)["response"] for x in t.splitlines()] for t in (from_ckpt, direct, base)]
    assert responses[0] == responses[1] != responses[2]  # the checkpoint's weights, not the base model's
    assert json.loads((tmp_path / "out" / "rlstack" / "run_eval" / "eval.json").read_text())[
        "checkpoint"
    ] == str(ckpt)

    # another evaluation in the same run directory replaces this one whole, and says so
    assert main(["eval", *_args(tiny_model_dir, tmp_path), "--data", data]) == 0
    run_eval = tmp_path / "out" / "rlstack" / "run_eval"
    assert json.loads((run_eval / "eval.json").read_text())["checkpoint"] is None
    assert len((run_eval / "metrics.jsonl").read_text().splitlines()) == 1
    assert (run_eval / "generations" / "val_step_0.jsonl").read_text() == base


def test_eval_options_are_checked_before_anything_loads(tiny_model_dir: Path, tmp_path: Path, capsys):
    assert main(["eval", *_args(tiny_model_dir, tmp_path), "--n", "2", "--k", "4"]) == 2
    err = capsys.readouterr().err
    assert "--k [4]" in err and "between 1 and --n (2)" in err
    assert main(["eval", *_args(tiny_model_dir, tmp_path), "--checkpoint", str(tmp_path)]) == 2
    assert "not an rlstack checkpoint" in capsys.readouterr().err
    assert main(["eval", *_args(tiny_model_dir, tmp_path), "--data", ""]) == 2
    assert "--data '': an empty dataset spec" in capsys.readouterr().err
    # key=value overrides after the options are overrides too
    assert (
        main(
            ["eval", "--n", "2", *_args(tiny_model_dir, tmp_path), "--print-config", "data.val_max_samples=3"]
        )
        == 0
    )
    assert "val_max_samples: 3" in capsys.readouterr().out
