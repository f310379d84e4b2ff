"""OmegaConf interpolations in configs (EasyR1's and NeMo RL's files use them): `${oc.env:VAR}`,
`${oc.env:VAR,default}` and `${section.key}` resolved at load, after the file and the command line are
merged and before the values are converted and validated, with problems that name the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml
from config_files import problems_of, write_yaml

import rlstack.config.tree as tree
from rlstack.config import load_config, to_yaml
from rlstack.config.compat import easyr1
from rlstack.config.compat.easyr1_fields import EASYR1_FIELDS
from rlstack.config.schema import Config


def test_an_environment_variable_with_and_without_a_default(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RLSTACK_TEST_OUT", str(tmp_path))
    monkeypatch.delenv("RLSTACK_TEST_PROJECT", raising=False)
    path = write_yaml(
        tmp_path / "run.yaml",
        """
        trainer:
          output_dir: ${oc.env:RLSTACK_TEST_OUT}/runs
          project_name: ${oc.env:RLSTACK_TEST_PROJECT,easy}
          experiment_name: ${oc.env:RLSTACK_TEST_PROJECT,null}-cost $5 and $HOME
        """,
    )
    cfg = load_config([f"config={path}"])
    assert cfg.trainer.output_dir == f"{tmp_path}/runs"
    assert cfg.trainer.project_name == "easy"  # the default, the variable being unset
    assert cfg.trainer.experiment_name == "None-cost $5 and $HOME"  # a `$` without `{` stays as it is
    monkeypatch.setenv("RLSTACK_TEST_PROJECT", "from_env")
    assert load_config([f"config={path}"]).trainer.project_name == "from_env"


def test_an_unset_environment_variable_without_a_default_names_the_key_and_the_line(
    tmp_path: Path, monkeypatch
):
    monkeypatch.delenv("RLSTACK_TEST_DIR", raising=False)
    path = write_yaml(
        tmp_path / "run.yaml", "trainer:\n  max_steps: 1\n  output_dir: ${oc.env:RLSTACK_TEST_DIR}\n"
    )
    (problem,) = problems_of([f"config={path}"])
    assert problem == (
        f"trainer.output_dir ({path}, line 3): ${{oc.env:RLSTACK_TEST_DIR}}: the environment variable "
        "RLSTACK_TEST_DIR is not set; set it or give a default ${oc.env:RLSTACK_TEST_DIR,default}"
    )


def test_a_reference_to_another_section_gives_its_value_with_its_type(tmp_path: Path):
    path = write_yaml(
        tmp_path / "run.yaml",
        """
        data:
          max_prompt_length: 300
        worker:
          rollout:
            max_num_batched_tokens: ${data.max_prompt_length}
            max_model_len: ${data.max_response_length}
        trainer:
          project_name: easy
          experiment_name: ${trainer.project_name}_${data.max_prompt_length}
          max_steps: ${.save_freq}
          save_freq: 3
        """,
    )
    cfg = load_config([f"config={path}"])
    assert cfg.worker.rollout.max_num_batched_tokens == 300
    assert type(cfg.worker.rollout.max_num_batched_tokens) is int  # an int field filled by reference
    assert (
        cfg.worker.rollout.max_model_len == cfg.data.max_response_length == 16
    )  # a default, unset in the file
    assert cfg.trainer.experiment_name == "easy_300"
    assert cfg.trainer.max_steps == 3  # relative: the same section
    saved = yaml.safe_load(to_yaml(cfg))  # config.yaml (and what a resume compares) holds the values
    assert saved["worker"]["rollout"]["max_num_batched_tokens"] == 300
    assert saved["trainer"]["experiment_name"] == "easy_300"


def test_a_command_line_override_changes_what_a_reference_gives(tmp_path: Path):
    path = write_yaml(
        tmp_path / "run.yaml",
        """
        data:
          max_prompt_length: 300
        worker:
          rollout:
            max_num_batched_tokens: ${data.max_prompt_length}
        """,
    )
    cfg = load_config([f"config={path}", "data.max_prompt_length=500"])
    assert cfg.worker.rollout.max_num_batched_tokens == 500


def test_an_interpolation_on_the_command_line(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RLSTACK_TEST_STEPS", "7")
    cfg = load_config(
        [
            "data.max_prompt_length=128",
            "worker.rollout.max_num_batched_tokens=${data.max_prompt_length}",
            "trainer.max_steps=${oc.env:RLSTACK_TEST_STEPS}",  # text from the environment, read as an int
            r"trainer.experiment_name=\${literal}",  # escaped: the text itself
        ]
    )
    assert cfg.worker.rollout.max_num_batched_tokens == 128
    assert cfg.trainer.max_steps == 7 and type(cfg.trainer.max_steps) is int
    assert cfg.trainer.experiment_name == "${literal}"
    monkeypatch.setenv("RLSTACK_TEST_STEPS", "many")
    (problem,) = problems_of(["trainer.max_steps=${oc.env:RLSTACK_TEST_STEPS}"])
    assert problem == (
        "trainer.max_steps (command-line override 'trainer.max_steps=${oc.env:RLSTACK_TEST_STEPS}'): expected "
        "int | None, got 'many' (str) from ${oc.env:RLSTACK_TEST_STEPS}"
    )


def test_an_unknown_reference_names_the_key_and_the_closest_one(tmp_path: Path):
    path = write_yaml(
        tmp_path / "run.yaml",
        """
        worker:
          rollout:
            max_num_batched_tokens: ${data.max_promt_length}
            max_model_len: ${max_response_length}
        """,
    )
    first, second = problems_of([f"config={path}"])  # said once each, not again as a wrong type
    assert first == (
        f"worker.rollout.max_num_batched_tokens ({path}, line 3): ${{data.max_promt_length}}: "
        "data.max_promt_length is not a key of the config; did you mean ${data.max_prompt_length}?"
    )
    assert second.startswith(f"worker.rollout.max_model_len ({path}, line 4): ${{max_response_length}}: ")
    assert second.endswith("did you mean ${data.max_response_length}?")


def test_a_cycle_of_references_is_named(tmp_path: Path):
    path = write_yaml(
        tmp_path / "run.yaml",
        "trainer:\n  project_name: ${trainer.experiment_name}\n  experiment_name: ${trainer.project_name}\n",
    )
    first, second = problems_of([f"config={path}"])
    assert first == (
        f"trainer.project_name ({path}, line 2): ${{trainer.experiment_name}}: the interpolations refer to "
        "each other in a cycle (trainer.project_name -> trainer.experiment_name -> trainer.project_name); "
        "give one of them a value"
    )
    assert second.startswith(f"trainer.experiment_name ({path}, line 3)")


def test_a_broken_interpolation_and_an_unknown_resolver_are_problems(tmp_path: Path):
    path = write_yaml(tmp_path / "run.yaml", "trainer:\n  project_name: a${b\n")
    on_line, in_file, unknown = problems_of(  # the command line is read first
        [f"config={path}", "trainer.experiment_name=a${b", "trainer.output_dir=${foo:1}"]
    )
    assert in_file.startswith(f"trainer.project_name ({path}, line 2): 'a${{b' is not a valid interpolation")
    assert on_line.startswith("could not parse the override 'trainer.experiment_name=a${b'")
    assert all(r"\${ for a literal ${" in p for p in (in_file, on_line))
    assert unknown.startswith(
        "trainer.output_dir (command-line override 'trainer.output_dir=${foo:1}'): ${foo:1}: there is no "
        "resolver foo"
    )


def test_an_api_key_from_the_environment_is_masked_where_written(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    path = write_yaml(
        tmp_path / "run.yaml",
        """
        worker:
          reward:
            judge:
              api_key: ${oc.env:OPENAI_API_KEY}
        trainer:
          env_vars:
            HF_TOKEN: ${worker.reward.judge.api_key}
        """,
    )
    cfg = load_config([f"config={path}"])
    assert cfg.worker.reward.judge.api_key == "sk-from-the-environment"  # the run has it
    written = to_yaml(cfg)
    assert "sk-from-the-environment" not in written
    saved = yaml.safe_load(written)
    assert saved["worker"]["reward"]["judge"]["api_key"] == "***"
    assert saved["trainer"]["env_vars"] == {"HF_TOKEN": "***"}


def test_a_secret_from_the_environment_under_a_key_that_is_not_masked_is_refused(tmp_path: Path, monkeypatch):
    """config.yaml masks by the key's name: a secret interpolated (even through another key) under a name
    that does not mark one would be written in clear."""
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-from-the-environment")
    path = write_yaml(
        tmp_path / "run.yaml",
        """
        trainer:
          env_vars:
            SERVICE_AUTH_TOKEN: ${oc.env:MY_SERVICE_TOKEN}
            SERVICE_HEADER: Bearer ${.SERVICE_AUTH_TOKEN}
        """,
    )
    (problem,) = problems_of([f"config={path}"])
    assert problem.startswith(
        f"trainer.env_vars.SERVICE_HEADER ({path}, line 4): Bearer ${{.SERVICE_AUTH_TOKEN}} puts the value "
        "of MY_SERVICE_TOKEN (a secret) under a key whose name does not mark a secret"
    )
    assert "tok-from-the-environment" not in problem
    (problem,) = problems_of(
        [
            "worker.reward.judge.api_key=sk-in-the-file",
            "trainer.env_vars.AUTH=Key ${worker.reward.judge.api_key}",
        ]
    )
    assert "puts the value of worker.reward.judge.api_key (a secret) under a key" in problem


def test_a_nemo_rl_multiplication_resolves(tmp_path: Path):
    """NeMo RL's configs use its `${mul:a,b}` resolver (dynamic batching's token budgets)."""
    cfg = load_config(
        [
            "data.max_prompt_length=32",
            "worker.rollout.max_num_batched_tokens=${mul:${data.max_prompt_length},4}",
        ]
    )
    assert cfg.worker.rollout.max_num_batched_tokens == 128


EASYR1_FILE = """
algorithm:
  adv_estimator: reinforce_plus_plus
  disable_kl: true  # a key only EasyR1 has: this is EasyR1's file
worker:
  rollout:
    max_num_batched_tokens: ${data.max_response_length}
    val_n: ${worker.rollout.n}
trainer:
  experiment_name: n${worker.rollout.n}_len${data.max_response_length}
"""
EASYR1_NAMES = [
    "data.train_files=builtin:addition@train",
    "data.prompt_key=problem",
    "worker.actor.model.model_path=builtin:tiny-qwen2",
    "worker.reward.reward_function=builtin:exact_match",
]
"""What EasyR1 has no default for (rlstack asks an EasyR1 file for them), and the built-in task's prompt field."""


def test_a_reference_in_an_easyr1_file_to_a_key_it_leaves_out_reads_easyr1s_default(tmp_path: Path):
    """EasyR1 merges its dataclass defaults with the file, then resolves: a key the file leaves out is
    EasyR1's default there (n 1, max_response_length 512), which is also what the run takes here, not
    rlstack's demo's (n 8, 16 tokens)."""
    path = write_yaml(tmp_path / "easyr1.yaml", EASYR1_FILE)
    cfg = load_config([f"config={path}", *EASYR1_NAMES])
    r = cfg.worker.rollout
    assert (r.n, cfg.data.max_response_length) == (1, 512)  # EasyR1's defaults, as the file leaves them out
    assert (r.val_n, r.max_num_batched_tokens, cfg.trainer.experiment_name) == (1, 512, "n1_len512")
    # the command line still wins over both
    cfg = load_config([f"config={path}", *EASYR1_NAMES, "worker.rollout.n=4"])
    assert (cfg.worker.rollout.val_n, cfg.trainer.experiment_name) == (4, "n4_len512")


def test_a_reference_in_an_easyr1_file_to_a_key_that_is_nowhere_names_the_file_the_key_and_the_target(
    tmp_path: Path,
):
    path = write_yaml(
        tmp_path / "easyr1.yaml",
        EASYR1_FILE.replace("${worker.rollout.n}\n", "${worker.rollout.num_samples}\n", 1)
        + "  project_name: ${trainer.no_such_key_anywhere}\n",
    )
    first, second = problems_of([f"config={path}", *EASYR1_NAMES])  # said once each
    assert first == (
        f"worker.rollout.val_n ({path}, line 7): ${{worker.rollout.num_samples}}: worker.rollout.num_samples is "
        "not a key of the config; did you mean ${worker.rollout.name}?"
    )
    assert second == (
        f"trainer.project_name ({path}, line 10): ${{trainer.no_such_key_anywhere}}: "
        "trainer.no_such_key_anywhere is not a key of the config; a reference is ${section.key}, from the top"
    )


EASYR1_ONLY_REFERENCES = """
worker:
  actor:
    offload:
      offload_params: false  # a key only EasyR1 has: this is EasyR1's file
algorithm:
  adv_estimator: reinforce_plus_plus
  max_try_make_batch: ${trainer.max_try_make_batch}
trainer:
  experiment_name: kl_off_${algorithm.disable_kl}_img${worker.rollout.limit_images}_${worker.rollout.dtype}_${data.video_key}
  project_name: shard${worker.actor.fsdp.fsdp_size}_${worker.actor.fsdp.enable_full_shard}_${worker.reward.num_cpus}
"""


def test_a_reference_in_an_easyr1_file_to_an_easyr1_only_key_it_leaves_out_reads_easyr1s_default(
    tmp_path: Path,
):
    """Keys rlstack has no key for (`disable_kl`, `limit_images`, `trainer.max_try_make_batch`, FSDP's
    `fsdp_size`, the rollout's `dtype`, ...) are still fields of EasyR1's config, at their defaults there when
    the file leaves them out: a reference reads that default, with its type."""
    path = write_yaml(tmp_path / "easyr1.yaml", EASYR1_ONLY_REFERENCES)
    cfg = load_config([f"config={path}", *EASYR1_NAMES])
    assert cfg.algorithm.max_try_make_batch == 20  # EasyR1's TrainerConfig.max_try_make_batch, an int
    assert cfg.trainer.experiment_name == "kl_off_False_img0_bf16_videos"
    assert cfg.trainer.project_name == "shard-1_True_1"
    # the file's own value, where it sets the key, as before
    path = write_yaml(
        tmp_path / "set.yaml",
        EASYR1_ONLY_REFERENCES.replace("algorithm:\n", "algorithm:\n  disable_kl: true\n"),
    )
    assert (
        load_config([f"config={path}", *EASYR1_NAMES]).trainer.experiment_name
        == "kl_off_True_img0_bf16_videos"
    )


def test_a_reference_to_an_easyr1_only_key_outside_an_easyr1_file_is_no_key(tmp_path: Path):
    """Only an EasyR1 file (one holding keys only EasyR1 has) takes EasyR1's defaults; rlstack's own config
    has no algorithm.disable_kl."""
    path = write_yaml(tmp_path / "run.yaml", "trainer:\n  experiment_name: kl${algorithm.disable_kl}\n")
    (problem,) = problems_of([f"config={path}"])
    assert problem.startswith(
        f"trainer.experiment_name ({path}, line 2): kl${{algorithm.disable_kl}}: algorithm.disable_kl is not a "
        "key of the config; did you mean"
    )


def test_a_misspelt_easyr1_only_key_in_an_easyr1_file_is_a_problem_naming_easyr1s_key(tmp_path: Path):
    path = write_yaml(
        tmp_path / "easyr1.yaml",
        EASYR1_ONLY_REFERENCES.replace("${algorithm.disable_kl}", "${algorithm.disable_kll}"),
    )
    (problem,) = problems_of([f"config={path}", *EASYR1_NAMES])
    assert problem.startswith(f"trainer.experiment_name ({path}, line 9): kl_off_${{algorithm.disable_kll}}")
    assert problem.endswith(
        "algorithm.disable_kll is not a key of the config; did you mean ${algorithm.disable_kl}?"
    )


EASYR1_SPELLINGS = """
algorithm:
  adv_estimator: reinforce_plus_plus
  disable_kl: true  # a key only EasyR1 has: this is EasyR1's file
trainer:
  experiment_name: mp_${worker.actor.fsdp.mp_param_dtype}_${worker.actor.loss_type}_${worker.actor.model.lora.target_modules}
"""


def test_a_reference_in_an_easyr1_file_reads_easyr1s_spelling_and_the_run_rlstacks(tmp_path: Path):
    """EasyR1 spells some values otherwise (`bf16`, loss_type `default`, LoRA's modules as one string): a
    reference in an EasyR1 file gives EasyR1's spelling, at EasyR1's default where the file leaves the key out,
    as EasyR1 would; the run reads the same settings in rlstack's spelling."""
    path = write_yaml(tmp_path / "easyr1.yaml", EASYR1_SPELLINGS)
    cfg = load_config([f"config={path}", *EASYR1_NAMES])
    assert cfg.trainer.experiment_name == "mp_bf16_default_all-linear"
    a = cfg.worker.actor
    assert (a.fsdp.mp_param_dtype, a.loss_type, a.model.lora.target_modules) == (
        "bfloat16",
        "vanilla",
        ["all-linear"],
    )
    # the file's own values, in EasyR1's spelling, are what a reference gives too
    path = write_yaml(
        tmp_path / "set.yaml",
        EASYR1_SPELLINGS + "worker:\n  actor:\n    fsdp:\n      mp_param_dtype: fp16\n",
    )
    cfg = load_config([f"config={path}", *EASYR1_NAMES])
    assert (cfg.trainer.experiment_name, cfg.worker.actor.fsdp.mp_param_dtype) == (
        "mp_fp16_default_all-linear",
        "float16",
    )


def test_a_reference_in_rlstacks_own_file_reads_rlstacks_spelling(tmp_path: Path):
    path = write_yaml(
        tmp_path / "run.yaml",
        "worker:\n  actor:\n    fsdp:\n      mp_param_dtype: bfloat16\n"
        "trainer:\n  experiment_name: mp_${worker.actor.fsdp.mp_param_dtype}_${worker.actor.loss_type}\n",
    )
    assert load_config([f"config={path}"]).trainer.experiment_name == "mp_bfloat16_vanilla"


def test_easyr1s_spellings_of_rlstacks_defaults_are_the_same_settings():
    """What a reference in an EasyR1 file reads for rlstack's keys EasyR1 spells otherwise is rlstack's own
    default, respelled (else the run and the reference would disagree)."""
    ours = dataclasses.asdict(Config())
    assert {k: easyr1.rlstack_spelling(k, v) for k, v in easyr1.EASYR1_SPELLED.items()} == {
        k: tree.get(ours, k) for k in easyr1.EASYR1_SPELLED
    }


def test_every_easyr1_key_rlstack_reads_has_easyr1s_default_and_none_is_rlstacks_own():
    """The table a reference in an EasyR1 file reads: every EasyR1 key rlstack moves, accepts or reads by its
    own rule is in it; none of rlstack's keys is (rlstack's value, or EASYR1_DEFAULTS', is what the run
    takes and what a reference reads)."""
    assert [k for k in (*easyr1.FOREIGN, *easyr1.OWN_RULES) if k not in EASYR1_FIELDS] == []
    ours = dataclasses.asdict(Config())
    assert [k for k in EASYR1_FIELDS if tree.get(ours, k) is not tree.MISSING] == []
    assert (EASYR1_FIELDS["algorithm.disable_kl"], EASYR1_FIELDS["worker.rollout.limit_images"]) == (False, 0)
