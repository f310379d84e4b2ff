"""NeMo RL's GRPO configs load as rlstack's (`rlstack/config/compat/nemo_rl.py`): the 2-GPU code config of our users'
research notes over NeMo RL's `grpo_math_1B.yaml` (its `defaults`), key by key; what rlstack cannot do is
a problem naming the key's file and line; and a NeMo RL config of the built-in task trains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from rlstack.config import ConfigError, load_config

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nemo_rl"


@pytest.fixture()
def configs(tmp_path: Path) -> Path:
    for f in FIXTURES.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def _problems(*args: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(list(args))
    return info.value.problems


def test_the_code_grpo_config_over_its_defaults_reads_as_rlstacks_keys(configs: Path):
    test_config = f"config={configs / 'code_grpo_test.yaml'}"
    problems = _problems(test_config)
    # what rlstack cannot read as it is, each with where it was set
    line = "grpo_math_1B.yaml, line "
    assert any(p.startswith("data.prompt_file='examples/prompts/cot.txt'") and line in p for p in problems)
    assert any("policy.train_global_batch_size=256 (" in p and "at most 128" in p for p in problems), problems
    assert len(problems) == 2 + ("vLLM is not installed" in " ".join(problems)), problems

    cfg = load_config(
        [test_config, "data.prompt_file=null", "policy.train_global_batch_size=128", "worker.rollout.name=hf"]
    )
    w, d, a, t = cfg.worker, cfg.data, cfg.algorithm, cfg.trainer
    assert w.actor.model.model_path == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert w.actor.model.tokenizer_path is None  # ${policy.model_name}: the model's own
    assert (d.rollout_batch_size, w.rollout.n, w.actor.global_batch_size) == (16, 8, 16)  # 128 trajectories
    assert (
        w.actor.micro_batch_size_per_device_for_update,
        w.actor.micro_batch_size_per_device_for_experience,
    ) == (2, 2)
    # 2048 in all, 1024 of them new tokens
    assert (d.max_prompt_length, d.max_response_length, w.rollout.max_model_len) == (1024, 1024, 2048)
    assert (a.adv_estimator, a.use_kl_loss, a.kl_coef, a.kl_penalty) == ("loo_std", True, 0.01, "low_var_kl")
    assert (w.actor.clip_ratio_low, w.actor.clip_ratio_high, w.actor.loss_agg_mode) == (
        0.2,
        0.2,
        "token-mean",
    )
    assert (w.reward.reward_function, w.reward.num_workers) == ("builtin:code", 4)
    assert (d.train_files, d.val_files, d.val_split) == (
        "nvidia/Nemotron-RL-coding-competitive_coding",
        "",
        0.05,
    )
    assert (w.actor.optim.lr, w.actor.optim.weight_decay, w.actor.optim.lr_warmup_steps) == (5e-6, 0.01, 50)
    assert (w.actor.model.dtype, w.actor.padding_free, w.actor.dynamic_batching) == ("bfloat16", True, False)
    assert (w.rollout.gpu_memory_utilization, w.rollout.top_k, w.rollout.colocated) == (0.7, -1, True)
    assert (t.n_gpus_per_node, t.nnodes, t.max_steps, t.seed, t.val_freq, t.val_before_train) == (
        2,
        1,
        100,
        42,
        10,
        False,
    )
    assert (t.save_freq, t.save_limit, t.output_dir, t.logger) == (10, 3, "results/grpo", ["console", "file"])
    assert w.actor.clip_ratio_dual == float("inf")  # ratio_clip_c: null, no dual clip
    assert w.actor.model.chat_template is None  # no tokenizer.chat_template: the tokenizer's own

    # a bound set in rlstack's name stays, the other is what is left of the total
    cfg = load_config(
        [
            test_config,
            "data.prompt_file=null",
            "policy.train_global_batch_size=128",
            "worker.rollout.name=hf",
            "data.max_response_length=512",
        ]
    )
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (1536, 512)


def test_nemo_rls_chat_templates(configs: Path, tmp_path: Path):
    from rlstack.config.compat.nemo_rl_rules import PASSTHROUGH_TEMPLATE

    base = [
        f"config={configs / 'code_grpo_test.yaml'}",
        "data.prompt_file=null",
        "policy.train_global_batch_size=128",
        "worker.rollout.name=hf",
    ]
    for value, expected in (
        (None, PASSTHROUGH_TEMPLATE),
        ("default", None),
        ("{{ messages[0]['content'] }}", "{{ messages[0]['content'] }}"),
    ):
        child = tmp_path / "child.yaml"
        child.write_text(
            yaml.safe_dump(
                {
                    "defaults": str(configs / "code_grpo_test.yaml"),
                    "policy": {"tokenizer": {"chat_template": value}},
                }
            )
        )
        cfg = load_config([f"config={child}", *base[1:]])
        assert cfg.worker.actor.model.chat_template == expected, value


def test_what_rlstack_cannot_do_is_named_with_its_line(configs: Path, tmp_path: Path):
    config = tmp_path / "nemo.yaml"
    config.write_text(
        "policy:\n"
        "  model_name: builtin:tiny-qwen2\n"
        "  max_total_sequence_length: 512\n"
        "  megatron_cfg:\n"
        "    enabled: true\n"
        "  fancy_new_knob: 3\n"
        "grpo:\n"
        "  max_rollout_turns: 3\n"
        "env:\n"
        "  sudoku: {num_workers: 2}\n"
        "data:\n"
        "  train: {dataset_name: DeepScaler}\n"
        "  default: {env_name: sudoku}\n"
    )
    problems = _problems(f"config={config}")
    where = f"({config}, line "
    expected = {
        "policy.fancy_new_knob": "which rlstack has no equivalent for",
        "policy.megatron_cfg.enabled=true": "not Megatron",
        "grpo.max_rollout_turns=3": "rlstack's replies come from worker.rollout.agent.feedback",
        "env.sudoku": "no built-in for",
        "policy.max_total_sequence_length=512": "no split to read",
        "data.train.dataset_name='DeepScaler'": "a NeMo RL registry name",
    }
    for key, why in expected.items():
        assert any(p.startswith(key) and where in p and why in p for p in problems), (key, problems)
    two = tmp_path / "two.yaml"
    two.write_text("env:\n  math: {num_workers: 2}\n  code: {num_workers: 2}\n")
    problems = _problems(f"config={two}")
    assert any("environments ['math', 'code']" in p and "reward_function_by_source" in p for p in problems)
    loop = tmp_path / "sub" / "loop.yaml"
    loop.parent.mkdir()
    loop.write_text("defaults: ../sub/loop.yaml\n")
    assert any("includes itself" in p for p in _problems(f"config={loop}"))
    missing = tmp_path / "child.yaml"
    missing.write_text("defaults: base.yaml\ngrpo:\n  num_prompts_per_step: 4\n")
    problems = _problems(f"config={missing}")
    assert any("defaults 'base.yaml' is not next to the file" in p and "line 1" in p for p in problems), (
        problems
    )


def test_rlstacks_key_on_the_command_line_wins_over_the_files_nemo_rl_key(configs: Path):
    base = [f"config={configs / 'grpo_math_1B.yaml'}", "data.prompt_file=null", "worker.rollout.name=hf"]
    base += ["data.dataset_name=null", "data.train_files=builtin:addition@train"]
    base += ["data.max_prompt_length=256", "data.max_response_length=256"]  # no split in the file
    cfg = load_config([*base, "worker.rollout.temperature=0.7", "worker.rollout.n=32"])
    assert cfg.worker.rollout.temperature == 0.7  # policy.generation.temperature is 1.0 in the file
    assert cfg.worker.rollout.n == 32 and cfg.worker.actor.global_batch_size == 16  # 512 trajectories of 32
    problems = _problems(*base, "worker.rollout.n=8")
    assert any("is 64 prompts of 8 trajectories, more than the 32 prompts" in p for p in problems), problems


def test_a_nemo_rl_config_of_the_builtin_task_trains(tmp_path: Path):
    from rlstack.trainer import Trainer

    config = tmp_path / "nemo.yaml"
    config.write_text(
        "policy:\n"
        "  model_name: builtin:tiny-qwen2\n"
        "  train_global_batch_size: 8\n"
        "  train_micro_batch_size: 8\n"
        "  max_total_sequence_length: 96\n"
        "  generation:\n"
        "    backend: hf\n"
        "    max_new_tokens: 8\n"
        "  optimizer:\n"
        "    name: torch.optim.AdamW\n"
        "    kwargs: {lr: 1.0e-5, weight_decay: 0.0}\n"
        "grpo:\n"
        "  num_prompts_per_step: 2\n"
        "  num_generations_per_prompt: 4\n"
        "  max_num_steps: 2\n"
        "  val_at_start: false\n"
        "  use_leave_one_out_baseline: true\n"
        "  normalize_rewards: true\n"
        "data:\n"
        "  train_data_path: builtin:addition@train\n"
        "  val_data_path: ''\n"
        "loss_fn:\n"
        "  reference_policy_kl_penalty: 0\n"
        "checkpointing:\n"
        "  enabled: false\n"
        f"  checkpoint_dir: {tmp_path / 'out'}\n"
        "logger:\n"
        "  wandb_enabled: false\n"
        "  tensorboard_enabled: false\n"
    )
    cfg = load_config([f"config={config}"])
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (88, 8)
    Trainer(cfg).fit()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["response_length/mean"] > 0
    assert not (cfg.run_dir / "checkpoints").exists() and (cfg.run_dir / "huggingface").is_dir()
