"""`rlstack sft` as a trainer like GRPO's: a run directory of its own, metrics.jsonl, validation (the loss
and the rewards), checkpoints it resumes from, LoRA, several ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from rlstack.cli import main
from rlstack.config import load_config
from rlstack.data.dataset import prompt_sets, sft_batch
from rlstack.models.loading import load_causal_lm, load_tokenizer
from rlstack.sft import SFTTrainer, run_sft, sft_run_config

DETERMINISTIC = ("timestamp", "timing_s/", "perf/throughput", "perf/time_per_step")


def _args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"worker.actor.model.model_path={model}",
        f"trainer.output_dir={out}",
        "trainer.project_name=p",
        "trainer.experiment_name=warm",
        "data.train_files=builtin:addition@train",
        "data.val_files=builtin:addition@test",
        "data.val_max_samples=8",
        "data.rollout_batch_size=8",
        "worker.actor.global_batch_size=8",
        "data.max_response_length=6",
        "worker.actor.micro_batch_size_per_device_for_update=4",
        "worker.actor.optim.lr=1e-3",
        "trainer.logger=[file]",
        "trainer.num_threads=1",
        *extra,
    ]


def _rows(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def _same(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(DETERMINISTIC)}


def test_sft_writes_a_run_directory_validates_and_checkpoints(tiny_model_dir: Path, tmp_path: Path):
    cfg = load_config(_args(tiny_model_dir, tmp_path, "trainer.max_steps=4", "trainer.save_freq=2"))
    out = run_sft(cfg)
    run = sft_run_config(cfg).run_dir
    assert run.name == "warm_sft"
    assert out == run / "huggingface" and (out / "config.json").is_file()
    rows = _rows(run)
    assert sorted(rows) == [0, 1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        assert rows[step]["sft/loss"] > 0 and "actor/lr" in rows[step] and "actor/grad_norm" in rows[step]
    assert rows[4]["sft/loss"] < rows[1]["sft/loss"]  # it learns
    for step in (0, 4):  # before training and at the end: the loss and GRPO's generated-and-scored metrics
        assert {"val/sft_loss", "val/addition/accuracy", "val/reward_score"} <= rows[step].keys()
    assert rows[4]["val/sft_loss"] < rows[0]["val/sft_loss"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["global_step_2", "global_step_4"]
    assert (run / "config.yaml").is_file() and list((run / "generations").iterdir())


def test_sft_keeps_its_best_checkpoint_by_the_validation_loss(tiny_model_dir: Path, tmp_path: Path):
    extra = ["trainer.max_steps=3", "trainer.save_freq=1", "trainer.val_freq=1", "trainer.save_limit=1"]
    extra += ["trainer.save_best_metric=val/sft_loss", "trainer.save_best_mode=min"]
    cfg = load_config(_args(tiny_model_dir, tmp_path, *extra))
    run_sft(cfg)
    run = sft_run_config(cfg).run_dir
    rows = _rows(run)
    best = min((1, 2, 3), key=lambda s: (rows[s]["val/sft_loss"], -s))
    kept = sorted(int(p.name.split("_")[-1]) for p in (run / "checkpoints").iterdir())
    assert kept == sorted({best, 3})
    for step in kept:
        saved = json.loads((run / "checkpoints" / f"global_step_{step}" / "metrics.json").read_text())
        assert saved["val/sft_loss"] == rows[step]["val/sft_loss"]


def test_the_validation_loss_is_the_answer_tokens_mean_nll(tiny_model_dir: Path, tmp_path: Path):
    cfg = load_config(_args(tiny_model_dir, tmp_path, "trainer.val_only=true"))
    SFTTrainer(cfg).fit()
    got = _rows(sft_run_config(cfg).run_dir)[0]["val/sft_loss"]
    tok, model = load_tokenizer(str(tiny_model_dir)), load_causal_lm(str(tiny_model_dir)).eval()
    _, val = prompt_sets(cfg.data, tok)
    assert val is not None
    batch = sft_batch(val, list(range(len(val))), tok)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    answer = batch["response_mask"][:, 1:].float()  # token t+1 is predicted at position t
    want = float(-(logp * answer).sum() / answer.sum())
    assert got == pytest.approx(want, rel=1e-5)


def test_sft_of_a_grpo_recipe_never_writes_into_its_run(tiny_model_dir: Path, tmp_path: Path, capsys):
    grpo_run = tmp_path / "p" / "warm"
    grpo_run.mkdir(parents=True)
    (grpo_run / "config.yaml").write_text("the GRPO run's\n")
    assert main(["sft", *_args(tiny_model_dir, tmp_path, "trainer.max_steps=1", "data.val_files=")]) == 0
    assert (grpo_run / "config.yaml").read_text() == "the GRPO run's\n"
    assert not (grpo_run / "huggingface").exists()
    own = tmp_path / "p" / "warm_sft"
    assert yaml.safe_load((own / "config.yaml").read_text())["trainer"]["experiment_name"] == "warm_sft"
    assert f"model written to {own / 'huggingface'}" in capsys.readouterr().out


def test_a_resumed_sft_run_matches_an_uninterrupted_one(tiny_model_dir: Path, tmp_path: Path):
    common = ("data.val_files=", "trainer.save_freq=2")
    straight = load_config(_args(tiny_model_dir, tmp_path / "a", "trainer.max_steps=4", *common))
    run_sft(straight)
    first = load_config(_args(tiny_model_dir, tmp_path / "b", "trainer.max_steps=2", *common))
    run_sft(first)
    resumed = SFTTrainer(load_config(_args(tiny_model_dir, tmp_path / "b", "trainer.max_steps=4", *common)))
    resumed.fit()
    a, b = _rows(sft_run_config(straight).run_dir), _rows(sft_run_config(first).run_dir)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        assert _same(a[step]) == _same(b[step]), step
    history = (sft_run_config(first).run_dir / "config_history.jsonl").read_text().splitlines()
    assert json.loads(history[0])["changes"] == {"trainer.max_steps": [2, 4]}


def test_sft_with_lora_writes_the_merged_model(tiny_model_dir: Path, tmp_path: Path):
    args = _args(tiny_model_dir, tmp_path, "trainer.max_steps=2", "data.val_files=")
    cfg = load_config([*args, "worker.actor.model.lora.rank=4", "worker.actor.model.lora.alpha=8"])
    out = run_sft(cfg)
    merged, base = load_causal_lm(str(out)), load_causal_lm(str(tiny_model_dir))
    assert not (out / "adapter_config.json").exists()
    moved = [n for n, p in merged.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert moved and all("proj" in n for n in moved)  # the adapted projections, merged in


@pytest.mark.long
def test_two_ray_ranks_train_as_one_process(tiny_model_dir: Path, tmp_path: Path):
    ray = pytest.importorskip("ray")
    args = ("trainer.max_steps=2", "data.val_files=")
    local = load_config(_args(tiny_model_dir, tmp_path / "local", *args))
    run_sft(local)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ranks = load_config(
            _args(tiny_model_dir, tmp_path / "ray", *args, "trainer.backend=ray", "trainer.n_gpus_per_node=2")
        )
        run_sft(ranks)
    finally:
        ray.shutdown()
    want, got = _rows(sft_run_config(local).run_dir), _rows(sft_run_config(ranks).run_dir)
    for step in (1, 2):  # each rank takes half the rows; the loss is normalised by the whole mini-batch
        for key in ("sft/loss", "actor/grad_norm"):
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-4), (step, key)
