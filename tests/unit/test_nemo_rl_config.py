"""NeMo RL's GRPO configs load as rlstack's (`rlstack/config/compat/nemo_rl.py`): the seed's 1-, 2- and 8-GPU configs
(NeMo RL's `grpo_math_1B.yaml` and the 2-GPU and 8-GPU code configs of our users' research notes over it, by its
`defaults`) with nothing but paths replaced, key by key; what rlstack cannot do is a problem naming the key's
file and line; and a NeMo RL config of the built-in task trains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from config_files import load_with_notes

import rlstack.config.schema as schema
from rlstack.config import Config, ConfigError, load_config
from rlstack.config.machine import machine_rules

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nemo_rl"
CODE_ROWS = "nvidia/Nemotron-RL-coding-competitive_coding"


@pytest.fixture()
def configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    """The fixtures' configs in a folder that is the working directory, with the prompt file where their
    `data.prompt_file` names it (examples/prompts/cot.txt, relative to where NeMo RL runs). Parametrized
    `shipped`: NeMo RL's grpo_math_1B.yaml as it ships (fixtures/nemo_rl/shipped/) in place of the trimmed one."""
    for f in FIXTURES.glob("*.yaml"):
        shutil.copy(f, tmp_path / f.name)
    if getattr(request, "param", "trimmed") == "shipped":
        shutil.copy(FIXTURES / "shipped" / "grpo_math_1B.yaml", tmp_path / "grpo_math_1B.yaml")
    (tmp_path / "examples" / "prompts").mkdir(parents=True)
    shutil.copy(FIXTURES / "cot.txt", tmp_path / "examples" / "prompts" / "cot.txt")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _problems(*args: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(list(args))
    return info.value.problems


def _load_on_the_gpu_node(args: list[str], monkeypatch: pytest.MonkeyPatch) -> Config:
    """`args` loaded as on the GPU node they are written for: what this machine cannot run (vLLM not
    installed, no GPU, no native bfloat16, ...; `rlstack.config.machine`) left out. Here, those are the
    only problems a plain load has."""
    try:
        load_config(args)
        here: list[str] = []
    except ConfigError as e:
        here = e.problems
    with monkeypatch.context() as m:
        m.setattr(schema, "RULES", tuple(r for r in schema.RULES if r is not machine_rules))
        m.setattr(schema, "machine_rules", lambda cfg, p: None, raising=False)
        cfg = load_config(args)
    machine: list[str] = []
    machine_rules(cfg, machine)
    assert set(here) <= set(machine), [p for p in here if p not in machine]
    return cfg


@pytest.mark.parametrize("configs", ["trimmed", "shipped"], indirect=True)
def test_the_seeds_1_2_and_8_gpu_configs_load_with_nothing_but_paths_replaced(
    configs: Path, monkeypatch: pytest.MonkeyPatch
):
    # 1 GPU: NeMo RL's grpo_math_1B.yaml, as it is (its prompt file where it names it)
    cfg = _load_on_the_gpu_node([f"config={configs / 'grpo_math_1B.yaml'}"], monkeypatch)
    d, w, t = cfg.data, cfg.worker, cfg.trainer
    # OpenMathInstruct-2: the Hub dataset and split NeMo RL loads, its answers' field, 5% held out to validate
    assert (d.train_files, d.prompt_key, d.answer_key) == (
        "nvidia/OpenMathInstruct-2@train_1M",
        "problem",
        "expected_answer",
    )
    assert (d.val_files, d.val_split, d.val_max_samples) == ("", 0.05, 256)
    # max_total_sequence_length 512 with max_new_tokens and max_input_seq_length at it: a quarter to the prompt
    assert (d.max_prompt_length, d.max_response_length, w.rollout.max_model_len) == (128, 384, 512)
    assert d.format_prompt is not None and "{{ content }}" in d.format_prompt
    assert (w.reward.reward_function, w.rollout.name, t.n_gpus_per_node, t.logger) == (
        "builtin:math",
        "vllm",
        1,
        ["console", "file"],
    )
    assert (d.rollout_batch_size, w.rollout.n, w.actor.global_batch_size) == (32, 16, 32)
    # validation samples at the training temperature, as NeMo RL's (the trimmed file has no val_* keys)
    assert (w.rollout.val_temperature, w.rollout.val_top_p, w.rollout.val_top_k) == (1.0, 1.0, -1)

    # 2 GPUs: the research notes' code_grpo_test.yaml over it
    cfg = _load_on_the_gpu_node([f"config={configs / 'code_grpo_test.yaml'}"], monkeypatch)
    d, w, t = cfg.data, cfg.worker, cfg.trainer
    assert (d.train_files, d.val_files, d.val_split) == (CODE_ROWS, "", 0.05)
    assert (d.max_prompt_length, d.max_response_length) == (1024, 1024)  # 2048, 1024 of them new tokens
    # train_global_batch_size 256 is more than the 16 x 8 trajectories of a step: one optimizer step per rollout
    assert (d.rollout_batch_size, w.rollout.n, w.actor.global_batch_size) == (16, 8, 16)
    assert (w.reward.reward_function, w.rollout.agent.tools, t.n_gpus_per_node) == ("builtin:code", [], 2)
    assert (w.rollout.val_temperature, w.rollout.val_n) == (1.0, 1)  # the base's training temperature

    # 8 GPUs: code_grpo_production.yaml, its "/path/to/sft/checkpoint" replaced
    checkpoint = configs / "sft_checkpoint"
    checkpoint.mkdir()
    args = [f"config={configs / 'code_grpo_production.yaml'}", f"policy.model_name={checkpoint}"]
    cfg = _load_on_the_gpu_node(args, monkeypatch)
    d, w, t, a = cfg.data, cfg.worker, cfg.trainer, cfg.algorithm
    assert (w.actor.model.model_path, w.actor.model.tokenizer_path) == (str(checkpoint), None)
    assert (d.max_prompt_length, d.max_response_length) == (1024, 3072)  # 4096: a quarter to the prompt
    assert (d.train_files, d.val_files) == (CODE_ROWS, "")  # no validation rows named: none
    # three turns of NeMo RL's code environment: rlstack's Python tool, calls in <code>
    assert w.rollout.agent.tools == [{"name": "python", "import_path": "builtin:python"}]
    assert (w.rollout.agent.max_turns, w.rollout.agent.tool_call_format, w.reward.reward_function) == (
        3,
        "code",
        "builtin:code",
    )
    assert (a.async_grpo.enabled, a.async_grpo.max_trajectory_age_steps, w.reward.num_workers) == (
        True,
        2,
        16,
    )
    assert (d.rollout_batch_size, w.rollout.n, w.actor.global_batch_size, t.n_gpus_per_node) == (
        32,
        16,
        32,
        8,
    )


def test_the_prompt_file_renders_as_nemo_rl_formats_it(
    configs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from rlstack.data.dataset import PromptDataset
    from rlstack.models.tiny import build_char_tokenizer

    cfg = _load_on_the_gpu_node([f"config={configs / 'grpo_math_1B.yaml'}"], monkeypatch)
    rows = tmp_path / "rows.jsonl"
    problem = "If {x} = 3 and {{ y }} = {% 4 %}, what is x + y?\n"  # braces Jinja and str.format would read
    rows.write_text(json.dumps({"problem": problem, "expected_answer": "7"}) + "\n")
    ds = PromptDataset(
        str(rows),
        build_char_tokenizer(),
        prompt_key=cfg.data.prompt_key,
        answer_key=cfg.data.answer_key,
        format_prompt=cfg.data.format_prompt,
        apply_chat_template=False,
        max_prompt_length=10_000,
    )
    nemo_rl = (FIXTURES / "cot.txt").read_text().format(problem)  # NeMo RL: prompt_file.format(problem)
    assert nemo_rl.endswith("step by step.\n") and "\\boxed{}" in nemo_rl
    assert ds.items[0]["prompt_messages"] == [{"role": "user", "content": nemo_rl}]
    assert ds.items[0]["ground_truth"] == "7"

    # a file str.format cannot fill with the problem, or that is not there, is a problem naming it
    base = [f"config={configs / 'grpo_math_1B.yaml'}", "worker.rollout.name=hf"]
    (configs / "named.txt").write_text("Solve {problem}")
    problems = _problems(*base, f"data.prompt_file={configs / 'named.txt'}")
    assert any(
        p.startswith("data.prompt_file=") and "KeyError: 'problem'" in p and "as {}" in p for p in problems
    )
    problems = _problems(*base, "data.prompt_file=prompts/none.txt")
    assert any(p.startswith("data.prompt_file='prompts/none.txt'") and str(configs) in p for p in problems), (
        problems
    )


def test_the_code_grpo_config_over_its_defaults_reads_as_rlstacks_keys(configs: Path):
    test_config = f"config={configs / 'code_grpo_test.yaml'}"
    cfg = load_config(  # a GPU node's config (bfloat16): what this machine cannot run is a warning
        [
            test_config,
            "data.prompt_file=null",
            "policy.train_global_batch_size=128",
            "worker.rollout.name=hf",
        ],
        machine_checks="warn",
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
    assert (d.train_files, d.val_files, d.val_split) == (CODE_ROWS, "", 0.05)
    assert (w.actor.optim.lr, w.actor.optim.weight_decay, w.actor.optim.lr_warmup_steps) == (5e-6, 0.01, 50)
    assert (w.actor.model.dtype, w.actor.padding_free, w.actor.dynamic_batching) == ("bfloat16", True, False)
    assert (w.rollout.gpu_memory_utilization, w.rollout.top_k, w.rollout.colocated) == (0.7, -1, True)
    assert (t.n_gpus_per_node, t.nnodes, t.step_cap, t.seed, t.val_freq, t.val_before_train) == (
        2,
        1,
        100,
        42,
        10,
        False,
    )
    assert (t.save_freq, t.save_limit, t.output_dir, t.logger) == (10, 3, "results/grpo", ["console", "file"])
    # keep_top_k: the 3 best by val_reward (NeMo RL's validation accuracy), higher is better
    assert (t.save_best_metric, t.save_best_mode) == ("val/reward_score", "max")
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
        ],
        machine_checks="warn",
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
        cfg = load_config([f"config={child}", *base[1:]], machine_checks="warn")
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
        "  train: {dataset_name: tulu3_sft_mixture}\n"
        "  default: {env_name: sudoku}\n"
    )
    problems = _problems(f"config={config}")
    where = f"({config}, line "
    expected = {
        "policy.fancy_new_knob": "which rlstack has no equivalent for",
        "policy.megatron_cfg.enabled=true": "not Megatron",
        "grpo.max_rollout_turns=3": "rlstack's replies come from worker.rollout.agent.feedback",
        "env.sudoku": "no built-in for",
        "data.train.dataset_name='tulu3_sft_mixture'": "a NeMo RL registry name without a Hub form rlstack reads",
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


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        (["++policy.generation.temperature=0.7", "++policy.generation.top_k=20"], (0.7, 1.0, 20)),
        (["worker.rollout.temperature=0.6"], (0.6, 1.0, -1)),  # the training value the run takes
        (["worker.rollout.val_temperature=0"], (0, 1.0, -1)),  # rlstack's own key on the command line wins
    ],
)
def test_a_nemo_rl_file_without_validation_sampling_validates_at_its_training_values(
    configs: Path, caplog: pytest.LogCaptureFixture, overrides: list[str], want: tuple
):
    """NeMo RL's validate() generates with greedy=False, which its vLLM worker samples at
    policy.generation.temperature / top_p / top_k (newer versions' val_* keys follow those): the seed's
    grpo_math_1B.yaml, which has no val_* keys, validates at its training values, not rlstack's greedy default,
    and a note says so."""
    cfg, notes = load_with_notes([f"config={configs / 'grpo_math_1B.yaml'}", *overrides], caplog)
    r = cfg.worker.rollout
    assert (r.val_temperature, r.val_top_p, r.val_top_k) == want
    (said,) = [n for n in notes if "sets no val_temperature" in n]
    assert said.startswith(f"policy.generation ({configs / 'grpo_math_1B.yaml'}, line ")
    assert "NeMo RL validates by sampling at the training temperature, top_p and top_k" in said
    assert ("worker.rollout.val_temperature=" in said) == (want[0] != 0)


def test_rlstacks_key_on_the_command_line_wins_over_the_files_nemo_rl_key(configs: Path):
    base = [f"config={configs / 'grpo_math_1B.yaml'}", "data.prompt_file=null", "worker.rollout.name=hf"]
    base += ["data.dataset_name=null", "data.train_files=builtin:addition@train"]
    base += ["data.max_prompt_length=256", "data.max_response_length=256"]  # no split in the file
    cfg = load_config([*base, "worker.rollout.temperature=0.7", "worker.rollout.n=32"], machine_checks="warn")
    assert cfg.worker.rollout.temperature == 0.7  # policy.generation.temperature is 1.0 in the file
    assert cfg.worker.rollout.n == 32 and cfg.worker.actor.global_batch_size == 16  # 512 trajectories of 32
    # 512 trajectories of 8 are 64 prompts, more than a step's 32: one optimizer step per rollout
    assert (
        load_config([*base, "worker.rollout.n=8"], machine_checks="warn").worker.actor.global_batch_size == 32
    )


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


def _nemo_rl(tmp_path: Path, text: str) -> str:
    config = tmp_path / "nemo.yaml"
    config.write_text(
        "policy:\n  model_name: builtin:tiny-qwen2\n  max_total_sequence_length: 80\n  generation: {backend: hf}\n"
        "env:\n  math: {}\n" + text
    )
    return f"config={config}"


def test_nemo_rls_registry_names_are_read_as_their_hub_datasets(tmp_path: Path):
    from rlstack.config.compat.nemo_rl_data import DATASETS

    for name, entry in DATASETS.items():
        off = "".join(f", {k}: false" for k, _ in entry.filters)  # every row, as rlstack reads a Hub split
        cfg = load_config([_nemo_rl(tmp_path, f"data:\n  train: {{dataset_name: {name}{off}}}\n")])
        d = cfg.data
        assert (d.train_files, d.prompt_key, d.answer_key) == (
            entry.files,
            entry.prompt_key,
            entry.answer_key,
        )
        # under data.train (NeMo RL's layout since its #1649) a class brings only the rows it holds out
        assert (d.val_files, d.val_split) == ("", entry.val_split), name
    # DeepScaler's class brought AIME 2024 for validation in the older layout (data.dataset_name), and
    # brings none today; its recipes name data.validation (AIME2024) for it
    cfg = load_config([_nemo_rl(tmp_path, "data:\n  dataset_name: DeepScaler\n")])
    assert (cfg.data.train_files, cfg.data.val_files) == (
        "agentica-org/DeepScaleR-Preview-Dataset@train",
        "HuggingFaceH4/aime_2024@train",
    )
    recipe = "data:\n  train: {dataset_name: DeepScaler}\n  validation: {dataset_name: AIME2024}\n"
    cfg = load_config([_nemo_rl(tmp_path, recipe)])
    assert (cfg.data.train_files, cfg.data.val_files) == (
        "agentica-org/DeepScaleR-Preview-Dataset@train",
        "HuggingFaceH4/aime_2024@train",
    )
    assert (cfg.data.prompt_key, cfg.data.answer_key) == ("problem", "answer")  # both classes' fields
    cfg = load_config(
        [_nemo_rl(tmp_path, "data:\n  train: {dataset_name: DeepScaler}\n  validation: null\n")]
    )
    assert cfg.data.val_files == ""  # NeMo RL's `validation: null`: none
    text = "data:\n  train: {dataset_name: OpenMathInstruct-2, split: train_2M}\n  validation: {dataset_name: org/val}\n"
    cfg = load_config([_nemo_rl(tmp_path, text)])
    assert (cfg.data.train_files, cfg.data.val_files, cfg.data.val_split) == (
        "nvidia/OpenMathInstruct-2@train_2M",
        "org/val",
        0.0,
    )
    # rlstack reads one answer field for training and validation rows
    text = "data:\n  train: {dataset_name: OpenMathInstruct-2}\n  validation: {dataset_name: AIME2024}\n"
    problems = _problems(_nemo_rl(tmp_path, text))
    assert any("(answer and expected_answer)" in p and "data.answer_key" in p for p in problems), problems
    cfg = load_config([_nemo_rl(tmp_path, text[:-1] + "\n  default: {output_key: answer}\n")])
    assert (cfg.data.answer_key, cfg.data.val_files) == ("answer", "HuggingFaceH4/aime_2024@train")


def test_nemo_rl_config_without_training_rows_says_which_key_to_set(tmp_path: Path):
    for text, key in (
        ("data:\n  train: {dataset_name: null}\n", "data.train.dataset_name is null ("),
        ("data:\n  dataset_name: null\n", "data.dataset_name is null ("),
        ("grpo: {num_prompts_per_step: 4}\n", "data.train.dataset_name is not set:"),
    ):
        problems = _problems(_nemo_rl(tmp_path, text))
        matching = [p for p in problems if p.startswith(key)]
        assert len(matching) == 1, problems
        (problem,) = matching
        assert "names no training rows" in problem and "OpenMathInstruct-2" in problem, problem
        assert "data.train.data_path" in problem and "data.train_files" in problem
    # the rows named in rlstack's key (on the command line, or NeMo RL's data_path) are enough
    load_config(
        [_nemo_rl(tmp_path, "data:\n  dataset_name: null\n"), "data.train_files=builtin:addition@train"]
    )
    cfg = load_config([_nemo_rl(tmp_path, "data:\n  train: {data_path: builtin:addition, split: test}\n")])
    assert (cfg.data.train_files, cfg.data.val_files) == ("builtin:addition@test", "")


def test_nemo_rls_trackers_are_rlstacks(tmp_path: Path):
    text = (
        "logger:\n"
        "  wandb_enabled: false\n"
        "  tensorboard_enabled: true\n"
        "  mlflow_enabled: true\n"
        "  swanlab_enabled: true\n"
        "  wandb: {project: grpo-dev, name: grpo-dev-logger}\n"
        "  mlflow: {experiment_name: math, run_name: run-1, tracking_uri: http://mlflow:5000}\n"
        "  swanlab: {project: other}\n"
        "data: {train_data_path: builtin:addition}\n"
    )
    cfg = load_config([_nemo_rl(tmp_path, text)])
    t = cfg.trainer
    assert t.logger == ["console", "file", "tensorboard", "mlflow", "swanlab"]
    assert (t.project_name, t.experiment_name) == ("math", "run-1")  # the first enabled tracker's names
    cfg = load_config([_nemo_rl(tmp_path, text.replace("true", "false")), "trainer.experiment_name=mine"])
    assert (cfg.trainer.logger, cfg.trainer.project_name, cfg.trainer.experiment_name) == (
        ["console", "file"],
        "grpo-dev",
        "mine",
    )


def test_nemo_rls_command_line_reads_as_it_does_there(configs: Path, capsys: pytest.CaptureFixture):
    """`--config F` and Hydra's `++key=value` / `+key=value` (NeMo RL's overrides), its keys translated."""
    from rlstack.cli import main

    args = ["--config", "grpo_math_1B.yaml", "++grpo.max_num_steps=3", "+policy.generation.temperature=0.7"]
    args += ["grpo.num_generations_per_prompt=4", "++worker.rollout.name=hf", "data.prompt_file=null"]
    args += ["data.dataset_name=null", "data.train_files=builtin:addition@train"]
    assert main(["train", *args, "--print-config", "--machine-checks=warn"]) == 0  # bfloat16: a GPU node's
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["trainer"]["step_cap"] == 3  # 1000000 in the file: a cap, as NeMo RL's max_num_steps
    assert resolved["worker"]["rollout"]["temperature"] == 0.7 and resolved["worker"]["rollout"]["n"] == 4
    # the same as config=F with plain overrides
    plain = [a.lstrip("+") for a in args[2:]]
    assert main(["train", "config=grpo_math_1B.yaml", *plain, "--print-config", "--machine-checks=warn"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == resolved
    # Hydra's ~key (delete) has no meaning where every key has a default: named, with what to write
    for where in (["~grpo.max_num_steps", "--print-config"], ["--print-config", "~grpo.max_num_steps"]):
        assert main(["train", *args, *where]) == 2
        err = capsys.readouterr().err
        assert "'~grpo.max_num_steps' deletes a key" in err and "set grpo.max_num_steps=<value>" in err


def test_the_code_environments_terminate_on_evaluation_ends_multi_turn_episodes(configs: Path):
    checkpoint = configs / "sft_checkpoint"
    checkpoint.mkdir()
    production = [f"config={configs / 'code_grpo_production.yaml'}", f"policy.model_name={checkpoint}"]
    for value in (True, False):  # 3 turns of the code environment
        cfg = load_config([*production, f"++env.code.terminate_on_evaluation={value}"], machine_checks="warn")
        assert cfg.worker.rollout.agent.end_on_evaluation is value
    # the research notes' 1-turn config: every episode ends after its one turn, whatever the key says
    cfg = load_config([f"config={configs / 'code_grpo_test.yaml'}"], machine_checks="warn")
    assert cfg.worker.rollout.agent.end_on_evaluation is False
