"""Config loading: defaults <- config=file.yaml <- a.b=c, validation that reports every problem, the CLI."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path

import pytest
import yaml
from config_files import EASYR1_RUN, OWN_ROWS, problems_of, write_yaml

from rlstack import config as config_module
from rlstack.cli import main
from rlstack.config import Config, ConfigError, describe, field_docs, load_config, machine, to_yaml

# --------------------------------------------------------------------------------------- loading


def test_defaults_load_and_validate():
    cfg = load_config([])
    assert isinstance(cfg, Config)
    assert cfg.worker.rollout.n == 8
    assert cfg.worker.rollout.temperature == 1.0
    assert cfg.data.rollout_batch_size == 32
    assert cfg.data.train_files == "builtin:addition@train"
    assert cfg.worker.actor.clip_ratio_low == 0.2
    assert cfg.worker.actor.clip_ratio_high == 0.28
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.run_dir == Path("outputs/rlstack/default")


def test_file_then_overrides_merge_in_order(tmp_path):
    cfg_file = write_yaml(
        tmp_path / "run.yaml",
        """
        worker:
          rollout:
            n: 4
            temperature: 0.5
        trainer:
          experiment_name: from_file
        """,
    )
    cfg = load_config([f"config={cfg_file}", "worker.rollout.n=6"])
    assert cfg.worker.rollout.n == 6  # override beats file
    assert cfg.worker.rollout.temperature == 0.5  # file beats default
    assert cfg.worker.rollout.top_p == 1.0  # default where nobody set it
    assert cfg.trainer.experiment_name == "from_file"
    assert cfg.trainer.project_name == "rlstack"


def test_overrides_win_even_when_written_before_the_file(tmp_path):
    cfg_file = write_yaml(tmp_path / "run.yaml", "worker:\n  rollout:\n    n: 4\n")
    cfg = load_config(["worker.rollout.n=2", f"config={cfg_file}"])
    assert cfg.worker.rollout.n == 2


def test_two_files_merge_in_order(tmp_path):
    first = write_yaml(tmp_path / "a.yaml", "worker:\n  rollout:\n    n: 4\n    top_k: 5\n")
    second = write_yaml(tmp_path / "b.yaml", "worker:\n  rollout:\n    n: 16\n")
    cfg = load_config([f"config={first}", f"config={second}"])
    assert cfg.worker.rollout.n == 16
    assert cfg.worker.rollout.top_k == 5


def test_base_layer_sits_between_defaults_and_file(tmp_path):
    cfg_file = write_yaml(tmp_path / "run.yaml", "worker:\n  rollout:\n    n: 4\n")
    base = {"worker": {"rollout": {"n": 2, "top_k": 7}}}
    cfg = load_config([f"config={cfg_file}"], base=base)
    assert cfg.worker.rollout.n == 4
    assert cfg.worker.rollout.top_k == 7


def test_override_values_are_converted_to_the_field_type():
    cfg = load_config(
        [
            "worker.actor.optim.lr=1e-5",
            "worker.actor.optim.weight_decay=0",
            "trainer.max_steps=null",
            "trainer.logger=[console,file]",
            "worker.reward.reward_function_kwargs={scale: 2}",
            "data.format_prompt=null",
        ]
    )
    assert cfg.worker.actor.optim.lr == pytest.approx(1e-5)
    assert isinstance(cfg.worker.actor.optim.weight_decay, float)
    assert cfg.worker.actor.optim.weight_decay == 0.0
    assert cfg.trainer.max_steps is None
    assert cfg.trainer.logger == ["console", "file"]
    assert cfg.worker.reward.reward_function_kwargs == {"scale": 2}


def test_empty_yaml_file_is_the_defaults(tmp_path):
    cfg_file = tmp_path / "empty.yaml"
    cfg_file.write_text("")
    assert load_config([f"config={cfg_file}"]) == load_config([])


def test_resolved_yaml_loads_back_to_the_same_config(tmp_path):
    cfg = load_config(["worker.rollout.n=4", "trainer.experiment_name=roundtrip"])
    saved = tmp_path / "resolved.yaml"
    saved.write_text(to_yaml(cfg))
    assert load_config([f"config={saved}"]) == cfg


# ------------------------------------------------------------------------------------ validation


def test_unknown_key_in_file_suggests_the_closest_key_and_names_file_and_line(tmp_path):
    cfg_file = write_yaml(
        tmp_path / "run.yaml",
        """
        data:
          rollout_batch_size: 64
        worker:
          rollout:
            n: 4
            temprature: 0.5
        """,
    )
    (problem,) = problems_of([f"config={cfg_file}"])
    assert "unknown key worker.rollout.temprature" in problem
    assert "did you mean worker.rollout.temperature?" in problem
    assert f"{cfg_file}, line 6" in problem


def test_unknown_key_in_override_suggests_and_names_the_override():
    (problem,) = problems_of(["trainer.save_freqq=3"])
    assert "unknown key trainer.save_freqq" in problem
    assert "did you mean trainer.save_freq?" in problem
    assert "command-line override 'trainer.save_freqq=3'" in problem


def test_unknown_key_without_a_close_match_lists_the_valid_keys():
    (problem,) = problems_of(["worker.rollout.zzzzzzzz=1"])
    assert "unknown key worker.rollout.zzzzzzzz" in problem
    assert "valid keys: n, temperature, top_p, top_k" in problem


def test_wrong_types_are_reported():
    problems = problems_of(["worker.rollout.n=abc", "data.max_prompt_length=1.5", "data.shuffle=3"])
    assert len(problems) == 3
    assert (
        "worker.rollout.n (command-line override 'worker.rollout.n=abc'): expected int, got 'abc' (str)"
        in problems[0]
    )
    assert "data.max_prompt_length" in problems[1] and "expected int, got 1.5 (float)" in problems[1]
    assert "data.shuffle" in problems[2] and "expected bool, got 3 (int)" in problems[2]


def test_literal_fields_reject_other_values():
    (problem,) = problems_of(["algorithm.adv_estimator=ppo_typo"])
    assert "algorithm.adv_estimator" in problem
    assert "ppo_typo" in problem


def test_scalar_where_a_section_belongs():
    (problem,) = problems_of(["data=3"])
    assert "data: expected a section (mapping), got 3" in problem


def test_argument_without_equals_sign():
    (problem,) = problems_of(["worker.rollout.n"])
    assert "'worker.rollout.n' is not of the form key=value" in problem


def test_a_config_file_without_config_equals_is_pointed_at(tmp_path):
    (problem,) = problems_of(["examples/grpo_addition.yaml"])
    assert "did you mean config=examples/grpo_addition.yaml?" in problem


def test_one_word_where_a_list_belongs_is_a_list_of_it(tmp_path):
    assert load_config(["trainer.logger=file"]).trainer.logger == ["file"]
    cfg_file = write_yaml(tmp_path / "run.yaml", "trainer:\n  logger: tensorboard\n")
    assert load_config([f"config={cfg_file}"]).trainer.logger == ["tensorboard"]
    (problem,) = problems_of(["trainer.logger=neptune"])  # still checked as the list it became
    assert "neptune" in problem


def test_load_problems_are_reported_together(tmp_path):
    """Unknown keys (file and command line), wrong types and a bad argument in one error."""
    cfg_file = write_yaml(tmp_path / "run.yaml", "worker:\n  rollout:\n    temprature: 0.5\n")
    problems = problems_of([f"config={cfg_file}", "worker.rollout.n=abc", "trainer.save_freqq=3", "oops"])
    assert len(problems) == 4
    text = "\n".join(problems)
    assert "did you mean worker.rollout.temperature?" in text
    assert f"{cfg_file}, line 3" in text
    assert "expected int, got 'abc'" in text
    assert "did you mean trainer.save_freq?" in text
    assert "'oops' is not of the form key=value" in text


def test_cross_field_problems_are_reported_together(tmp_path):
    problems = problems_of(
        [
            "data.rollout_batch_size=10",
            "worker.actor.global_batch_size=4",
            "worker.rollout.n=1",
            "worker.actor.micro_batch_size_per_device_for_update=3",
            f"data.train_files={tmp_path}/missing.jsonl",
            f"data.format_prompt={tmp_path}/missing.jinja",
            f"worker.actor.model.model_path={tmp_path}/missing_model",
            *OWN_ROWS,
        ]
    )
    assert len(problems) == 6, problems

    def one(fragment: str) -> str:
        (problem,) = [p for p in problems if fragment in p]
        return problem

    batch, micro = one("data.rollout_batch_size (10)"), one("4 * 1 = 4")
    group, train = one("compares responses within a group"), one("data.train_files:")
    template, model = one("data.format_prompt:"), one("worker.actor.model.model_path:")
    # batch sizes that don't divide: the numbers, the rule and divisors to pick from
    assert "data.rollout_batch_size (10) must be divisible by worker.actor.global_batch_size (4)" in batch
    assert "1, 2, 5, 10" in batch
    assert "4 * 1 = 4" in micro
    assert "worker.actor.micro_batch_size_per_device_for_update (3)" in micro
    assert "1, 2, 4" in micro
    # a group estimator needs several responses per prompt
    assert "worker.rollout.n must be at least 2 (got 1)" in group
    assert "grpo" in group
    # paths that must exist
    assert train.startswith("data.train_files:") and "missing.jsonl" in train and "does not exist" in train
    assert template.startswith("data.format_prompt:") and "missing.jinja" in template
    assert model.startswith("worker.actor.model.model_path:") and "missing_model" in model


def test_type_problems_and_cross_field_problems_are_reported_together(tmp_path):
    problems = problems_of(["worker.rollout.n=abc", f"data.train_files={tmp_path}/missing.jsonl"])
    text = "\n".join(problems)
    assert "expected int, got 'abc'" in text
    assert "missing.jsonl" in text


def test_numeric_override_of_a_string_field():
    assert load_config(["trainer.experiment_name=2024"]).trainer.experiment_name == "2024"


def test_mini_batch_must_divide_into_micro_batches():
    (problem,) = problems_of(
        [
            "data.rollout_batch_size=8",
            "worker.actor.global_batch_size=4",
            "worker.rollout.n=3",
            "worker.actor.micro_batch_size_per_device_for_update=8",
        ]
    )
    assert "4 * 3 = 12 trajectories" in problem
    assert "(8)" in problem
    assert "1, 2, 3, 4, 6, 12" in problem


def test_a_micro_batch_larger_than_its_mini_batch_is_clamped_with_a_note(tmp_path, capsys):
    """The actor's and the critic's update micro-batches above their mini-batch (global_batch_size * n) run
    as one pass per mini-batch: set to it, one line each naming both sides, and the config records it."""
    sizes = [
        "data.rollout_batch_size=4",
        "worker.actor.global_batch_size=2",
        "worker.rollout.n=3",
        "worker.actor.micro_batch_size_per_device_for_update=64",
        "algorithm.adv_estimator=gae",
        "worker.critic.global_batch_size=1",
        "worker.critic.micro_batch_size_per_device_for_update=5",
    ]
    cfg = load_config(sizes)
    assert cfg.worker.actor.micro_batch_size_per_device_for_update == 6
    assert cfg.worker.critic.micro_batch_size_per_device_for_update == 3
    saved = yaml.safe_load(to_yaml(cfg))["worker"]
    assert saved["actor"]["micro_batch_size_per_device_for_update"] == 6
    assert saved["critic"]["micro_batch_size_per_device_for_update"] == 3
    assert capsys.readouterr().err.splitlines() == [
        "[rlstack] note: worker.actor.micro_batch_size_per_device_for_update=64 is larger than the mini-batch of "
        "worker.actor.global_batch_size * worker.rollout.n = 2 * 3 = 6 trajectories: using "
        "worker.actor.micro_batch_size_per_device_for_update=6 (one forward/backward pass per mini-batch)",
        "[rlstack] note: worker.critic.micro_batch_size_per_device_for_update=5 is larger than the mini-batch of "
        "worker.critic.global_batch_size * worker.rollout.n = 1 * 3 = 3 trajectories: using "
        "worker.critic.micro_batch_size_per_device_for_update=3 (one forward/backward pass per mini-batch)",
    ]
    dynamic = load_config([*sizes[:4], "worker.actor.dynamic_batching=true"])  # rows unused: kept, no note
    assert dynamic.worker.actor.micro_batch_size_per_device_for_update == 64
    assert capsys.readouterr().err == ""


def test_dynamic_batching_replaces_the_micro_batch_rule_with_a_token_budget_rule():
    sizes = [
        "data.rollout_batch_size=8",
        "worker.actor.global_batch_size=4",
        "worker.rollout.n=3",
        "worker.actor.micro_batch_size_per_device_for_update=8",  # 12 rows do not divide by 8: unused here
        "worker.actor.dynamic_batching=true",
        "data.max_prompt_length=100",
        "data.max_response_length=28",
    ]
    assert load_config(sizes).worker.actor.dynamic_batching
    (problem,) = problems_of([*sizes, "worker.ref.max_token_len_per_device_for_experience=127"])
    assert "worker.ref.max_token_len_per_device_for_experience = 127" in problem
    assert "raise it to at least 128" in problem
    (problem,) = problems_of([*sizes, "worker.actor.max_token_len_per_device_for_update=0"])
    assert "must be at least 1" in problem


def test_valid_batch_sizes_pass():
    cfg = load_config(
        [
            "data.rollout_batch_size=8",
            "worker.actor.global_batch_size=4",
            "worker.rollout.n=3",
            "worker.actor.micro_batch_size_per_device_for_update=6",
        ]
    )
    assert cfg.worker.actor.global_batch_size * cfg.worker.rollout.n == 12


def test_non_positive_sizes_and_bad_sampling_values():
    problems = problems_of(["worker.rollout.n=0", "data.max_response_length=0"])
    assert any("worker.rollout.n = 0: must be at least 1" in p for p in problems)
    assert any("data.max_response_length = 0: must be at least 1" in p for p in problems)
    problems = problems_of(["worker.rollout.top_p=0", "worker.rollout.temperature=0"])
    assert len(problems) == 2
    assert (
        "worker.rollout.temperature = 0.0: must be positive" in problems[0]
        and "val_temperature" in problems[0]
    )
    assert "worker.rollout.top_p = 0.0: must be in (0, 1]" in problems[1]


def test_missing_reward_file_and_unknown_logger(tmp_path):
    problems = problems_of(
        [f"worker.reward.reward_function={tmp_path}/nope.py:score", "trainer.logger=[console,neptune]"]
    )
    assert len(problems) == 2
    assert "worker.reward.reward_function" in problems[0] and "nope.py" in problems[0]
    assert (
        "neptune" in problems[1]
        and "console, file, tensorboard, wandb, swanlab, mlflow, trackio" in problems[1]
    )


def test_existing_paths_pass(tmp_path, tiny_model_dir):
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "1+1=", "answer": "2"}\n')
    template = tmp_path / "prompt.jinja"
    template.write_text("{{ content }}")
    cfg = load_config(
        [
            f"data.train_files={data}",
            f"data.format_prompt={template}",
            f"worker.actor.model.model_path={tiny_model_dir}",
            *OWN_ROWS,
        ]
    )
    assert cfg.data.train_files == str(data)


def test_a_missing_relative_model_path_is_a_problem_naming_where_it_was_looked(tmp_path, monkeypatch):
    """A path that cannot be a Hub name (`./`, `../`, `~`, more than one `/`, a first folder that exists here)
    is a local path: missing, it is a problem at load with the key, the path as given, the absolute path and
    the working directory. `org/name` with no local `org` folder stays a Hub name (fetched at load)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    key = "worker.actor.model.model_path"
    for given, absolute, why in (
        ("./nope", tmp_path / "nope", "it starts with './'"),
        ("../nope", tmp_path.parent / "nope", "it starts with '../'"),
        ("models/qwen", tmp_path / "models" / "qwen", "its first folder 'models' exists here"),
        ("nope/a/b", tmp_path / "nope" / "a" / "b", "it has more than one '/'"),
    ):
        (problem,) = problems_of([f"{key}={given}"])
        assert problem.startswith(f"{key}: {given!r} does not exist (looked for {absolute}; "), problem
        assert f"working directory {tmp_path})" in problem and why in problem, problem
    for other in ("worker.critic.model.model_path", "worker.actor.model.tokenizer_path"):
        (problem,) = problems_of([f"{other}=./nope", "algorithm.adv_estimator=gae"])
        assert problem.startswith(f"{other}: './nope' does not exist (looked for {tmp_path / 'nope'}"), (
            problem
        )
    assert load_config([f"{key}=acme/tiny"]).worker.actor.model.model_path == "acme/tiny"  # a Hub name
    (problem,) = problems_of(["data.train_files=models/train@test", *OWN_ROWS])  # local, as models/ is here
    assert f"looked for {tmp_path / 'models' / 'train'}" in problem, problem


def test_missing_config_file(tmp_path):
    (problem,) = problems_of([f"config={tmp_path}/nope.yaml"])
    assert "nope.yaml" in problem and "does not exist" in problem


def test_invalid_yaml_and_non_mapping_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("worker: [unclosed\n")
    (problem,) = problems_of([f"config={bad}"])
    assert "not valid YAML" in problem
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    (problem,) = problems_of([f"config={lst}"])
    assert "must hold a mapping" in problem


def test_broken_yaml_is_named_by_its_file_line_and_column(tmp_path):
    """A config file, and a recipe it names in `defaults`, that YAML cannot read: the file's path, the line
    and column and the line's text, never PyYAML's `<unicode string>`; a character YAML refuses too."""
    recipe = write_yaml(
        tmp_path / "recipe.yaml", "worker:\n  actor:\n    global_batch_size: 8\n   micro: [1\n"
    )
    config = write_yaml(tmp_path / "run.yaml", "defaults: recipe.yaml\n")
    bell = tmp_path / "bell.yaml"
    bell.write_text("trainer:\n  project_name: a\x07b\n")
    for given, named, where, text in (
        (recipe, recipe, "line 4, column 4", "'micro: [1'"),
        (config, recipe, "line 4, column 4", "'micro: [1'"),
        (bell, bell, "line 2, column 18", "'project_name: a\\x07b'"),
    ):
        (problem,) = problems_of([f"config={given}"])
        assert problem.startswith(f"config file {named}, {where}: not valid YAML ("), problem
        assert text in problem and "<unicode string>" not in problem and "\n" not in problem, problem
    (problem,) = problems_of([f"config={recipe}"])
    assert (
        "(expected <block end>, but found '<block mapping start>', while parsing a block mapping at line 2"
        in (problem)
    )


def test_config_error_message_lists_every_problem():
    err = ConfigError(["first", "second"])
    assert str(err) == "2 problem(s) in the configuration:\n  - first\n  - second"
    assert isinstance(err, ValueError)


# -------------------------------------------------------------------------------------------- CLI


def test_print_config_prints_the_resolved_yaml(tmp_path, capsys):
    cfg_file = write_yaml(tmp_path / "run.yaml", "worker:\n  rollout:\n    n: 4\n    temperature: 0.5\n")
    rc = main(["train", f"config={cfg_file}", "worker.rollout.n=6", "--print-config"])
    out = capsys.readouterr().out
    assert rc == 0
    printed = yaml.safe_load(out)
    assert printed["worker"]["rollout"]["n"] == 6
    assert printed["worker"]["rollout"]["temperature"] == 0.5
    assert printed["worker"]["rollout"]["top_p"] == 1.0
    assert printed["data"]["train_files"] == "builtin:addition@train"
    assert set(printed) == {"data", "algorithm", "worker", "trainer"}


@pytest.mark.parametrize(
    ("loss", "mode"),
    [
        ("vanilla", "token-mean"),
        ("cispo", "token-mean"),
        ("gspo", "seq-mean-token-mean"),
        ("gspo_token", "seq-mean-token-mean"),
        ("sapo", "seq-mean-token-mean"),
    ],
)
def test_unset_loss_agg_mode_is_the_mode_the_loss_is_defined_with(loss, mode, capsys):
    assert load_config([f"worker.actor.loss_type={loss}"]).worker.actor.loss_agg_mode == mode
    assert main(["train", f"worker.actor.loss_type={loss}", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["worker"]["actor"]["loss_agg_mode"] == mode


def test_an_explicit_loss_agg_mode_is_kept_or_refused_when_it_conflicts_with_the_loss(tmp_path):
    cfg = load_config(["worker.actor.loss_type=gspo", "worker.actor.loss_agg_mode=seq-mean-token-mean"])
    assert cfg.worker.actor.loss_agg_mode == "seq-mean-token-mean"
    assert load_config(["worker.actor.loss_agg_mode=seq-mean-token-sum"]).worker.actor.loss_agg_mode == (
        "seq-mean-token-sum"
    )
    cfg_file = write_yaml(
        tmp_path / "run.yaml", "worker:\n  actor:\n    loss_type: sapo\n    loss_agg_mode: token-mean\n"
    )
    with pytest.raises(ConfigError, match="loss_type=sapo is defined with loss_agg_mode=seq-mean-token-mean"):
        load_config([f"config={cfg_file}"])


def test_cli_config_error_exits_2_with_message_and_no_traceback(tmp_path, capsys):
    cfg_file = write_yaml(tmp_path / "run.yaml", "worker:\n  rollout:\n    temprature: 0.5\n")
    rc = main(["train", f"config={cfg_file}", "worker.rollout.n=abc", "--print-config"])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    assert captured.err.startswith("rlstack: 2 problem(s) in the configuration:")
    assert "did you mean worker.rollout.temperature?" in captured.err
    assert f"{cfg_file}, line 3" in captured.err
    assert "expected int, got 'abc'" in captured.err
    assert "Traceback" not in captured.err


def test_cli_missing_config_file(tmp_path, capsys):
    rc = main(["sft", f"config={tmp_path}/nope.yaml"])
    captured = capsys.readouterr()
    assert rc == 2
    assert "nope.yaml" in captured.err and "does not exist" in captured.err
    assert "Traceback" not in captured.err


def test_cli_config_keys_lists_every_key(capsys):
    assert main(["config-keys"]) == 0
    out = capsys.readouterr().out
    assert "worker.rollout.n (int, default 8; must be at least 1): Responses sampled per prompt." in out
    assert len(out.strip().splitlines()) == len(describe())


def test_cli_config_keys_filters_and_shows_choices_ranges_and_what_may_change_on_resume(capsys):
    assert main(["config-keys", "adv_estimator"]) == 0
    [line] = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("algorithm.adv_estimator (")
    assert "one of: gae, grpo, rloo," in line
    assert main(["config-keys", "worker.actor.optim.*"]) == 0
    out = capsys.readouterr().out
    listed = {ln.split(" ")[0] for ln in out.strip().splitlines()}
    assert listed == {r[0] for r in describe() if r[0].startswith("worker.actor.optim.")}
    assert "worker.actor.optim.lr (float, default 1e-06; must be at least 0)" in out
    assert main(["config-keys", "--resumable", "trainer."]) == 0
    out = capsys.readouterr().out
    assert "trainer.max_steps" in out and "may change on resume" in out
    assert "trainer.seed" not in out and "worker.actor.optim.lr " not in out


def test_cli_config_keys_without_a_match_names_the_closest(capsys):
    assert main(["config-keys", "worker.rollout.temprature"]) == 2
    assert "worker.rollout.temperature" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- docs


def test_every_leaf_key_has_a_docstring():
    rows = describe()
    keys = [key for key, _, _, _ in rows]
    assert len(keys) == len(set(keys))
    assert "worker.rollout.temperature" in keys
    assert "worker.actor.optim.lr" in keys
    undocumented = [key for key, _, _, doc in rows if not doc.strip()]
    assert undocumented == []


def _config_dataclasses() -> list[type]:
    """The sections `rlstack.config` exports, from whichever of its modules defines them."""
    return [
        obj
        for _, obj in inspect.getmembers(config_module, inspect.isclass)
        if dataclasses.is_dataclass(obj) and obj.__module__.startswith(config_module.__name__ + ".")
    ]


def test_every_dataclass_field_has_a_docstring_sections_included():
    classes = _config_dataclasses()
    assert len(classes) >= 10
    missing = []
    for cls in classes:
        docs = field_docs(cls)
        missing += [
            f"{cls.__name__}.{f.name}" for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()
        ]
    assert missing == []


def test_every_default_is_reachable_from_config():
    """Each config dataclass is a section of Config, so describe() covers all of them."""
    reachable = set()

    def walk(cls: type) -> None:
        reachable.add(cls)
        for tp in typing.get_type_hints(cls).values():
            if dataclasses.is_dataclass(tp):
                walk(tp)

    walk(Config)
    assert set(_config_dataclasses()) == reachable


def test_config_choices_match_the_algorithm_registries():
    """Each set of choices is declared once, as the config's Literal; the algorithms' Enums are made of it
    (`choice_enum`), and each dispatch table must have one entry per choice."""
    import typing

    from rlstack.algos.advantages import ADVANTAGE_ESTIMATORS, AdvEstimator
    from rlstack.algos.kl import KL_ESTIMATORS, KLPenalty
    from rlstack.algos.policy_loss import (
        AGGREGATORS,
        POLICY_LOSSES,
        ROLLOUT_CORRECTIONS,
        LossAggMode,
        PolicyLoss,
        RolloutCorrection,
    )
    from rlstack.config import ActorConfig, AlgorithmConfig

    def choices(cls, name):
        tp = typing.get_type_hints(cls)[name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return set(typing.get_args(args[0])) if len(args) == 1 else set(args)

    assert (
        choices(AlgorithmConfig, "adv_estimator")
        == {e.value for e in AdvEstimator}
        == set(ADVANTAGE_ESTIMATORS)
    )
    assert choices(ActorConfig, "loss_type") == {e.value for e in PolicyLoss} == set(POLICY_LOSSES)
    assert choices(ActorConfig, "loss_agg_mode") == {e.value for e in LossAggMode} == set(AGGREGATORS)
    assert (
        choices(ActorConfig, "rollout_correction")
        == {e.value for e in RolloutCorrection}
        == set(ROLLOUT_CORRECTIONS)
    )
    # `full` is computed in the actor from both models' logits, outside the sampled-token estimators
    assert (
        choices(AlgorithmConfig, "kl_penalty")
        == {e.value for e in KLPenalty}
        == set(KL_ESTIMATORS) | {"full"}
    )


def test_a_choice_enum_names_each_choice_and_survives_pickling():
    import pickle
    from typing import Literal

    from rlstack.algos.kl import KLPenalty
    from rlstack.config.fields import choice_enum

    made = choice_enum("Made", Literal["kl+", "token-mean", "grpo"], __name__)
    assert [(m.name, m.value) for m in made] == [
        ("KL_PLUS", "kl+"),
        ("TOKEN_MEAN", "token-mean"),
        ("GRPO", "grpo"),
    ]
    assert made("grpo") is made.GRPO and made.GRPO == "grpo" and isinstance(made.GRPO, str)
    with pytest.raises(ValueError, match="same member name"):
        choice_enum("Clash", Literal["a-b", "a_b"], __name__)
    # the workers receive these in parameter records sent to Ray actors: a member comes back as itself
    assert pickle.loads(pickle.dumps(KLPenalty.LOW_VAR_KL_PLUS)) is KLPenalty.LOW_VAR_KL_PLUS


# ------------------------------------------------------------------------------------ devices, engines


def test_gpu_features_asked_for_on_the_cpu_are_all_named_at_load(monkeypatch):
    import importlib.util

    monkeypatch.setattr(machine, "cpu_supports_bfloat16", lambda: False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    with pytest.raises(ConfigError) as info:
        load_config(
            [
                "trainer.device=cuda",
                "worker.actor.model.dtype=bfloat16",
                "worker.actor.model.attn_implementation=flash_attention_2",
                "worker.rollout.name=vllm",
                "worker.rollout.free_cache_engine=true",
                "worker.rollout.tensor_parallel_size=2",
            ]
        )
    text = str(info.value)
    for expected in (
        "trainer.device = cuda, but torch sees no CUDA GPU",
        "no native bfloat16",
        "flash_attention_2 needs a CUDA GPU",
        "pip install 'rlstack[vllm]'",
        "sleep mode exists only on CUDA GPUs",
        "tensor_parallel_size = 2, but trainer.n_gpus_per_node = 1: an engine is split over 2 ranks (GPUs, or "
        "processes on a CPU) of one node",
    ):
        assert expected in text, expected


def test_flash_attention_in_float32_is_refused_at_load():
    problems = problems_of(["worker.actor.model.attn_implementation=flash_attention_2"])
    assert any("FlashAttention computes only in bfloat16 or float16" in p for p in problems), problems


@pytest.fixture()
def vllm_on_two_gpus(monkeypatch):
    """vLLM installed and two CUDA GPUs visible, as far as the config's checks can tell."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a)
    )
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)


def test_vllm_settings_it_cannot_honour_are_named_at_load(vllm_on_two_gpus):
    with pytest.raises(ConfigError) as info:
        load_config(
            [
                "worker.rollout.name=vllm",
                "worker.rollout.tensor_parallel_size=2",
                "worker.rollout.max_model_len=100",
                "data.max_prompt_length=100",
                "data.max_response_length=28",
                "worker.actor.rollout_correction=tis",
                "worker.rollout.top_p=0.9",
            ]
        )
    text = str(info.value)
    for expected in (
        "tensor_parallel_size = 2, but trainer.n_gpus_per_node = 1",
        "max_model_len = 100 is less than data.max_prompt_length + data.max_response_length = 128",
        "rollout_correction = tis with worker.rollout.name = vllm and worker.rollout.top_p = 0.9",
    ):
        assert expected in text, expected
    # what it can: one GPU per engine, the whole context, untruncated sampling
    cfg = load_config(
        ["worker.rollout.name=vllm", "worker.actor.rollout_correction=tis", "worker.rollout.top_p=1.0"]
    )
    assert cfg.worker.rollout.max_model_len == cfg.data.max_prompt_length + cfg.data.max_response_length


def test_a_tensor_parallel_engine_must_sit_on_the_policys_ranks_of_one_node(vllm_on_two_gpus):
    tp = ["worker.rollout.name=vllm", "worker.rollout.tensor_parallel_size=2"]
    cfg = load_config([*tp, "trainer.n_gpus_per_node=2"])  # one engine over both GPUs, on Ray
    assert cfg.worker.rollout.tensor_parallel_size == 2 and cfg.trainer.backend == "ray"
    cases = {
        "trainer.n_gpus_per_node=3": "n_gpus_per_node must be a multiple of it",
        "trainer.n_gpus_per_node=4": "trainer.n_gpus_per_node = 4, but 2 GPU(s) are visible",
        "worker.rollout.colocated=false": "a split engine runs on the policy's ranks",
        "algorithm.async_grpo.enabled=true": "generate in step, which the asynchronous producer does not keep",
    }
    for override, expected in cases.items():
        problems = problems_of([*tp, "trainer.n_gpus_per_node=2", override])
        assert any(expected in p for p in problems), (override, problems)
    hf = ["worker.rollout.name=hf", "worker.rollout.tensor_parallel_size=2", "trainer.n_gpus_per_node=2"]
    problems = problems_of(hf)
    assert any("only the vLLM engine is split over ranks" in p for p in problems), problems
    # auto on this (patched) 2-GPU machine with vLLM installed is vLLM, split over both GPUs
    auto = load_config(["worker.rollout.tensor_parallel_size=2", "trainer.n_gpus_per_node=2"])
    assert auto.worker.rollout.name == "vllm" and "on CUDA" in auto.worker.rollout.auto_reason


def test_engine_defaults_resolve_at_load(monkeypatch):
    cfg = load_config([])
    assert cfg.worker.rollout.name == "hf" and cfg.worker.rollout.free_cache_engine is None
    assert cfg.trainer.device == "auto"
    with pytest.raises(ConfigError, match="free_cache_engine is a vLLM setting"):
        load_config(["worker.rollout.free_cache_engine=false"])
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a)
    )
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    cfg = load_config(
        ["worker.rollout.name=vllm", "data.max_prompt_length=100", "data.max_response_length=28"]
    )
    assert cfg.worker.rollout.free_cache_engine is False  # no sleep mode on the CPU
    assert cfg.worker.rollout.max_model_len == 128


def test_cpu_offload_loads_on_one_rank_but_not_with_lora():
    assert load_config(["worker.actor.fsdp.offload_params=true"]).worker.actor.fsdp.offload_params
    (problem,) = problems_of(["worker.actor.fsdp.offload_params=true", "worker.actor.model.lora.rank=8"])
    assert "which LoRA does not take yet" in problem


# ------------------------------------------------------------------------------------ EasyR1's keys

EASYR1 = """\
data:
  train_files: builtin:addition@train
  val_files: builtin:addition@test
  image_key: pictures
  video_key: videos
  video_fps: 2.0
  mini_rollout_batch_size: null
  override_chat_template: null
  val_batch_size: -1
algorithm:
  disable_kl: true
  use_kl_loss: true
worker:
  actor:
    ulysses_size: 1
    model:
      freeze_vision_tower: true
      lora:
        target_modules: q_proj,v_proj
    optim:
      strategy: adamw
    loss_avg_mode: seq
    loss_type: default
    fsdp:
      enable_full_shard: true
      enable_cpu_offload: true
      enable_rank0_init: true
      torch_dtype: bf16
      mp_param_dtype: bf16
      mp_reduce_dtype: fp32
    offload:
      offload_params: true
      offload_optimizer: true
  rollout:
    limit_images: 3
    enable_chunked_prefill: false
    disable_tqdm: true
    val_override_config:
      temperature: 0.6
      top_p: 0.95
      n: 2
  ref:
    fsdp:
      enable_cpu_offload: true
    offload:
      offload_params: false
  reward:
    reward_type: batch
trainer:
  max_try_make_batch: 7
  save_checkpoint_path: null
  backend: ray
  n_gpus_per_node: 2
"""


def test_an_easyr1_config_loads_with_its_keys_read_as_rlstacks(tmp_path, caplog):
    path = tmp_path / "easyr1.yaml"
    path.write_text(EASYR1)
    cfg = load_config([f"config={path}", *EASYR1_RUN[2:]], machine_checks="warn")  # bf16: a GPU node's
    d, a, r = cfg.data, cfg.worker.actor, cfg.worker.rollout
    assert (d.image_key, d.val_batch_size) == ("pictures", -1)  # rlstack keys of the same name
    assert not cfg.algorithm.use_kl_loss and not cfg.algorithm.use_kl_in_reward  # disable_kl wins
    assert a.freeze_vision_tower and a.fsdp.offload_params  # enable_cpu_offload (offload.*: a note only)
    assert (a.model.dtype, a.fsdp.mp_param_dtype) == ("bfloat16", "bfloat16")  # EasyR1's "bf16"
    assert (a.loss_agg_mode, a.loss_type) == ("seq-mean-token-mean", "vanilla")
    assert a.model.lora.target_modules == ["q_proj", "v_proj"]
    assert (r.agent.max_images, r.val_temperature, r.val_top_p, r.val_n) == (3, 0.6, 0.95, 2)
    assert cfg.algorithm.max_try_make_batch == 7
    assert a.optim.strategy == "adamw"  # rlstack's own key, as EasyR1 writes it
    notes = [rec.getMessage() for rec in caplog.records if rec.name == "rlstack.config.compat.easyr1"]
    assert (
        f"config: worker.actor.model.freeze_vision_tower ({path}, line 17): EasyR1's key, read as "
        "worker.actor.freeze_vision_tower=True" in notes
    )
    assert any(
        n.startswith("config: worker.actor.fsdp.enable_full_shard") and "FSDP2 always shards" in n
        for n in notes
    )
    assert any("disable_kl" in n and f"over algorithm.use_kl_loss=true ({path}, line 12)" in n for n in notes)
    assert (
        len(notes) == 32
    )  # every EasyR1 key or spelling above, each said once (ulysses_size and optim.strategy are rlstack's own),
    # and the notes on what it leaves out: the keys that take EasyR1's defaults, validation's top_k (the
    # rollout's), trust_remote_code (EasyR1's true is not taken), the token budgets of its dynamic batching
    assert (a.padding_free, a.dynamic_batching, cfg.worker.critic.dynamic_batching) == (True, True, True)
    assert any(
        n.startswith("config: keys this EasyR1 config leaves out take EasyR1's defaults") for n in notes
    )
    assert (d.max_response_length, d.rollout_batch_size, a.clip_ratio_high) == (512, 512, 0.3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "worker.actor.ulysses_size=2",
            "worker.actor.ulysses_size=2 splits each sequence over 2 ranks, and the run has one process",
        ),
        ("worker.actor.fsdp.enable_full_shard=false", "replicated training is not built"),
        ("data.mini_rollout_batch_size=64", "set algorithm.oversample_factor instead"),
        ("worker.reward.reward_type=sequential", "rlstack reads a reward function's type from its file"),
        (
            "worker.rollout.val_override_config.seed=3",
            "worker.rollout.val_override_config.seed (command-line override",
        ),
        ("trainer.save_checkpoint_path=/ckpt", "set trainer.output_dir"),
        ("worker.actor.fsdp.fsdp_size=4", "no hybrid sharding"),
        ("worker.actor.strategy=megatron", "rlstack shards with FSDP2"),
    ],
)
def test_an_easyr1_key_rlstack_does_without_is_a_problem_at_other_values(override: str, message: str):
    with pytest.raises(ConfigError) as e:
        load_config([override])
    assert message in str(e.value)


def test_an_easyr1_key_and_its_rlstack_name_together_are_a_problem(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text("trainer:\n  total_episodes: 3\n  total_epochs: 4\n")
    with pytest.raises(
        ConfigError,
        match=rf"trainer.total_episodes \({path}, line 2\) is EasyR1's name for "
        r"trainer.total_epochs, which is set too: keep trainer.total_epochs only",
    ):
        load_config([f"config={path}"])


def test_val_batch_size_minus_one_means_every_prompt_and_zero_is_refused():
    assert load_config(["data.val_batch_size=-1"]).data.val_batch_size == -1
    with pytest.raises(ConfigError, match=r"data.val_batch_size = 0: must be at least 1, or -1"):
        load_config(["data.val_batch_size=0"])


def test_the_backend_is_ray_for_several_ranks_or_rollout_actors_apart_and_local_otherwise():
    assert load_config([]).trainer.backend == "local"
    assert load_config(["trainer.n_gpus_per_node=2"]).trainer.backend == "ray"  # EasyR1's plain override
    assert load_config(["worker.rollout.colocated=false"]).trainer.backend == "ray"
    with pytest.raises(ConfigError, match="but trainer.backend = local runs one process"):
        load_config(["trainer.n_gpus_per_node=2", "trainer.backend=local"])  # asked for explicitly


BRACKETS = (
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def test_easyr1s_override_chat_template_renders_every_prompt(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.models.loading import load_tokenizer
    from rlstack.trainer import Trainer

    template = tmp_path / "brackets.jinja"
    template.write_text(BRACKETS)
    for value in (BRACKETS, str(template)):  # the template, or its file
        config = tmp_path / "easyr1.yaml"
        config.write_text(yaml.safe_dump({"data": {"override_chat_template": value}}))
        cfg = load_config(
            [
                f"config={config}",
                *EASYR1_RUN,
                f"worker.actor.model.model_path={tiny_model_dir}",
                f"trainer.output_dir={tmp_path / 'out'}",
                "data.val_files=",
                "trainer.logger=[file]",
                "data.rollout_batch_size=4",
                "worker.actor.global_batch_size=4",
            ]
        )
        assert cfg.worker.actor.model.chat_template == value
        trainer = Trainer(cfg)
        prompt = load_tokenizer(str(tiny_model_dir)).decode(trainer.train_set.items[0]["prompt_ids"])
        assert prompt.startswith("[user] ") and prompt.endswith("[assistant] "), prompt
    trainer.groups["actor"].worker._save_processing(tmp_path / "hf")  # what a Hugging Face checkpoint holds
    assert load_tokenizer(str(tmp_path / "hf")).chat_template == BRACKETS


def test_a_chat_template_that_is_missing_or_broken_is_named_with_its_line(tmp_path: Path):
    for name in ("none.jinja", "qwen_tmpl"):  # a path, whatever its suffix, must exist
        missing = problems_of([f"worker.actor.model.chat_template={tmp_path / name}"])
        assert any(f"{name}' does not exist" in p for p in missing), missing
    # one long line, as EasyR1 configs quote it, and Hugging Face's generation tag: both load
    long = (
        "{%- for m in messages %}"
        + "{{ m['content'] }}" * 40
        + "{% generation %}x{% endgeneration %}{% endfor %}"
    )
    config = tmp_path / "long.yaml"
    config.write_text(yaml.safe_dump({"worker": {"actor": {"model": {"chat_template": long}}}}, width=10_000))
    assert load_config([f"config={config}"]).worker.actor.model.chat_template == long
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}\n{{ m.content }}\n{% endfor\n")
    problems = problems_of([f"worker.actor.model.chat_template={broken}"])
    assert any(f"worker.actor.model.chat_template: {broken}, line 3:" in p for p in problems), problems


def test_the_tool_contract_sets_the_call_format_and_refuses_one_that_contradicts_it():
    python, zoom = (
        "worker.rollout.agent.tools=[{import_path: builtin:python}]",
        "worker.rollout.agent.tools=[{import_path: builtin:zoom}]",
    )
    agent = load_config([]).worker.rollout.agent
    assert (agent.tool_contract, agent.tool_call_format) == ("rlstack", "code")  # today's default, resolved
    assert (
        load_config(["worker.rollout.agent.tool_call_format=hermes"]).worker.rollout.agent.call_format
        == "hermes"
    )
    for contract, style, tools in (
        ("pyvision", "code", python),
        ("codev", "code", python),
        ("deepeyes", "hermes", zoom),
    ):
        agent = load_config([f"worker.rollout.agent.tool_contract={contract}", tools]).worker.rollout.agent
        assert agent.tool_call_format == style, contract  # the config written with the run says so
        agent = load_config(
            [
                f"worker.rollout.agent.tool_contract={contract}",
                tools,
                f"worker.rollout.agent.tool_call_format={style}",
            ]
        ).worker.rollout.agent
        assert agent.tool_call_format == style  # saying it again is no contradiction
    (problem,) = problems_of(
        ["worker.rollout.agent.tool_contract=deepeyes", zoom, "worker.rollout.agent.tool_call_format=code"]
    )
    assert problem == (
        "worker.rollout.agent.tool_contract=deepeyes writes calls as hermes (<tool_call>{json}</tool_call>), but "
        "worker.rollout.agent.tool_call_format=code: leave tool_call_format unset (the contract sets it), or use "
        "tool_contract=rlstack to write code calls"
    )
    (problem,) = problems_of(
        [
            "worker.rollout.agent.tool_contract=pyvision",
            "worker.rollout.agent.tool_call_format=hermes",
            python,
        ]
    )
    assert "tool_contract=pyvision writes calls as code (<code>```python ...```</code>)" in problem
    (problem,) = problems_of(["worker.rollout.agent.tool_contract=codev"])
    assert (
        "tool_contract=codev sets how tools are called and how they answer, but worker.rollout.agent.tools is empty"
        in problem
    )
    (problem,) = problems_of(["worker.rollout.agent.tool_contract=qwen"])
    assert "expected one of rlstack, pyvision, deepeyes or codev, got 'qwen'" in problem


def test_ignore_eos_is_refused_where_it_cannot_work():
    assert load_config(["worker.rollout.ignore_eos=true"]).worker.rollout.ignore_eos
    with pytest.raises(ConfigError, match="ignore_eos=true cannot be used with worker.rollout.agent.tools"):
        load_config(
            ["worker.rollout.ignore_eos=true", "worker.rollout.agent.tools=[{import_path: builtin:python}]"]
        )
    with pytest.raises(ConfigError, match="mask_truncated_responses=true gives responses cut there no loss"):
        load_config(["worker.rollout.ignore_eos=true", "algorithm.mask_truncated_responses=true"])
    with pytest.raises(
        ConfigError, match="overlong_buffer_length=8 gives every sample the full overlong penalty"
    ):
        load_config(["worker.rollout.ignore_eos=true", "worker.reward.overlong_buffer_length=8"])


# ------------------------------------------------------------------------------------ ranges, choices


def test_a_negative_learning_rate_is_refused_at_load_naming_the_key():
    (problem,) = problems_of(["worker.actor.optim.lr=-1e-4"])
    assert problem == "worker.actor.optim.lr = -0.0001: must be at least 0"


def test_every_value_out_of_its_range_is_reported_at_once():
    problems = problems_of(
        [
            "worker.actor.optim.lr=-1e-4",
            "worker.actor.optim.betas=[0.9,1.0]",
            "worker.actor.optim.weight_decay=-0.1",
            "worker.actor.optim.lr_warmup_steps=-1",
            "worker.actor.max_grad_norm=0",
            "worker.actor.clip_ratio_low=-0.2",
            "worker.actor.clip_ratio_high=-0.1",
            "worker.critic.optim.betas=[-0.1,0.999]",
            "data.val_max_samples=0",
            "worker.rollout.top_k=-2",
        ]
    )
    assert problems == [
        "data.val_max_samples = 0: must be at least 1, or -1",
        "worker.actor.optim.lr = -0.0001: must be at least 0",
        "worker.actor.optim.betas[1] = 1.0: must be in [0, 1)",
        "worker.actor.optim.weight_decay = -0.1: must be at least 0",
        "worker.actor.optim.lr_warmup_steps = -1: must be at least 0, or null",
        "worker.actor.max_grad_norm = 0.0: must be positive, or inf (clipping to 0 stops every update; inf: no clipping)",
        "worker.actor.clip_ratio_low = -0.2: must be at least 0",
        "worker.actor.clip_ratio_high = -0.1: must be at least 0",
        "worker.rollout.top_k = -2: must be at least -1 (-1 or 0: all tokens)",
        "worker.critic.optim.betas[0] = -0.1: must be in [0, 1)",
    ]


def test_numbers_yaml_reads_as_text_are_numbers(tmp_path: Path):
    """PyYAML (YAML 1.1) reads `1e-5` without a dot as text, and OmegaConf the command line's `inf`: both
    are the numbers a user meant; nan is out of every range; a seed numpy refuses is refused at load."""
    path = tmp_path / "run.yaml"
    path.write_text("worker:\n  actor:\n    optim:\n      lr: 1e-5\ntrainer:\n  max_steps: 1e3\n")
    cfg = load_config([f"config={path}", "worker.actor.max_grad_norm=inf"])
    assert cfg.worker.actor.optim.lr == 1e-5 and cfg.trainer.max_steps == 1000
    assert cfg.worker.actor.max_grad_norm == float("inf")  # its range names inf: no clipping
    assert problems_of(["worker.rollout.temperature=inf", "worker.actor.optim.lr=.inf"]) == [
        "worker.actor.optim.lr = inf: not a finite number; must be at least 0",
        "worker.rollout.temperature = inf: not a finite number; must be positive (greedy decoding is for "
        "validation only: worker.rollout.val_temperature=0)",
    ]
    assert problems_of(["worker.actor.optim.lr=nan", "trainer.max_steps=2.5", "trainer.seed=-1"]) == [
        "trainer.max_steps (command-line override 'trainer.max_steps=2.5'): expected int | None, got 2.5 (float)",
        "worker.actor.optim.lr = nan: not a finite number; must be at least 0",
        "trainer.seed = -1: must be in [0, 4294967296) (numpy takes seeds of 32 bits)",
    ]


def test_range_problems_join_the_other_problems():
    problems = problems_of(["worker.actor.optim.lr=-1", "worker.rollout.n=abc", "trainer.save_freqq=3"])
    assert len(problems) == 3
    assert "worker.actor.optim.lr = -1.0: must be at least 0" in problems


def test_every_default_and_every_shipped_config_is_in_range():
    from rlstack.config.fields import range_problems

    assert range_problems(Config()) == []
    root = Path(__file__).parents[2]
    for path in sorted([*root.glob("examples/**/*.yaml"), *root.glob("rlstack/configs/*.yaml")]):
        machine = "warn" if path.parent.name == "scale" else "error"  # written for GPU nodes
        assert load_config([f"config={path}"], machine_checks=machine), path


SCALE = sorted((Path(__file__).parents[2] / "examples" / "scale").glob("*.yaml"))


def test_there_is_a_recipe_at_scale_for_each_seed():
    assert {p.stem for p in SCALE} >= {
        "easyr1_qwen2_5_vl_7b_geo3k",
        "vppo_qwen2_5_vl_7b",
        "pyvision_qwen2_5_vl_7b",
        "codev_qwen2_5_vl_7b",
        "nemo_rl_code_grpo_7b_async",
    }


@pytest.mark.parametrize("recipe", SCALE, ids=lambda p: p.stem)
def test_each_recipe_at_scale_loads_here_with_only_machine_problems_as_warnings(recipe: Path, capsys):
    cfg = load_config([f"config={recipe}"], machine_checks="warn")
    assert (
        cfg.worker.rollout.name == "vllm"
        and cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node >= 8
        or (cfg.worker.rollout.num_ranks + cfg.trainer.n_gpus_per_node >= 8)
    )
    assert cfg.worker.actor.model.model_path.startswith(("Qwen/",))
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "this machine cannot run it" in ln]
    try:  # without the flag, the same and only those problems stop the load
        load_config([f"config={recipe}"])
    except ConfigError as e:
        assert len(e.problems) == len(warned) and all(p in "\n".join(warned) for p in e.problems)
    else:
        assert warned == []


@pytest.mark.parametrize(
    ("stem", "reward", "overall"),
    [
        # PyVision: the judge's 1 plus 0.1 for the one code cell the tool ran
        ("pyvision_qwen2_5_vl_7b", "builtin:pyvision", 1.0 + 0.1),
        # CodeV: accuracy 1 (the judge's TRUE) + 0.3 format + 0.5 x the grade 0.5, by the search rubric
        ("codev_qwen2_5_vl_7b", "builtin:codev", 1.0 + 0.3 + 0.5 * 0.5),
    ],
)
def test_the_codev_and_pyvision_recipes_score_with_their_systems_rewards(stem, reward, overall):
    """examples/scale/codev_* and pyvision_* name CodeV's and PyVision's own rewards (not builtin:agent, which
    is DeepEyes' composite), and the reward section they load scores with the judge they name."""
    from judge_server import JudgeServer
    from scored_batches import make_batch

    from rlstack.rewards import codev
    from rlstack.rewards.manager import RewardManager

    def reply(body):
        messages = body["messages"]
        if "Judgement:" in messages[-1]["content"]:
            return ("ok", "Judgement: 1")  # PyVision's judge
        return (
            ("ok", "0.5") if messages[0]["role"] == "system" else ("ok", "TRUE")
        )  # CodeV's grader, verifier

    server = JudgeServer(default=reply)
    try:
        recipe = Path(__file__).parents[2] / "examples" / "scale" / f"{stem}.yaml"
        cfg = load_config(
            [
                f"config={recipe}",
                f"worker.reward.judge.base_url={server.url}",
                "worker.reward.judge.check_at_start=false",
            ],
            machine_checks="warn",
        )
        assert cfg.worker.reward.reward_function == reward and not cfg.worker.reward.agent.judge_always
        batch = make_batch(["<think>look</think>\n<answer>\n\\boxed{left}\n</answer>"], ["left"])
        batch["data_source"] = ["visual"]  # the built-in task the recipes train on
        batch["turns"] = [
            [{"role": "assistant", "text": "", "tool_call": {"name": "python", "arguments": {}}}]
        ]
        batch["tool_images"] = [[]]
        manager = RewardManager.of(cfg.worker.reward, max_response_length=cfg.data.max_response_length)
        try:
            out = manager.score(batch)
        finally:
            manager.close()
    finally:
        server.stop()
    assert out["scores"].tolist() == pytest.approx([overall])
    if reward == "builtin:codev":  # the recipe grades the built-in visual task by the visual-search rubric
        assert out["reward_info"][0]["rubric"] == "search"
        assert server.chat_requests[-1]["messages"][0]["content"] == codev.RUBRICS["search"]


def test_machine_checks_warn_only_goes_with_print_config(capsys):
    assert main(["train", "--machine-checks=warn"]) == 2
    assert "only checks a config (with --print-config)" in capsys.readouterr().err


def test_a_wrong_choice_lists_the_choices_and_the_key_it_belongs_to():
    (problem,) = problems_of(["algorithm.adv_estimator=gspo"])
    assert (
        "algorithm.adv_estimator (command-line override 'algorithm.adv_estimator=gspo'): expected one of "
        in (problem)
    )
    assert "gae, grpo, rloo," in problem and "grpo_passk or loo_std, got 'gspo' (str)" in problem
    assert problem.endswith("; gspo is a choice of worker.actor.loss_type")
    (problem,) = problems_of(["worker.actor.loss_agg_mode=mean"])
    assert "seq-mean-token-sum-norm or null, got 'mean' (str)" in problem


def test_easyr1s_estimator_names_say_where_they_belong_in_rlstack():
    """The EasyR1 seed lists GSPO, CISPO and REINFORCE++ under algorithm.adv_estimator ("{grpo, gae,
    reinforce, ...}"): gspo and cispo are loss types here, reinforce is reinforce_plus_plus."""
    for name in ("gspo", "cispo"):
        (problem,) = problems_of([f"algorithm.adv_estimator={name}"])
        assert problem.endswith(f"got '{name}' (str); {name} is a choice of worker.actor.loss_type")
    for name in ("reinforce", "reinforce++"):
        (problem,) = problems_of([f"algorithm.adv_estimator={name}"])
        assert f"got '{name}' (str); REINFORCE++" in problem
        assert "is reinforce_plus_plus here" in problem
    (problem,) = problems_of(["algorithm.adv_estimator=dapo"])
    assert "DAPO is adv_estimator=grpo with algorithm.online_filtering=true" in problem
    (problem,) = problems_of(["algorithm.adv_estimator=ppo"])
    assert problem.endswith("PPO with a critic is adv_estimator=gae (examples/recipes/ppo_gae.yaml)")


# ------------------------------------------------------------------------------ the engine: auto


def test_the_engine_is_vllm_where_it_can_be(monkeypatch):
    from rlstack.config import machine

    monkeypatch.setattr(
        machine.importlib.util, "find_spec", lambda name: object() if name == "vllm" else None
    )
    assert machine.engine_choice("cuda") == ("vllm", "vLLM is installed and the run is on CUDA")
    name, why = machine.engine_choice("cpu")
    assert name == "hf" and "worker.rollout.name=vllm uses it" in why
    monkeypatch.setattr(machine.importlib.util, "find_spec", lambda name: None)
    name, why = machine.engine_choice("cuda")
    assert name == "hf" and "vLLM is not installed" in why


def test_auto_is_resolved_at_load_and_said_when_the_run_starts(monkeypatch):
    from rlstack.config import load as load_module
    from rlstack.config import machine

    cfg = load_config([])
    assert cfg.worker.rollout.name == "hf" and "the run is on cpu" in cfg.worker.rollout.auto_reason
    assert "name: hf" in to_yaml(cfg) and "auto_reason" not in to_yaml(cfg)
    assert load_config(["worker.rollout.name=hf"]).worker.rollout.auto_reason == ""
    monkeypatch.setattr(
        machine.importlib.util, "find_spec", lambda name: object() if name == "vllm" else None
    )
    monkeypatch.setattr(load_module, "resolve_device", lambda name: "cuda")
    picked = load_config(["trainer.device=cpu"])  # the device probe is patched: what a GPU machine sees
    d = picked.data  # and the vLLM settings derived from it are filled in
    assert picked.worker.rollout.name == "vllm"
    assert picked.worker.rollout.max_model_len == d.max_prompt_length + d.max_response_length


def test_tensor_parallel_with_auto_picking_hf_is_one_problem_with_both_ways_out():
    (problem,) = problems_of(["worker.rollout.tensor_parallel_size=2", "trainer.n_gpus_per_node=2"])
    assert "needs the vLLM engine, but worker.rollout.name=auto picks hf here" in problem
    assert "pip install 'rlstack[vllm]'" in problem and "tensor_parallel_size=1" in problem


def test_secrets_are_masked_where_written_and_a_mask_loaded_again_names_the_key(tmp_path: Path, capsys):
    overrides = [
        "worker.reward.judge.api_key=sk-secret",
        "trainer.env_vars={HF_TOKEN: hf_secret, AWS_SECRET_ACCESS_KEY: aws_secret, TOKENIZERS_PARALLELISM: 'false'}",
        "worker.reward.reward_function_kwargs={password: pw_secret, answer_key: answer, end_token: </s>}",
        "worker.rollout.agent.tools=[{import_path: builtin:python, api_key: tool_secret, timeout: 5}]",
    ]
    written = to_yaml(load_config(overrides))
    assert "secret" not in written.replace("AWS_SECRET", "")
    saved = yaml.safe_load(written)
    assert saved["trainer"]["env_vars"] == {
        "HF_TOKEN": "***",
        "AWS_SECRET_ACCESS_KEY": "***",
        "TOKENIZERS_PARALLELISM": "false",
    }
    kwargs = saved["worker"]["reward"]["reward_function_kwargs"]
    assert kwargs == {"password": "***", "answer_key": "answer", "end_token": "</s>"}  # a token, not a secret
    assert saved["worker"]["rollout"]["agent"]["tools"] == [
        {"import_path": "builtin:python", "api_key": "***", "timeout": 5}
    ]
    assert saved["data"]["answer_key"] == "answer" and saved["worker"]["reward"]["judge"]["max_tokens"] > 0
    assert main(["train", *overrides, "--print-config"]) == 0
    assert "sk-secret" not in capsys.readouterr().out

    path = tmp_path / "config.yaml"  # a run's config.yaml, given back as a config
    path.write_text(written)
    with pytest.raises(ConfigError) as e:
        load_config([f"config={path}"])
    said = str(e.value)
    assert "worker.reward.judge.api_key is '***'" in said and "OPENAI_API_KEY" in said and str(path) in said
    assert "trainer.env_vars.HF_TOKEN is '***'" in said and "answer_key" not in said
    assert "worker.rollout.agent.tools[0].api_key is '***'" in said and "end_token" not in said
    cfg = load_config(
        [
            f"config={path}",
            "worker.reward.judge.api_key=sk-again",
            "trainer.env_vars={HF_TOKEN: a, AWS_SECRET_ACCESS_KEY: b}",
            "worker.reward.reward_function_kwargs.password=c",
            "worker.rollout.agent.tools=[{import_path: builtin:python, api_key: d}]",
        ]
    )
    assert cfg.worker.reward.judge.api_key == "sk-again"


def test_how_an_engine_is_split_is_checked_on_a_laptop_too():
    """--machine-checks=warn lets a GPU node's config load here with what this machine lacks as warnings;
    a split engine that could run on no machine (ranks that do not divide, rollout apart, async) stays an
    error there."""
    tp = ["worker.rollout.tensor_parallel_size=2", "trainer.n_gpus_per_node=2"]
    for name in ("vllm", "auto"):
        engine = f"worker.rollout.name={name}"
        assert load_config([engine, *tp], machine_checks="warn").worker.rollout.tensor_parallel_size == 2
        for override, expected in {
            "trainer.n_gpus_per_node=3": "n_gpus_per_node must be a multiple of it",
            "worker.rollout.colocated=false": "a split engine runs on the policy's ranks",
            "algorithm.async_grpo.enabled=true": "the asynchronous producer does not keep",
        }.items():
            with pytest.raises(ConfigError, match=expected):
                load_config([engine, *tp, override], machine_checks="warn")


def test_easyr1s_adamw_bf16_is_a_strategy_of_the_policy_and_the_critic():
    cfg = load_config(["worker.actor.optim.strategy=adamw_bf16", "worker.critic.optim.strategy=adamw_bf16"])
    assert cfg.worker.actor.optim.strategy == cfg.worker.critic.optim.strategy == "adamw_bf16"
    (problem,) = problems_of(["worker.actor.optim.strategy=adam8bit"])
    assert "expected one of adamw or adamw_bf16, got 'adam8bit'" in problem, problem


def test_a_missing_reward_file_names_where_it_was_looked_for_and_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (problem,) = problems_of(["worker.reward.reward_function=examples/reward_function/addition.py:score"])
    assert f"looked for {tmp_path / 'examples/reward_function/addition.py'}" in problem
    assert f"relative paths start at the working directory {tmp_path}" in problem
    assert "path/to/file.py:function_name" in problem


def test_a_key_set_twice_in_a_yaml_file_is_a_problem_naming_both_lines(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  max_steps: 1\n  save_freq: 2\n  max_steps: 2\nworker:\n  rollout: {n: 4}\n")
    (problem,) = problems_of([f"config={path}"])
    assert (
        problem == f"config file {path}, line 4: trainer.max_steps is set twice (first at line 2); keep one"
    )
    path.write_text("trainer:\n  max_steps: 1\ndata:\n  max_steps: 1\n")  # the same name in two sections
    assert not any("is set twice" in p for p in problems_of([f"config={path}"]))


def test_a_config_that_is_a_directory_says_so_and_lists_its_yaml_files(tmp_path: Path):
    (tmp_path / "run.yaml").write_text("trainer: {max_steps: 1}\n")
    (problem,) = problems_of([f"config={tmp_path}"])
    assert (
        problem
        == f"config={tmp_path} is a directory: name a YAML file in it (config=path/to/file.yaml); it holds run.yaml"
    )


def test_a_config_on_its_own_rows_gets_none_of_the_demos_defaults(tmp_path, capsys):
    """The tiny demo's lengths, reward and validation split do not leak into a run on the user's rows."""
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"problem": "1+1=", "answer": "2"}\n')
    problems = problems_of([f"data.train_files={rows}"])
    for key in ("data.max_prompt_length", "data.max_response_length", "worker.reward.reward_function"):
        assert any(
            p.startswith(f"{key} is not set for data.train_files=") and "tiny demo's" in p for p in problems
        )
    cfg = load_config([f"data.train_files={rows}", *OWN_ROWS])
    assert cfg.data.val_files == ""  # not builtin:addition@test
    assert (
        "no validation rows (the default, builtin:addition@test, is the tiny demo's)"
        in capsys.readouterr().err
    )
    # supervised fine-tuning scores nothing: no reward to name
    sft = load_config([f"data.train_files={rows}", *OWN_ROWS[:2]], rewards=False)
    assert sft.worker.reward.reward_function == "builtin:exact_match"
    # the built-in tasks keep the demo's defaults, which are theirs
    assert load_config(["data.train_files=builtin:addition@train"]).data.val_files == "builtin:addition@test"


def test_a_config_naming_its_own_model_and_no_data_says_it_trains_on_the_demos_task(tiny_model_dir, capsys):
    model = f"worker.actor.model.model_path={tiny_model_dir}"
    load_config([model, "data.max_response_length=32"])
    err = capsys.readouterr().err
    assert (
        f"data.train_files is not set: worker.actor.model.model_path='{tiny_model_dir}' trains on the tiny demo"
        in err
    )
    assert "data.max_prompt_length=64 tokens, worker.reward.reward_function=builtin:exact_match;" in err
    assert "max_response_length" not in err  # set: not the demo's
    load_config([model], rewards=False)  # supervised: no reward
    assert (
        "max_response_length=16 tokens;" in (err := capsys.readouterr().err) and "reward_function" not in err
    )
    for quiet in ([model, "data.train_files=builtin:addition@train"], ["trainer.max_steps=1"]):
        load_config(quiet)  # named data, or the built-in model: the demo, as asked
        assert "data.train_files is not set" not in capsys.readouterr().err
    load_config([model], trains=False)  # rlstack eval reads no training rows
    assert "data.train_files is not set" not in capsys.readouterr().err
