"""End-to-end runs of the whole loop on the tiny model: metrics, run directory, resume, divergence."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from digits_run import digits_run

from rlstack.algos.advantages import AdvEstimator
from rlstack.config import load_config
from rlstack.trainer import Trainer

REQUIRED_METRICS = [
    "critic/score/mean",
    "critic/advantages/mean",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "response_length/mean",
    "response_length/clip_ratio",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/step",
    "perf/throughput",
    "perf/max_rss_gb",
    "reward/overall",
    "reward/accuracy",
]
NON_DETERMINISTIC = ("timing_s/", "perf/throughput", "perf/time_per_step", "perf/max_")


def _overrides(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"worker.actor.model.model_path={model}",
        f"trainer.output_dir={out}",
        "data.rollout_batch_size=4",
        "worker.actor.global_batch_size=4",
        "worker.rollout.n=4",
        "worker.actor.micro_batch_size_per_device_for_update=8",
        "data.max_response_length=6",
        "data.val_max_samples=16",
        "worker.actor.optim.lr=1e-3",
        "trainer.logger=[file,tensorboard]",
        "trainer.num_threads=1",
        *extra,
    ]


def _metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(NON_DETERMINISTIC)}


@pytest.mark.slow
def test_three_step_run_writes_the_whole_run_directory(tiny_model_dir: Path, tmp_path: Path):
    start = time.perf_counter()
    cfg = load_config(_overrides(tiny_model_dir, tmp_path, "trainer.max_steps=3", "trainer.val_freq=2"))
    last = Trainer(cfg).fit()
    assert time.perf_counter() - start < 60

    run = cfg.run_dir
    metrics = _metrics(run)
    assert sorted(metrics) == [0, 1, 2, 3]  # validation before training, then three steps
    for name in REQUIRED_METRICS:
        assert name in metrics[3], name
    assert "val/addition/accuracy" in metrics[0] and "val/reward_score" in metrics[0]
    # the exact-match reward's one component, averaged as the score is (no penalties here)
    assert metrics[0]["val/reward/overall"] == pytest.approx(metrics[0]["val/reward_score"])
    assert "val/addition/accuracy" in metrics[2] and "val/addition/accuracy" not in metrics[1]
    assert last["actor/lr"] == pytest.approx(1e-3)
    assert 0 < metrics[3]["response_length/mean"] <= 6

    glossary = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    logged = {k for row in metrics.values() for k in row if k != "step"}
    for name in logged:
        generic = name.replace("reward/accuracy", "reward/<key>").replace("reward/overall", "reward/<key>")
        generic = generic.replace("val/addition/", "val/<data_source>/")
        assert f"`{generic}`" in glossary, f"{name} is logged but not described in docs/metrics.md"

    assert (run / "config.yaml").read_text().count("rollout_batch_size: 4") == 1
    gens = [
        json.loads(line) for line in (run / "generations" / "train_step_1.jsonl").read_text().splitlines()
    ]
    assert {"prompt", "response", "ground_truth", "score"} <= set(gens[0])
    assert any(f.name.startswith("events.out.tfevents") for f in (run / "tensorboard").iterdir())
    assert (run / "checkpoints" / "global_step_3" / "trainer_state.pt").is_file()

    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(run / "huggingface")
    ckpt = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "global_step_3" / "model")
    for (name, a), (_, b) in zip(final.state_dict().items(), ckpt.state_dict().items()):
        assert torch.equal(a, b), name
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(base.model.embed_tokens.weight, final.model.embed_tokens.weight)


def _train_cmd(model: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlstack", "train", *_overrides(model, out, *extra)]


SLOW_REWARD = """
import time
REWARD_TYPE = "batch"

def compute_score(reward_inputs):
    time.sleep(0.4)
    return [{"overall": float(x["response"].strip() == str(x["ground_truth"])), "len": len(x["response"])}
            for x in reward_inputs]
"""


@pytest.mark.slow
def test_kill_and_resume_matches_an_uninterrupted_run(tiny_model_dir: Path, tmp_path: Path):
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    common = (
        "trainer.max_steps=5",
        "trainer.save_freq=2",
        "trainer.save_limit=-1",
        "trainer.val_before_train=false",
        "data.val_files=",
        f"worker.reward.reward_function={reward}:compute_score",
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    straight = tmp_path / "straight"
    subprocess.run(_train_cmd(tiny_model_dir, straight, *common), check=True, env=env, capture_output=True)

    resumed = tmp_path / "resumed"
    run_dir = resumed / "rlstack" / "default"
    proc = subprocess.Popen(
        _train_cmd(tiny_model_dir, resumed, *common),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not (run_dir / "checkpoints" / "global_step_2").is_dir():
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "checkpoints" / "global_step_4").exists()

    out = subprocess.run(
        _train_cmd(tiny_model_dir, resumed, *common), check=True, env=env, capture_output=True, text=True
    )
    assert "resumed from" in out.stdout and "global_step_2" in out.stdout

    a, b = _metrics(straight / "rlstack" / "default"), _metrics(run_dir)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5]  # no step logged twice after the kill
    for step in (3, 4, 5):
        assert _deterministic(a[step]) == _deterministic(b[step]), step


def test_a_kill_during_save_never_leaves_a_broken_latest_checkpoint(tmp_path: Path):
    from rlstack.checkpoint import latest_checkpoint, save_atomically

    root = tmp_path / "checkpoints"
    save_atomically(root, 1, lambda p: (p / "state").write_text("ok"), keep=2)

    def crash(p: Path) -> None:
        (p / "state").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_atomically(root, 2, crash, keep=2)
    assert latest_checkpoint(root) == root / "global_step_1"
    save_atomically(root, 3, lambda p: (p / "state").write_text("ok"), keep=2)
    assert not list(root.glob(".tmp*"))  # the leftover of the crashed save is gone
    save_atomically(root, 4, lambda p: (p / "state").write_text("ok"), keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_3", "global_step_4"]


NAN_AFTER_FIRST_STEP = """
CALLS = []

def compute_score(reward_inputs):
    CALLS.append(1)
    value = 1.0 if len(CALLS) == 1 else float("nan")
    return [{"overall": value} for _ in reward_inputs]
"""


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_with_a_message_and_keeps_the_last_good_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
):
    reward = tmp_path / "nan_reward.py"
    reward.write_text(NAN_AFTER_FIRST_STEP)
    cmd = _train_cmd(
        tiny_model_dir,
        tmp_path,
        "trainer.max_steps=4",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        "data.val_files=",
        f"worker.reward.reward_function={reward}:compute_score",
    )
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 1
    assert "TrainingDiverged" in out.stderr and "step 2" in out.stderr and "Traceback" not in out.stderr
    ckpts = sorted(p.name for p in (tmp_path / "rlstack" / "default" / "checkpoints").iterdir())
    assert ckpts == ["global_step_1"]


def test_same_config_and_seed_give_the_same_metrics(tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    """Twice the same seeded run, then once more with `trainer.full_determinism` (deterministic kernels
    only, which the CPU path already is): the same metrics every time."""
    for name in ("CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC"):  # unset again afterwards
        monkeypatch.delenv(name, raising=False)
    runs = []
    try:
        for name, extra in (("a", ()), ("b", ()), ("c", ("trainer.full_determinism=true",))):
            runs.append(_two_steps(tiny_model_dir, tmp_path / name, *extra))
            assert torch.are_deterministic_algorithms_enabled() == bool(extra)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    first = [_deterministic(r) for r in runs[0].values()]
    assert first == [_deterministic(r) for r in runs[1].values()]
    assert first == [_deterministic(r) for r in runs[2].values()]


def test_the_example_config_and_reward_function_load_and_score(monkeypatch):
    from rlstack.rewards.loader import load_reward_function

    root = Path(__file__).parents[1]
    monkeypatch.chdir(root)
    cfg = load_config(["config=examples/grpo_addition.yaml"])
    assert cfg.worker.rollout.n == 8 and cfg.data.rollout_batch_size == 32
    fn = load_reward_function(cfg.worker.reward.reward_function)
    out = fn.fn(
        [
            {"response": "57", "ground_truth": "57"},
            {"response": "47", "ground_truth": "57"},
            {"response": "", "ground_truth": "5"},
        ]
    )
    assert out == [
        {"overall": 1.0, "accuracy": 1.0, "digits": 1.0},
        {"overall": 0.0, "accuracy": 0.0, "digits": 0.5},
        {"overall": 0.0, "accuracy": 0.0, "digits": 0.0},
    ]


@pytest.mark.slow
def test_off_policy_mini_batches_and_kl_loss(tiny_model_dir: Path, tmp_path: Path):
    """Two mini-batches and two epochs: old log-probs are computed and ratios move off 1; KL uses a reference."""
    cfg = load_config(
        _overrides(
            tiny_model_dir,
            tmp_path,
            "trainer.max_steps=2",
            "trainer.val_before_train=false",
            "data.val_files=",
            "trainer.save_model_only=true",
            "worker.actor.global_batch_size=2",
            "worker.actor.ppo_epochs=2",
            "worker.actor.micro_batch_size_per_device_for_update=4",
            "worker.actor.optim.lr=1e-2",
            "algorithm.use_kl_loss=true",
            "algorithm.kl_coef=0.1",
        )
    )
    trainer = Trainer(cfg)
    assert trainer.plan.old_logprobs and trainer.ref is not None
    trainer.fit()
    m = _metrics(cfg.run_dir)
    assert "timing_s/old" in m[1] and "timing_s/ref" in m[1]
    # the plan written beside the config names exactly the phases the step timed
    plan = json.loads((cfg.run_dir / "step_plan.json").read_text())
    assert plan["old_logprobs"] and plan["reference"] == "worker"
    timed = {k.removeprefix("timing_s/") for k in m[1] if k.startswith("timing_s/")} - {"step"}
    assert timed == set(plan["phases"])
    assert m[2]["actor/ppo_kl"] != 0.0  # later mini-batches see weights moved by earlier ones
    assert m[2]["actor/kl_loss"] > 0.0 and m[2]["actor/kl_coef"] == 0.1


def test_no_reference_model_without_kl(tiny_model_dir: Path, tmp_path: Path):
    trainer = Trainer(load_config(_overrides(tiny_model_dir, tmp_path, "trainer.max_steps=1")))
    assert trainer.ref is None and not trainer.plan.old_logprobs


def test_wandb_without_the_package_is_a_clear_error(tmp_path: Path):
    from rlstack.errors import RLStackError
    from rlstack.tracking import Tracker

    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(RLStackError, match=r"rlstack\[wandb\]"):
            Tracker(tmp_path, ["wandb"], {}, "p", "e", total_steps=1)
    else:
        pytest.skip("wandb is installed here")


def test_val_only_validates_the_resumed_checkpoint(tiny_model_dir: Path, tmp_path: Path):
    from transformers import AutoModelForCausalLM

    Trainer(load_config(_overrides(tiny_model_dir, tmp_path, "trainer.max_steps=1"))).fit()
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "rlstack" / "default" / "huggingface")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(trained.model.embed_tokens.weight, base.model.embed_tokens.weight)

    trainer = Trainer(load_config(_overrides(tiny_model_dir, tmp_path, "trainer.val_only=true")))
    metrics = trainer.fit()
    assert "val/addition/accuracy" in metrics and trainer.step == 1
    # the validated weights are the checkpoint's, not the base model's
    assert torch.equal(
        trainer.groups["actor"].worker.model.model.embed_tokens.weight, trained.model.embed_tokens.weight
    )


def test_resuming_a_checkpoint_of_another_model_is_one_clear_message(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.models.loading import write_model_dir

    Trainer(load_config(_overrides(tiny_model_dir, tmp_path, "trainer.max_steps=1"))).fit()
    wider = write_model_dir(tmp_path / "wider", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    trainer = Trainer(load_config(_overrides(wider, tmp_path, "trainer.max_steps=2")))
    with pytest.raises(ValueError, match=r"holds a different model .*hidden_size 32 vs 64"):
        trainer.fit()


ESTIMATORS = [e.value for e in AdvEstimator]
LOSSES = [  # None: loss_agg_mode unset, the loss's own mode (seq-mean-token-mean) is used
    ("vanilla", "token-mean"),
    ("gspo", None),
    ("gspo_token", "seq-mean-token-mean"),
    ("cispo", "seq-mean-token-sum-norm"),
    ("sapo", None),
]


def _two_steps(model: Path, out: Path, *extra: str) -> dict[int, dict]:
    cfg = load_config(
        _overrides(
            model,
            out,
            "trainer.max_steps=2",
            "trainer.val_before_train=false",
            "data.val_files=",
            "trainer.logger=[file]",
            "trainer.save_model_only=true",
            *extra,
        )
    )
    Trainer(cfg).fit()
    return _metrics(cfg.run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_two_steps_with_each_advantage_estimator(tiny_model_dir: Path, tmp_path: Path, estimator: str):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        f"algorithm.adv_estimator={estimator}",
        "worker.critic.global_batch_size=4",
        "worker.critic.micro_batch_size_per_device_for_update=8",
    )
    for step in (1, 2):
        assert math.isfinite(m[step]["actor/pg_loss"]) and math.isfinite(m[step]["critic/advantages/mean"])
    if estimator == "gae":
        assert {
            "critic/vf_loss",
            "critic/vf_explained_var",
            "timing_s/values",
            "timing_s/update_critic",
        } <= set(m[2])
    if estimator == "remax":
        assert "timing_s/baseline" in m[2]


@pytest.mark.slow
@pytest.mark.parametrize(("loss", "agg"), LOSSES)
def test_two_steps_with_each_policy_loss(tiny_model_dir: Path, tmp_path: Path, loss: str, agg: str | None):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        f"worker.actor.loss_type={loss}",
        *([f"worker.actor.loss_agg_mode={agg}"] if agg else []),
        "worker.actor.global_batch_size=2",  # two mini-batches: the second is off-policy
        "worker.actor.micro_batch_size_per_device_for_update=4",
    )
    assert math.isfinite(m[2]["actor/pg_loss"]) and m[2]["actor/ppo_kl"] != 0.0


@pytest.mark.slow
def test_in_reward_kl_with_the_adaptive_controller_and_critic_warmup(tiny_model_dir: Path, tmp_path: Path):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_type=adaptive",
        "algorithm.kl_coef=0.05",
        "algorithm.kl_penalty=kl",
        "trainer.critic_warmup=1",
        "worker.critic.global_batch_size=4",
        "worker.critic.micro_batch_size_per_device_for_update=8",
        "worker.actor.entropy_coeff=0.01",
    )
    assert "actor/pg_loss" not in m[1] and "critic/vf_loss" in m[1]  # step 1 trains only the critic
    assert "actor/pg_loss" in m[2]
    assert m[1]["actor/reward_kl_penalty_coeff"] == 0.05
    assert m[2]["actor/reward_kl_penalty_coeff"] != 0.05  # adapted after step 1


def test_in_reward_kl_reaches_grpo_advantages_in_the_trainer(tiny_model_dir: Path, tmp_path: Path):
    """Equal scores, different KL to the reference: GRPO's advantages must see the KL (veRL sums token rewards)."""
    from rlstack.batch import Batch

    cfg = load_config(
        _overrides(
            tiny_model_dir,
            tmp_path,
            "algorithm.use_kl_in_reward=true",
            "algorithm.kl_coef=0.5",
            "algorithm.kl_penalty=kl",
        )
    )
    trainer = Trainer(cfg)
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 0], [0, 1, 0]])
    batch = Batch(
        {
            "uid": ["a", "a", "b", "b"],
            "scores": torch.ones(4),
            "response_mask": mask,
            "old_logprobs": torch.zeros(4, 3),
            "ref_logprobs": torch.tensor(
                [[0.0, -0.4, -0.4], [0.0, 0.0, 0.0], [0.0, 0.0, -math.inf], [0.0, -1.0, 0.0]]
            ),
        }
    )
    metrics = trainer._advantages(batch)
    adv = batch["advantages"][:, 1]
    assert adv[0] < 0 < adv[1] and adv[3] < 0 < adv[2]  # the response with more KL gets the lower advantage
    assert batch["scores"].tolist() == [1.0] * 4  # the logged scores stay the reward function's
    assert metrics["actor/reward_kl_penalty"] == pytest.approx((0.4 + 0.0 + 0.0 + 1.0) / 4)


PARITY_REWARD = """
REWARD_TYPE = "batch"

def compute_score(reward_inputs):
    # deterministic, and mixed within most groups of a random model's samples
    return [{"overall": float(len(x["response"]) % 2), "parity": float(len(x["response"]) % 2)} for x in reward_inputs]
"""


def _dapo_trainer(model: Path, out: Path, *extra: str) -> Trainer:
    reward = out / "parity.py"
    out.mkdir(parents=True, exist_ok=True)
    reward.write_text(PARITY_REWARD)
    return Trainer(
        load_config(
            _overrides(
                model,
                out,
                "trainer.max_steps=2",
                "trainer.val_before_train=false",
                "data.val_files=",
                "trainer.logger=[file]",
                "trainer.save_model_only=true",
                "algorithm.online_filtering=true",
                f"worker.reward.reward_function={reward}:compute_score",
                *extra,
            )
        )
    )


@pytest.mark.slow
def test_dynamic_sampling_fills_the_batch_with_mixed_groups_only(tiny_model_dir: Path, tmp_path: Path):
    trainer = _dapo_trainer(tiny_model_dir, tmp_path, "algorithm.filter_key=parity")
    metrics: dict[str, float] = {}
    batch = trainer.collector._filtered(1, defaultdict(float), metrics)
    uids = batch["uid"]
    assert len(set(uids)) == 4 and len(batch) == 16  # rollout_batch_size groups of n
    for uid in set(uids):
        group = [s for s, u in zip(batch["scores"].tolist(), uids) if u == uid]
        assert 0 < sum(group) / len(group) < 1
    assert metrics["online_filtering/num_tries"] >= 1
    trainer.fit()  # and the filtered batches train


def test_a_filter_key_that_a_data_sources_function_does_not_return_is_named(
    tiny_model_dir: Path, tmp_path: Path
):
    from rlstack.errors import RLStackError

    # the training rows' source is scored by exact match, which returns no parity
    trainer = _dapo_trainer(
        tiny_model_dir,
        tmp_path,
        "algorithm.filter_key=parity",
        "worker.reward.reward_function_by_source={addition: 'builtin:exact_match'}",
    )
    with pytest.raises(RLStackError, match=r"of data source 'addition' \(builtin:exact_match\); it returns"):
        trainer.collector._filtered(1, defaultdict(float), {})


def test_a_failed_reward_call_under_the_score_policy_drops_its_group_not_the_run(
    tiny_model_dir: Path, tmp_path: Path
):
    reward = tmp_path / "flaky.py"
    reward.write_text(
        "CALLS = []\n"
        "def compute_score(reward_inputs):\n"
        "    CALLS.append(1)\n"
        "    if len(CALLS) == 3:  # one row's call fails\n"
        "        raise RuntimeError('sandbox timed out')\n"
        "    return [{'overall': float(len(x['response']) % 2), 'parity': float(len(x['response']) % 2)}"
        " for x in reward_inputs]\n"
    )
    trainer = _dapo_trainer(
        tiny_model_dir,
        tmp_path,
        "algorithm.filter_key=parity",
        f"worker.reward.reward_function={reward}:compute_score",
        "worker.reward.on_error=score",
        "worker.reward.num_workers=16",  # one call per row: only the failing rows fail
    )
    batch = trainer.collector._filtered(1, defaultdict(float), {})
    assert all("parity" in c for c in batch["reward_components"])  # the failed rows' groups were dropped


@pytest.mark.slow
def test_dynamic_sampling_that_cannot_fill_a_batch_stops_with_advice(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.errors import RLStackError

    # exact match on a random model: every group is all-wrong, so nothing is ever kept
    trainer = _dapo_trainer(
        tiny_model_dir,
        tmp_path,
        "worker.reward.reward_function=builtin:exact_match",
        "algorithm.max_try_make_batch=2",
    )
    with pytest.raises(RLStackError, match="max_try_make_batch=2"):
        trainer.fit()


def test_a_filter_key_the_reward_does_not_return_is_named(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.errors import RLStackError

    trainer = _dapo_trainer(tiny_model_dir, tmp_path, "algorithm.filter_key=acc")
    with pytest.raises(RLStackError, match=r"filter_key='acc'.*\['overall', 'parity'\]"):
        trainer.collector._filtered(1, defaultdict(float), {})


@pytest.mark.slow
def test_overlong_punishment_and_truncation_masking(tiny_model_dir: Path, tmp_path: Path):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        "worker.reward.overlong_buffer_length=4",
        "worker.reward.overlong_penalty_factor=1.0",
        "algorithm.mask_truncated_responses=true",
    )
    # the random model mostly runs to the 6-token limit: penalty -1 there, -0.25 per token into the buffer
    assert -1.0 <= m[1]["reward/overlong"] < 0
    assert m[1]["critic/score/mean"] == pytest.approx(m[1]["reward/overall"] + m[1]["reward/overlong"])


RECIPES = sorted((Path(__file__).parents[1] / "examples" / "recipes").glob("*.yaml"))


def test_every_named_recipe_has_a_config():
    names = {p.stem for p in RECIPES}
    assert {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "cispo", "ppo_gae"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_each_recipe_runs_a_step_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path, recipe: Path):
    reward = tmp_path / "parity.py"
    reward.write_text(PARITY_REWARD)  # mixed groups, so DAPO's filter can fill a batch from a random model
    cfg = load_config(
        [
            f"config={recipe}",
            f"worker.actor.model.model_path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            f"worker.reward.reward_function={reward}:compute_score",
            "algorithm.filter_key=overall",
            "data.rollout_batch_size=4",
            "worker.actor.global_batch_size=4",
            "worker.critic.global_batch_size=4",
            "worker.rollout.n=4",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.critic.micro_batch_size_per_device_for_update=8",
            "trainer.max_steps=1",
            "trainer.val_before_train=false",
            "data.val_files=",
            "trainer.logger=[file]",
            "trainer.save_model_only=true",
        ]
    )
    m = Trainer(cfg).fit()
    assert math.isfinite(m["actor/pg_loss"])


@pytest.mark.slow
@pytest.mark.parametrize("correction", ["tis", "icepop", "seq-mask-tis"])
def test_rollout_corrections_and_high_entropy_selection_train(
    tiny_model_dir: Path, tmp_path: Path, correction: str
):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        f"worker.actor.rollout_correction={correction}",
        "worker.actor.top_entropy_quantile=0.2",
        "worker.actor.global_batch_size=2",
        "worker.actor.micro_batch_size_per_device_for_update=4",
    )
    # the HF engine's numerics match the trainer's, so the weights sit at 1 (or 0 outside a band)
    assert 0.0 < m[2]["actor/rollout_correction_weight"] <= 1.0 + 1e-4
    assert math.isfinite(m[2]["actor/pg_loss"])


@pytest.mark.slow
def test_pyvision_partial_filtering_oversamples_ranks_and_drops_trajectories(
    tiny_model_dir: Path, tmp_path: Path
):
    trainer = _dapo_trainer(
        tiny_model_dir,
        tmp_path,
        "algorithm.oversample_factor=2",
        "algorithm.rank_groups_by_std=true",
        "algorithm.trajectory_filter_max_length=4",
        "algorithm.max_try_make_batch=50",
    )
    metrics: dict[str, float] = {}
    batch = trainer.collector._filtered(1, defaultdict(float), metrics)
    assert len(set(batch["uid"])) == 4
    assert (
        int(batch["response_mask"].sum(-1).max()) <= 4
    )  # longer trajectories were dropped from their groups
    assert metrics["online_filtering/kept_groups_per_try"] > 0


def test_pyvision_options_without_online_filtering_are_a_config_error():
    from rlstack.config import ConfigError

    with pytest.raises(ConfigError, match="set algorithm.online_filtering=true"):
        load_config(["algorithm.rank_groups_by_std=true"])


@pytest.mark.slow
def test_exact_full_kl_loss_uses_a_colocated_reference(tiny_model_dir: Path, tmp_path: Path):
    reward = tmp_path / "parity.py"
    reward.write_text(PARITY_REWARD)  # nonzero advantages, so the first update moves the policy
    cfg = load_config(
        _overrides(
            tiny_model_dir,
            tmp_path,
            "trainer.max_steps=2",
            "trainer.val_before_train=false",
            "data.val_files=",
            "trainer.logger=[file]",
            "trainer.save_model_only=true",
            "algorithm.use_kl_loss=true",
            "algorithm.kl_penalty=full",
            f"worker.reward.reward_function={reward}:compute_score",
        )
    )
    trainer = Trainer(cfg)
    assert trainer.ref is None and trainer.groups["actor"].worker.ref_model is not None
    trainer.fit()
    m = _metrics(cfg.run_dir)
    assert m[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the reference
    assert m[2]["actor/kl_loss"] > 1e-6  # and moves away after one update


FIXTURES = Path(__file__).parent / "fixtures" / "formats"


def test_the_code_reward_runs_a_correct_program_from_a_nemotron_row():
    from rlstack.data.formats import normalize_rows
    from rlstack.data.readers import read_rows
    from rlstack.rewards import builtin

    rows, where = read_rows(str(FIXTURES / "nemotron_code.jsonl"))
    row = normalize_rows(rows, where, "auto")[2]
    tests = row["answer"]
    right = "Reverse it:\n```python\nprint(input()[::-1])\n```"
    wrong = "```python\nprint('no')\n```"
    out = builtin.code(
        [{"response": right, "ground_truth": tests}, {"response": wrong, "ground_truth": tests}]
    )
    assert [o["overall"] for o in out] == [1.0, 0.0]


def _digits_reward(folder: Path) -> str:
    """An override scoring the share of digits in a response: a reward with signal for the random
    tiny model (exact match is always 0), so that the policy moves."""
    reward = folder / "digits.py"
    reward.write_text(
        "REWARD_TYPE = 'sequential'\n\n"
        "def compute_score(x):\n"
        "    return {'overall': sum(c.isdigit() for c in x['response']) / max(1, len(x['response']))}\n"
    )
    return f"worker.reward.reward_function={reward}:compute_score"


def test_weight_sync_check_logs_the_difference_and_stops_on_a_stale_engine(
    tiny_model_dir: Path, tmp_path: Path
):
    import copy

    from rlstack.errors import RLStackError

    args = [
        "trainer.max_steps=2",
        "data.val_files=",
        "trainer.logger=[file]",
        "trainer.save_model_only=true",
        _digits_reward(tmp_path),
        "worker.rollout.check_weight_sync=true",
    ]
    cfg = load_config(_overrides(tiny_model_dir, tmp_path / "ok", *args))
    Trainer(cfg).fit()
    metrics = _metrics(cfg.run_dir)
    assert any(metrics[s]["actor/grad_norm"] > 0 for s in (1, 2))
    assert all(metrics[s]["rollout/weight_sync_max_diff"] < 1e-5 for s in (1, 2))
    assert all(metrics[s]["timing_s/sync"] >= 0 for s in (1, 2))

    # An engine that kept its own copy of the initial weights: the check must catch it
    cfg = load_config(_overrides(tiny_model_dir, tmp_path / "stale", *args))
    trainer = Trainer(cfg)
    engine = trainer.groups["rollout"].worker.engine
    engine.model = copy.deepcopy(engine.model)
    with pytest.raises(RLStackError, match="not sampling from the weights being trained"):
        trainer.fit()


class _SleepyEngine:
    """The trainer's engine, but with memory that sleeps between rollouts (as vLLM's does on CUDA):
    generating or scoring while asleep is an error."""

    def __init__(self, engine):
        self.inner, self.asleep, self.calls = engine, False, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def sleep(self):
        self.asleep = True
        self.calls.append("sleep")

    def wake_up(self):
        self.asleep = False
        self.calls.append("wake_up")

    def generate(self, requests, sampling):
        assert not self.asleep, "generated on a sleeping engine"
        return self.inner.generate(requests, sampling)

    def score(self, request, token_ids):
        assert not self.asleep, "scored on a sleeping engine"
        self.calls.append("score")
        return self.inner.score(request, token_ids)


def test_the_weight_sync_probe_wakes_an_engine_put_to_sleep_by_a_later_rollout(
    tiny_model_dir: Path, tmp_path: Path
):
    """Asynchronous GRPO's producer can generate the next batch (and put the engine to sleep) between a
    sync and its check: the probe must be scored awake, and the engine left asleep as it was."""
    cfg = load_config(
        _overrides(tiny_model_dir, tmp_path, "data.val_files=", "worker.rollout.check_weight_sync=true")
    )
    trainer = Trainer(cfg)
    worker = trainer.groups["rollout"].worker
    engine = worker.engine = worker.loop.engine = _SleepyEngine(worker.engine)
    trainer.collector.collect(1)  # a rollout: the engine sleeps after it
    assert engine.calls == ["wake_up", "sleep"]
    assert trainer.weight_sync.check(trainer.step)["rollout/weight_sync_max_diff"] < 1e-5
    assert engine.calls[2:] == ["wake_up", "score", "sleep"] and engine.asleep
    trainer.weight_sync.sync(trainer.step)  # wakes the engine for the rollout that follows, and it stays awake
    trainer.weight_sync.check(trainer.step)
    assert engine.calls[5:] == ["wake_up", "wake_up", "score"] and not engine.asleep


def test_an_engine_that_keeps_the_previous_weights_is_caught_below_the_tolerance(
    tiny_model_dir: Path, tmp_path: Path
):
    """An update that moves the probe by less than weight_sync_tolerance still shows an engine left on the
    old weights: it scores the probe like the previous sync's policy, not like the policy now."""
    from rlstack.errors import RLStackError

    def config(out: Path):
        return load_config(
            _overrides(
                tiny_model_dir,
                out,
                "data.val_files=",
                "trainer.max_steps=2",
                "worker.actor.optim.lr=1e-4",
                "worker.rollout.check_weight_sync=true",
                _digits_reward(tmp_path),
            )
        )

    cfg = config(tmp_path)
    trainer = Trainer(cfg)
    workers = trainer.groups["rollout"]
    frozen = trainer.policy.score(*trainer.weight_sync.probe)  # what the engine would score, never synced
    numerics = 1e-4  # an engine's own rounding: in step with the policy, it differs by this much

    def engine_scores(stale: bool):
        def call(method, *args, **kwargs):
            if method != "score":
                return type(workers).call(workers, method, *args, **kwargs)
            scores = frozen if stale else trainer.policy.score(*args)
            return [[s + numerics for s in scores]]

        return call

    workers.call = engine_scores(stale=False)
    trainer.fit()  # in step: no alarm
    rows = _metrics(cfg.run_dir)
    assert rows[2]["rollout/weight_sync_max_diff"] == pytest.approx(numerics, abs=1e-6)
    assert rows[2]["rollout/weight_sync_policy_moved"] > 10 * numerics

    cfg = config(tmp_path / "stale")
    trainer = Trainer(cfg)
    workers = trainer.groups["rollout"]
    workers.call = engine_scores(stale=True)
    with pytest.raises(RLStackError, match=r"closer to the previous weights' \(up to 0.0001 apart\)") as info:
        trainer.fit()
    now = float(str(info.value).split("than to the policy's now (up to ")[1].split(")")[0])
    assert now < cfg.worker.rollout.weight_sync_tolerance  # the tolerance alone would not have seen it


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir: Path, tmp_path: Path):
    runs = []
    for name, flag in (("plain", "false"), ("checkpointed", "true")):
        cfg = load_config(
            _overrides(
                tiny_model_dir,
                tmp_path / name,
                "trainer.max_steps=1",
                "data.val_files=",
                "trainer.logger=[file]",
                "trainer.save_model_only=true",
                _digits_reward(tmp_path),
                f"worker.actor.model.enable_gradient_checkpointing={flag}",
            )
        )
        trainer = Trainer(cfg)
        assert trainer.groups["actor"].worker.model.is_gradient_checkpointing == (flag == "true")
        trainer.fit()
        runs.append(_metrics(cfg.run_dir)[1])
    assert runs[0]["actor/grad_norm"] > 0
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl"):
        assert runs[0][key] == pytest.approx(runs[1][key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize(
    "extra",
    [
        ("algorithm.use_kl_loss=true", "algorithm.kl_penalty=low_var_kl"),  # the reference worker too
        (  # the critic too
            "algorithm.adv_estimator=gae",
            "worker.critic.global_batch_size=4",
            "worker.critic.micro_batch_size_per_device_for_update=4",
        ),
    ],
    ids=["grpo-kl", "gae"],
)
def test_padding_free_dynamic_batches_give_the_padded_step(tiny_model_dir: Path, tmp_path: Path, extra):
    """One seeded training step (its log-probs, KL, values, losses and gradient norms) does not depend on
    how the micro-batches are laid out and cut."""
    runs = []
    for name, layout in (
        ("padded", ()),
        (
            "packed",
            (
                "worker.actor.padding_free=true",
                "worker.actor.dynamic_batching=true",
                "worker.actor.max_token_len_per_device_for_update=80",
                "worker.actor.max_token_len_per_device_for_experience=80",
                "worker.ref.max_token_len_per_device_for_experience=80",
                "worker.critic.padding_free=true",
                "worker.critic.dynamic_batching=true",
                "worker.critic.max_token_len_per_device_for_update=80",
                "worker.critic.max_token_len_per_device_for_experience=80",
            ),
        ),
    ):
        runs.append(
            _two_steps(
                tiny_model_dir,
                tmp_path / name,
                "trainer.max_steps=1",
                _digits_reward(tmp_path),
                *extra,
                *layout,
            )[1]
        )
    padded, packed = (_deterministic(r) for r in runs)
    assert padded["actor/grad_norm"] > 0 and set(padded) == set(packed)
    for key in padded:
        assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-5), key


@pytest.mark.slow
def test_a_lora_run_syncs_merged_weights_checkpoints_adapters_and_resumes(
    tiny_model_dir: Path, tmp_path: Path
):
    """LoRA through the trainer: the reference is the base (KL loss), a rollout engine with its own copy
    (asynchronous GRPO) gets the merged weights and passes the stale-weight check, checkpoints hold the
    adapters only, and a resumed run continues as the uninterrupted one."""
    args = (
        "trainer.val_before_train=false",
        "data.val_files=",
        "trainer.logger=[file]",
        "trainer.max_steps=3",
        "trainer.save_freq=1",
        "trainer.save_limit=-1",
        _digits_reward(tmp_path),
        "worker.actor.model.lora.rank=8",
        "worker.actor.model.lora.alpha=16",
        "worker.actor.optim.lr=2e-2",
        "algorithm.use_kl_loss=true",
        "algorithm.kl_penalty=low_var_kl",
        "algorithm.async_grpo.enabled=true",
        "algorithm.async_grpo.max_trajectory_age_steps=0",
        "worker.rollout.check_weight_sync=true",
    )
    cfg = load_config(_overrides(tiny_model_dir, tmp_path / "straight", *args))
    trainer = Trainer(cfg)
    assert trainer.groups["ref"].worker is trainer.groups["actor"].worker  # no second copy of the model
    assert not trainer.groups["rollout"].worker.engine.capabilities.shares_policy_weights
    trainer.fit()
    straight = _metrics(cfg.run_dir)
    assert straight[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the adapters start at zero
    assert straight[2]["actor/kl_loss"] > 1e-6
    assert all(straight[s]["rollout/weight_sync_max_diff"] < 1e-5 for s in (1, 2, 3))
    model_files = {f.name for f in (cfg.run_dir / "checkpoints" / "global_step_2" / "model").iterdir()}
    assert "adapter_model.safetensors" in model_files and "model.safetensors" not in model_files

    resumed = load_config(_overrides(tiny_model_dir, tmp_path / "resumed", *args))
    shutil.copytree(
        cfg.run_dir / "checkpoints" / "global_step_2", resumed.run_dir / "checkpoints" / "global_step_2"
    )
    Trainer(resumed).fit()
    again = _metrics(resumed.run_dir)
    assert sorted(again) == [3]
    assert _deterministic(again[3]) == _deterministic(straight[3])


@pytest.mark.parametrize("placement", ["local", "ray_apart"])
def test_validation_leaves_training_as_it_was(tiny_model_dir: Path, tmp_path: Path, placement: str):
    """A run validated before every step trains exactly as one validated only at the end: validation draws
    from none of training's random streams and leaves the policy and the engine as it found them."""
    extra = ["data.val_files=builtin:addition@test", "data.val_max_samples=16"]
    if placement == "ray_apart":
        ray = pytest.importorskip("ray")
        extra += ["trainer.backend=ray", "worker.rollout.colocated=false"]
    runs = {}
    for name, val in (("often", ["trainer.val_freq=1"]), ("at_end", ["trainer.val_before_train=false"])):
        cfg = digits_run(tiny_model_dir, tmp_path, name, *extra, *val)
        if placement == "ray_apart":
            ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
        try:
            Trainer(cfg).fit()
        finally:
            if placement == "ray_apart":
                ray.shutdown()
        runs[name] = {
            step: {k: v for k, v in _deterministic(row).items() if not k.startswith("val/")}
            for step, row in _metrics(cfg.run_dir).items()
            if step > 0
        }
    assert runs["often"][3]["actor/grad_norm"] > 0
    assert runs["often"] == runs["at_end"]


def test_checkpoints_keep_the_gpu_generators_where_cuda_is_in_use(monkeypatch):
    from rlstack import checkpoint

    gpu_states = [torch.tensor([1, 2, 3], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.is_initialized", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    monkeypatch.setattr("torch.cuda.get_rng_state_all", lambda: gpu_states)
    monkeypatch.setattr("torch.cuda.set_rng_state_all", restored.append)
    state = checkpoint.rng_state()
    assert state["cuda"] is gpu_states
    checkpoint.set_rng_state(state)
    assert restored == [gpu_states]
    monkeypatch.setattr(
        "torch.cuda.device_count", lambda: 2
    )  # resumed on another number of GPUs: left as seeded
    checkpoint.set_rng_state(state)
    assert len(restored) == 1


def test_phase_timers_wait_for_the_gpu_work_they_queued(monkeypatch):
    from rlstack.timing import timer as _timer

    synced = []
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.is_initialized", lambda: True)
    monkeypatch.setattr("torch.cuda.synchronize", lambda: synced.append(time.perf_counter()))
    timing = defaultdict(float)
    with _timer(timing, "gen"):
        time.sleep(0.01)
    assert len(synced) == 2 and timing["gen"] >= 0.01  # before (earlier work is not counted) and after


@pytest.mark.parametrize("validate", [False, True])
def test_running_out_of_memory_while_generating_names_the_settings_to_lower(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch, validate: bool
):
    from rlstack.errors import OutOfMemory
    from rlstack.rollout import hf

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    overrides = ["trainer.max_steps=1", f"trainer.val_before_train={validate}", "data.val_batch_size=-1"]
    trainer = Trainer(load_config(_overrides(tiny_model_dir, tmp_path, *overrides)))
    monkeypatch.setattr(hf, "sample", out_of_memory)
    with pytest.raises(OutOfMemory) as e:
        trainer.fit()
    message = str(e.value)
    if validate:  # every validation prompt in one call (val_batch_size=-1), one response each
        assert message.startswith(
            f"out of memory generating {len(trainer.val_set)} prompts x 1 with the hf engine: "
        )
        assert (
            "lower data.val_batch_size (a positive number of prompts per call, not -1) or worker.rollout.val_n"
            in message
        )
    else:
        assert message.startswith("out of memory generating 4 prompts x 4 with the hf engine: ")
        assert "lower data.rollout_batch_size, worker.rollout.n or data.max_response_length" in message
    assert message.endswith("The device said: CUDA out of memory. Tried to allocate 9.00 GiB")
