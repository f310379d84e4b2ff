"""The seed systems' own config files as they ship them (tests/fixtures/easyr1/, .../nemo_rl/): each loads with
only its paths replaced, and every upstream key means there what it means upstream, key by key: read
under the same name with the same value, moved to rlstack's name, or named in a note that says why it
changes nothing here. Nothing is dropped silently."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from config_files import launch_arguments, load_with_notes, write_yaml

import rlstack.config.tree as tree
from rlstack.config import ConfigError, load_config

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EASYR1 = FIXTURES / "easyr1"
EASYR1_PATHS = [
    "worker.actor.model.model_path=builtin:tiny-qwen2",
    f"data.train_files={FIXTURES / 'formats' / 'gsm8k.jsonl'}",
    f"data.val_files={FIXTURES / 'formats' / 'gsm8k.jsonl'}",
    f"data.format_prompt={EASYR1 / 'format_prompt' / 'math.jinja'}",
    f"worker.reward.reward_function={EASYR1 / 'reward_function' / 'math.py'}:compute_score",
]
"""What a user replaces: the model and data (the Hub is not reachable here) and the files it names relative
to EasyR1's checkout."""

EASYR1_MOVED: dict[str, tuple[str, Any]] = {
    "data.override_chat_template": ("worker.actor.model.chat_template", None),
    "worker.actor.model.freeze_vision_tower": ("worker.actor.freeze_vision_tower", False),
    "worker.actor.fsdp.enable_cpu_offload": ("worker.actor.fsdp.offload_params", False),
    "worker.actor.model.lora.target_modules": ("worker.actor.model.lora.target_modules", ["all-linear"]),
    "worker.rollout.val_override_config.temperature": ("worker.rollout.val_temperature", 0.6),
    "worker.rollout.val_override_config.top_p": ("worker.rollout.val_top_p", 0.95),
    "worker.rollout.val_override_config.n": ("worker.rollout.val_n", 1),
    "trainer.max_try_make_batch": ("algorithm.max_try_make_batch", 20),
}
"""EasyR1's keys that rlstack names otherwise (or spells otherwise), with the value they must resolve to."""


def _leaves(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out |= _leaves(v, key + ".") if isinstance(v, dict) and v else {key: v}
    return out


def _get(obj: Any, key: str) -> Any:
    for part in key.split("."):
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            return KeyError
        obj = getattr(obj, part)
    return obj


def _every_key_kept(shipped: dict, cfg: Any, notes: list[str], paths: list[str], moved: dict) -> None:
    """Each upstream key of an EasyR1-layout file: replaced (a path), moved (to `moved`'s key and value, with a
    note), named in a note (inert here, or read by its own rule), or rlstack's key with the same value."""
    replaced = {arg.split("=", 1)[0] for arg in paths}
    unaccounted = []
    for key, value in _leaves(shipped).items():
        if key in replaced:
            continue
        if key in moved:
            to, want = moved[key]
            assert _get(cfg, to) == want, (key, to, _get(cfg, to))
            assert any(n.startswith(key) for n in notes), f"{key}: moved without a note"
        elif any(
            key in n for n in notes
        ):  # inert here, or read with its own rule (disable_kl over use_kl_loss): said
            continue
        elif _get(cfg, key) is KeyError:
            unaccounted.append(key)
        else:
            got = _get(cfg, key)
            assert got == value or (isinstance(value, str) and str(got) == value), (key, value, got)
    assert unaccounted == [], f"upstream keys neither read, moved nor noted: {unaccounted}"


def test_easyr1_config_as_shipped_loads_and_every_key_keeps_its_meaning(caplog):
    shipped = yaml.safe_load((EASYR1 / "config.yaml").read_text())
    cfg, notes = load_with_notes([f"config={EASYR1 / 'config.yaml'}", *EASYR1_PATHS], caplog)
    _every_key_kept(shipped, cfg, notes, EASYR1_PATHS, EASYR1_MOVED)
    # what the file means in EasyR1, spelled out
    a, alg = cfg.worker.actor, cfg.algorithm
    assert (alg.use_kl_loss, alg.use_kl_in_reward, alg.kl_coef, alg.kl_penalty) == (
        True,
        False,
        0.01,
        "low_var_kl",
    )
    assert (cfg.data.rollout_batch_size, a.global_batch_size, cfg.worker.rollout.n) == (512, 128, 5)
    assert (cfg.trainer.total_epochs, cfg.trainer.save_limit, cfg.trainer.val_freq) == (15, 3, 5)
    assert any("trainer.save_limit=3" in n and "best by the validation reward" in n for n in notes)
    assert a.loss_agg_mode in (None, "token-mean") and a.loss_type == "vanilla"
    assert a.model.lora.exclude_modules == ".*visual.*"
    # the one key it leaves out takes EasyR1's default, not the demo's
    assert a.clip_ratio_high == 0.3
    assert any("worker.actor.clip_ratio_high=0.3" in n for n in notes)
    # dynamic batching packs a pass as EasyR1's: micro-batch x the padded length, 2048 + 2048
    budgets = (a.max_token_len_per_device_for_update, a.max_token_len_per_device_for_experience)
    assert (*budgets, cfg.worker.ref.max_token_len_per_device_for_experience) == (
        1 * 4096,
        2 * 4096,
        2 * 4096,
    )


@pytest.mark.parametrize(
    ("left_out", "key", "easyr1_default"),
    [
        ("max_response_length", "data.max_response_length", 512),
        ("max_prompt_length", "data.max_prompt_length", 512),
        ("rollout_batch_size", "data.rollout_batch_size", 512),
        ("val_files", "data.val_files", ""),
        ("total_epochs", "trainer.total_epochs", 15),
        ("alpha", "worker.actor.model.lora.alpha", 64),
    ],
)
def test_keys_an_easyr1_file_leaves_out_take_easyr1_defaults_not_the_demos(
    tmp_path, caplog, left_out, key, easyr1_default
):
    text = (EASYR1 / "config.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.strip().startswith(f"{left_out}:")]
    assert len(lines) == len(text.splitlines()) - 1
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines))
    args = [f"config={path}", *(a for a in EASYR1_PATHS if not a.startswith(key + "="))]
    cfg, notes = load_with_notes(args, caplog)
    assert _get(cfg, key) == easyr1_default
    assert any(f"{key}={easyr1_default!r}" in n for n in notes)


def test_an_easyr1_file_without_kl_keys_puts_easyr1s_kl_in_the_reward(tmp_path, caplog):
    text = (EASYR1 / "config.yaml").read_text()
    drop = ("disable_kl:", "use_kl_loss:", "kl_penalty:", "kl_coef:")
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(line for line in text.splitlines() if not line.strip().startswith(drop)))
    cfg, notes = load_with_notes([f"config={path}", *EASYR1_PATHS], caplog)
    alg = cfg.algorithm
    assert (alg.use_kl_in_reward, alg.use_kl_loss, alg.kl_coef, alg.kl_penalty) == (True, False, 1e-3, "kl")
    assert any("EasyR1's default" in n and "use_kl_in_reward=true" in n for n in notes)


@pytest.mark.parametrize(
    ("kl", "on"),
    [("use_kl_loss: true", (True, False)), ("disable_kl: true", (False, False))],
)
def test_an_easyr1_file_without_kl_coef_takes_easyr1s_whatever_its_kl(tmp_path, caplog, kl, on):
    """EasyR1's kl_coef (1e-3) and kl_penalty (kl) are its AlgorithmConfig's, copied to the actor for the KL
    loss too: a file that leaves them out means them with use_kl_loss, not rlstack's 0.01 / low_var_kl."""
    text = (EASYR1 / "config.yaml").read_text()
    drop = ("disable_kl:", "use_kl_loss:", "kl_penalty:", "kl_coef:")
    lines = [line for line in text.splitlines() if not line.strip().startswith(drop)]
    at = lines.index("algorithm:") + 1
    path = tmp_path / "config.yaml"
    path.write_text("\n".join([*lines[:at], f"  {kl}", *lines[at:]]))
    cfg, notes = load_with_notes([f"config={path}", *EASYR1_PATHS], caplog)
    alg = cfg.algorithm
    assert (alg.use_kl_loss, alg.use_kl_in_reward) == on
    assert (alg.kl_coef, alg.kl_penalty) == (1e-3, "kl")
    assert any("algorithm.kl_coef=0.001" in n and "EasyR1's defaults" in n for n in notes)
    assert not [n for n in notes if "does nothing" in n]  # EasyR1's own default is no kl_coef the file set


@pytest.mark.parametrize(
    ("overrides", "actor", "ref", "critic"),
    [
        # the actor's micro-batches of 1 and 2; GRPO builds no critic, whose budgets stay rlstack's, unsaid
        ([], (4096, 8192), 8192, (16384, 32768)),
        (["data.max_response_length=6144"], (8192, 16384), 16384, (16384, 32768)),
        (["worker.actor.max_token_len_per_device_for_update=10000"], (10000, 8192), 8192, (16384, 32768)),
        # with GAE, the critic, which the file leaves out, batches by EasyR1's 4 / 16 rows
        (["algorithm.adv_estimator=gae"], (4096, 8192), 8192, (4 * 4096, 16 * 4096)),
        (
            ["algorithm.adv_estimator=gae", "data.max_response_length=6144"],
            (8192, 16384),
            16384,
            (4 * 8192, 16 * 8192),
        ),
        (
            ["algorithm.adv_estimator=gae", "worker.critic.dynamic_batching=false"],
            (4096, 8192),
            8192,
            (16384, 32768),
        ),
        (
            ["algorithm.adv_estimator=gae", "worker.actor.dynamic_batching=false"],
            (16384, 32768),
            32768,
            (4 * 4096, 16 * 4096),
        ),
    ],
)
def test_an_easyr1_files_dynamic_batching_packs_each_pass_as_easyr1_does(
    caplog, overrides, actor, ref, critic
):
    """EasyR1 has no token budget key: with dynamic batching a pass holds up to the micro-batch size x the
    padded length (max_prompt_length + max_response_length) tokens, the reference's the actor's experience
    micro-batch. A budget set in rlstack's name stays."""
    cfg, notes = load_with_notes([f"config={EASYR1 / 'config.yaml'}", *EASYR1_PATHS, *overrides], caplog)
    a, cr = cfg.worker.actor, cfg.worker.critic
    assert (a.max_token_len_per_device_for_update, a.max_token_len_per_device_for_experience) == actor
    assert cfg.worker.ref.max_token_len_per_device_for_experience == ref
    assert (cr.max_token_len_per_device_for_update, cr.max_token_len_per_device_for_experience) == critic
    said = [n for n in notes if n.startswith("EasyR1's dynamic batching packs each pass")]
    assert len(said) == 1  # one note, for the budgets of what batches by tokens
    if "algorithm.adv_estimator=gae" not in overrides:
        assert "worker.critic" not in said[0]


def test_an_easyr1_file_without_its_layout_keys_packs_and_batches_by_tokens_as_easyr1(tmp_path, caplog):
    """EasyR1's ActorConfig has padding_free and dynamic_batching on, its CriticConfig dynamic_batching on and
    padding_free off: a file that leaves them out means those, not rlstack's padded row micro-batches."""
    text = (EASYR1 / "config.yaml").read_text()
    path = tmp_path / "config.yaml"
    drop = ("padding_free:", "dynamic_batching:")
    path.write_text("\n".join(line for line in text.splitlines() if not line.strip().startswith(drop)))
    assert path.read_text() != text
    cfg, notes = load_with_notes([f"config={path}", *EASYR1_PATHS], caplog)
    a, cr = cfg.worker.actor, cfg.worker.critic
    assert (a.padding_free, a.dynamic_batching, cr.padding_free, cr.dynamic_batching) == (
        True,
        True,
        False,
        True,
    )
    assert any(
        "worker.actor.padding_free=True" in n and "worker.critic.dynamic_batching=True" in n for n in notes
    )
    assert a.max_token_len_per_device_for_update == 4096
    plain = load_config(["worker.actor.micro_batch_size_per_device_for_update=1"]).worker
    assert (plain.actor.padding_free, plain.actor.dynamic_batching, plain.critic.dynamic_batching) == (
        False,
    ) * 3


def test_an_easyr1_file_without_a_critic_section_gives_gae_easyr1s_critic_learning_rate(caplog):
    """EasyR1's critic shares the actor's OptimConfig (lr 1e-6); rlstack's own critic default is 1e-5."""
    cfg, notes = load_with_notes(
        [f"config={EASYR1 / 'config.yaml'}", *EASYR1_PATHS, "algorithm.adv_estimator=gae"], caplog
    )
    assert cfg.worker.critic.optim.lr == 1e-6
    assert any("worker.critic.optim.lr=1e-06" in n for n in notes)
    assert load_config(["algorithm.adv_estimator=gae"]).worker.critic.optim.lr == 1e-5


def test_dynamic_batching_outside_an_easyr1_file_keeps_rlstacks_budgets():
    cfg = load_config(
        ["worker.actor.dynamic_batching=true", "worker.actor.micro_batch_size_per_device_for_update=1"]
    )
    a = cfg.worker.actor
    assert (a.max_token_len_per_device_for_update, a.max_token_len_per_device_for_experience) == (
        16384,
        32768,
    )


def test_an_easyr1_file_must_name_what_easyr1_has_no_default_for(tmp_path):
    text = (EASYR1 / "config.yaml").read_text()
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(line for line in text.splitlines() if "reward_function:" not in line))
    with pytest.raises(ConfigError) as e:
        load_config([f"config={path}", *EASYR1_PATHS[:-1]], machine_checks="warn")
    assert "worker.reward.reward_function is not set in this EasyR1 config, and EasyR1 has no default" in str(
        e.value
    )


def test_an_easyr1_key_on_the_command_line_alone_keeps_rlstacks_defaults():
    cfg = load_config(["trainer.max_try_make_batch=7"])
    assert cfg.algorithm.max_try_make_batch == 7
    assert cfg.data.max_response_length == load_config([]).data.max_response_length


VPPO = FIXTURES / "vppo"


@pytest.fixture()
def vppo_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory as VPPO's checkout root, where its config names its format prompt and its
    reward file (the prompt is ours: only its path matters here)."""
    (tmp_path / "examples" / "format_prompt").mkdir(parents=True)
    (tmp_path / "examples" / "format_prompt" / "math_format_perception.jinja").write_text(
        "{{ content | trim }}"
    )
    (tmp_path / "examples" / "reward_function").mkdir()
    shutil.copy(VPPO / "reward_function" / "math.py", tmp_path / "examples" / "reward_function" / "math.py")
    (tmp_path / "examples" / "configs").mkdir()
    shutil.copy(VPPO / "config.yaml", tmp_path / "examples" / "configs" / "config.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_vppos_config_as_shipped_loads_and_every_key_keeps_its_meaning(vppo_checkout, caplog):
    """VPPO's examples/configs/config.yaml (an EasyR1 fork), run from its checkout's root as VPPO's scripts do:
    its format prompt and its reward file named without `:compute_score` where it names them."""
    rows = str(FIXTURES / "formats" / "geometry3k.jsonl")
    paths = [
        f"data.train_files={rows}",
        f"data.val_files={rows}",
        "worker.actor.model.model_path=builtin:tiny-qwen2.5-vl",
    ]
    shipped = yaml.safe_load((VPPO / "config.yaml").read_text())
    cfg, notes = load_with_notes([f"config={VPPO / 'config.yaml'}", *paths], caplog)
    moved = {
        "data.override_chat_template": ("worker.actor.model.chat_template", None),
        "worker.actor.model.freeze_vision_tower": ("worker.actor.freeze_vision_tower", False),
        "worker.actor.fsdp.enable_cpu_offload": ("worker.actor.fsdp.offload_params", False),
        "worker.actor.fsdp.torch_dtype": ("worker.actor.model.dtype", "bfloat16"),
        "worker.rollout.val_override_config.temperature": ("worker.rollout.val_temperature", 1.0),
        "worker.rollout.val_override_config.n": ("worker.rollout.val_n", 8),
        "trainer.max_try_make_batch": ("algorithm.max_try_make_batch", -1),
    }
    _every_key_kept(shipped, cfg, notes, paths, moved)
    a = cfg.algorithm
    assert (a.online_filtering, a.filter_key, a.unlimited_tries) == (True, "accuracy", True)
    assert (a.use_kl_loss, a.use_kl_in_reward) == (False, False)  # disable_kl: true wins over use_kl_loss
    assert cfg.worker.reward.reward_function == "examples/reward_function/math.py"  # its compute_score
    assert cfg.worker.actor.optim.strategy == "adamw_bf16"
    # EasyR1 validates with the rollout's sampling where val_override_config says nothing (top_p 0.99 here)
    r = cfg.worker.rollout
    assert (r.val_temperature, r.val_top_p, r.val_top_k) == (1.0, 0.99, -1)


def test_an_easyr1_file_without_val_override_config_validates_as_its_rollout_samples(tmp_path, caplog):
    text = (EASYR1 / "config.yaml").read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "val_override_config:")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" " * 6))
    kept = lines[:start] + lines[end:]
    assert len(kept) < len(lines) - 1
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(kept))
    cfg, notes = load_with_notes([f"config={path}", *EASYR1_PATHS, "worker.rollout.top_p=0.9"], caplog)
    r = cfg.worker.rollout
    assert (r.val_temperature, r.val_top_p, r.val_top_k) == (1.0, 0.9, -1)  # not rlstack's greedy
    assert any("worker.rollout.val_temperature=1.0" in n and "greedy" in n for n in notes)
    given, _ = load_with_notes(
        [f"config={EASYR1 / 'config.yaml'}", *EASYR1_PATHS], caplog
    )  # its own overrides
    assert (given.worker.rollout.val_temperature, given.worker.rollout.val_top_p) == (0.6, 0.95)


def test_a_kl_coef_that_no_kl_uses_is_said(tmp_path, caplog):
    """A file in EasyR1's layout with none of EasyR1's own keys: kl_coef without use_kl_loss or
    use_kl_in_reward would do nothing here (EasyR1 would subtract it from the reward): said."""
    path = write_yaml(tmp_path / "c.yaml", "algorithm:\n  adv_estimator: grpo\n  kl_coef: 0.05\n")
    cfg, notes = load_with_notes([f"config={path}"], caplog)
    assert (cfg.algorithm.use_kl_loss, cfg.algorithm.use_kl_in_reward) == (False, False)
    (note,) = [n for n in notes if "algorithm.kl_coef=0.05" in n]
    assert "does nothing" in note and "c.yaml" in note and "use_kl_in_reward=true" in note
    caplog.clear()
    _, notes = load_with_notes([f"config={path}", "algorithm.use_kl_loss=true"], caplog)
    assert not [n for n in notes if "does nothing" in n]


@pytest.mark.parametrize(
    "ref", ["examples/reward_function/math.py", "examples/reward_function/math.py:compute_score_wo_format"]
)
def test_vppos_reward_file_as_shipped_scores_as_its_config_names_it(vppo_checkout, ref):
    """The reward file of VPPO's config, named without its function (its compute_score here), and its
    other function: loaded and called as a run calls them, a right boxed answer scores above a wrong one."""
    from rlstack.rewards.loader import load_reward_function

    fn = load_reward_function(ref)
    assert fn.name.endswith(":compute_score" if ":" not in ref else ":compute_score_wo_format")
    rows = [
        {"response": "<think>3 + 4</think> \\boxed{7}", "ground_truth": "7"},
        {"response": "<think>3 + 4</think> \\boxed{8}", "ground_truth": "7"},
    ]
    right, wrong = fn.fn(rows)
    assert right["accuracy"] == 1.0 and wrong["accuracy"] == 0.0 and right["overall"] > wrong["overall"]


SEEDS = FIXTURES / "seeds"


def test_the_easyr1_guides_snippet_and_command_mean_what_they_mean_in_easyr1(caplog):
    """The seed guide's config and `config=base.yaml trainer.n_gpus_per_node=4 worker.rollout.n=8`, paths
    replaced: no KL key but kl_coef, so EasyR1 puts the KL in the reward; every key left out is EasyR1's."""
    paths = [
        f"data.train_files={FIXTURES / 'formats' / 'gsm8k.jsonl'}",
        f"data.format_prompt={EASYR1 / 'format_prompt' / 'math.jinja'}",
        "worker.actor.model.model_path=builtin:tiny-qwen2",
        f"worker.reward.reward_function={EASYR1 / 'reward_function' / 'math.py'}:compute_score",
    ]
    command = ["trainer.n_gpus_per_node=4", "worker.rollout.n=8"]
    cfg, notes = load_with_notes([f"config={SEEDS / 'easyr1_guide.yaml'}", *paths, *command], caplog)
    a, d = cfg.algorithm, cfg.data
    assert (a.use_kl_in_reward, a.use_kl_loss, a.kl_coef, a.kl_penalty) == (True, False, 0.01, "kl")
    assert (d.max_prompt_length, d.max_response_length, d.rollout_batch_size, d.val_files) == (
        2048,
        512,
        512,
        "",
    )
    assert (cfg.worker.rollout.n, cfg.trainer.n_gpus_per_node, cfg.worker.actor.global_batch_size) == (
        8,
        4,
        128,
    )
    assert any("offload_params" in n for n in notes)  # EasyR1's between-phase offload: said, not dropped


def test_the_vppo_guides_training_command_loads(vppo_checkout, caplog):
    """shared/seeds/vppo-rl-agent-guide.md's 7B command over VPPO's config, paths replaced."""
    rows = str(FIXTURES / "formats" / "geometry3k.jsonl")
    command = [
        f"config={VPPO / 'config.yaml'}",
        "worker.actor.model.model_path=builtin:tiny-qwen2.5-vl",
        f"data.train_files={rows}",
        f"data.val_files={rows}",
        "worker.rollout.n=8",
        "trainer.total_epochs=2",
        "algorithm.use_vppo_on_perception=true",
        "algorithm.top_p_perception_tokens=0.4",
        "algorithm.use_advantage_shaping=true",
        "algorithm.use_entropy_penalty=true",
        "algorithm.entropy_penalty_coef=0.06",
    ]
    cfg, _ = load_with_notes(command, caplog)
    a = cfg.algorithm
    assert (a.use_vppo_on_perception, a.top_p_perception_tokens, a.use_advantage_shaping) == (True, 0.4, True)
    assert (a.use_entropy_penalty, a.entropy_penalty_coef, cfg.worker.rollout.n) == (True, 0.06, 8)
    assert a.advantage_scaling_min == 0.8  # the command leaves it out: VPPO's default (its script sets 0.9)
    # the guide's other reward of the same file, named with its function
    cfg, _ = load_with_notes(
        [*command, "worker.reward.reward_function=examples/reward_function/math.py:compute_score_wo_format"],
        caplog,
    )
    assert cfg.worker.reward.reward_function.endswith(":compute_score_wo_format")


def _launch(script: Path, checkout: Path, env: dict[str, str] | None = None) -> list[str]:
    """A seed launch script's arguments, its model and Hub rows replaced (the Hub is not reachable here): a
    vision model's rows are geometry3k's."""
    args = launch_arguments(script, checkout, env)
    model = next(a.split("=", 1)[1] for a in args if a.startswith("worker.actor.model.model_path="))
    vision = "VL" in model
    rows = FIXTURES / "formats" / ("geometry3k.jsonl" if vision else "gsm8k.jsonl")
    tiny = "builtin:tiny-qwen2.5-vl" if vision else "builtin:tiny-qwen2"
    return [
        *args,
        f"data.train_files={rows}",
        f"data.val_files={rows}",
        f"worker.actor.model.model_path={tiny}",
    ]


@pytest.fixture()
def easyr1_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory as EasyR1's checkout root, where its launch scripts run: its examples/config.yaml
    and the format prompts and reward files they name (math's as shipped; of the others only the path and
    the function name matter here)."""
    examples = tmp_path / "examples"
    (examples / "format_prompt").mkdir(parents=True)
    (examples / "reward_function").mkdir()
    shutil.copy(EASYR1 / "config.yaml", examples / "config.yaml")
    shutil.copy(EASYR1 / "format_prompt" / "math.jinja", examples / "format_prompt" / "math.jinja")
    shutil.copy(EASYR1 / "reward_function" / "math.py", examples / "reward_function" / "math.py")
    for name in ("dapo", "android_gui"):
        (examples / "format_prompt" / f"{name}.jinja").write_text("{{ content | trim }}")
        (examples / "reward_function" / f"{name}.py").write_text(
            "def compute_score(reward_inputs):\n    return []\n"
        )
    monkeypatch.chdir(tmp_path)
    return tmp_path


EASYR1_SCRIPTS: dict[str, dict[str, Any]] = {
    "qwen2_5_7b_math_grpo.sh": {"worker.rollout.n": 5},
    "qwen2_5_vl_3b_geo3k_grpo.sh": {"trainer.n_gpus_per_node": 2},
    "qwen2_5_vl_7b_geo3k_grpo.sh": {"trainer.n_gpus_per_node": 8},
    "qwen2_5_vl_32b_geo3k_grpo.sh": {
        "worker.actor.model.dtype": "bfloat16",
        "worker.actor.optim.strategy": "adamw_bf16",
        "worker.rollout.tensor_parallel_size": 8,
    },
    "qwen3_vl_30b_geo3k_grpo.sh": {
        "worker.actor.model.dtype": "bfloat16",
        "worker.rollout.tensor_parallel_size": 8,
    },
    "qwen3_vl_4b_geo3k_grpo.sh": {"trainer.n_gpus_per_node": 2},
    "qwen3_4b_math_grpo.sh": {"data.max_response_length": 4096},
    "qwen3_4b_math_grpo_lora.sh": {"worker.actor.model.lora.rank": 64, "worker.actor.optim.lr": 1e-5},
    "qwen2_5_vl_3b_android_gui_grpo.sh": {
        "worker.rollout.agent.max_images": 1,
        "algorithm.kl_coef": 0.04,
        "algorithm.use_kl_loss": True,
        "worker.actor.optim.lr_warmup_ratio": 0.05,
    },
    "qwen2_5_vl_7b_geo3k_cispo.sh": {"worker.actor.loss_type": "cispo", "worker.actor.clip_ratio_high": 4.0},
    "qwen2_5_vl_7b_geo3k_gspo.sh": {
        "worker.actor.loss_type": "gspo_token",
        "worker.actor.loss_agg_mode": "seq-mean-token-mean",
        "algorithm.use_kl_loss": False,
        "algorithm.use_kl_in_reward": False,
    },
    "qwen2_5_vl_7b_geo3k_sapo.sh": {"worker.actor.loss_type": "sapo", "algorithm.use_kl_loss": False},
    "qwen2_5_vl_7b_geo3k_reinforce.sh": {  # use_kl_loss=false beside the file's disable_kl: false
        "algorithm.adv_estimator": "reinforce_plus_plus",
        "algorithm.use_kl_in_reward": True,
        "algorithm.kl_coef": 1e-3,
        "algorithm.kl_penalty": "kl",
    },
    "qwen2_5_vl_7b_geo3k_swanlab.sh": {"trainer.logger": ["console", "swanlab"]},
    "qwen2_5_vl_7b_multi_image.sh": {"worker.rollout.agent.max_images": 2, "data.rollout_batch_size": 256},
}
"""EasyR1's launch scripts that load, each with some of what its overrides mean here."""
EASYR1_SCRIPTS_REFUSED: dict[str, list[str]] = {
    "qwen2_5_vl_7b_geo3k_dapo.sh": ["data.mini_rollout_batch_size=128 (command-line override"],
    # its 22528-token trajectories fit: EasyR1's budget, micro-batch 1 x 22528, is derived
    "qwen3_14b_dapo17k_dapo.sh": ["data.mini_rollout_batch_size=256 (command-line override"],
    "qwen3_vl_4b_geo3k_grpo_lora.sh": ["LoRA is built for one policy rank so far"],
}
"""EasyR1's launch scripts refused, each by what it asks that rlstack does not do that way (DAPO's
mini-batches of prompts are algorithm.oversample_factor here; LoRA runs on one policy rank)."""


def test_every_easyr1_launch_script_is_listed():
    assert sorted(EASYR1_SCRIPTS | EASYR1_SCRIPTS_REFUSED) == sorted(
        p.name for p in (EASYR1 / "examples").glob("*.sh")
    )


@pytest.mark.parametrize("name", sorted(EASYR1_SCRIPTS))
def test_easyr1s_launch_scripts_load_as_rlstack_train_arguments(easyr1_checkout, caplog, name):
    """`bash examples/X.sh` in EasyR1's checkout is `rlstack train` with the same arguments there; the model and
    the Hub rows replaced."""
    cfg, _ = load_with_notes(_launch(EASYR1 / "examples" / name, easyr1_checkout), caplog)
    for key, want in EASYR1_SCRIPTS[name].items():
        assert _get(cfg, key) == want, (key, _get(cfg, key))


@pytest.mark.parametrize("name", sorted(EASYR1_SCRIPTS_REFUSED))
def test_easyr1s_launch_scripts_rlstack_cannot_run_as_written_are_refused_by_name(easyr1_checkout, name):
    with pytest.raises(ConfigError) as e:
        load_config(_launch(EASYR1 / "examples" / name, easyr1_checkout), machine_checks="warn")
    said = EASYR1_SCRIPTS_REFUSED[name]
    assert len(e.value.problems) == len(said), e.value.problems
    for part in said:
        assert any(part in p for p in e.value.problems), (part, e.value.problems)


VPPO_SCRIPTS = {
    "train_vppo_7b.sh": {
        "trainer.total_epochs": 2,
        "trainer.project_name": "7b_vppo",
        "algorithm.entropy_penalty_coef": 0.06,
        "worker.actor.micro_batch_size_per_device_for_experience": 32,
        "worker.actor.micro_batch_size_per_device_for_update": 16,
    },
    "train_vppo_8b.sh": {
        "trainer.total_epochs": 2,  # TOTAL_EPOCHES=2 in the environment: the script does not set it
        "trainer.max_steps": 130,
        "trainer.project_name": "qwen3_8b_vppo",
        "algorithm.entropy_penalty_coef": 0.12,
        "data.max_response_length": 8192,
        "worker.rollout.max_num_batched_tokens": 12289,
        "worker.actor.micro_batch_size_per_device_for_experience": 8,
        "worker.actor.micro_batch_size_per_device_for_update": 4,
    },
}
"""VPPO's launch scripts (its README's 7B and 8B runs) and what some of their overrides mean here."""


@pytest.mark.parametrize("name", sorted(VPPO_SCRIPTS))
def test_vppos_launch_scripts_load_as_rlstack_train_arguments(vppo_checkout, caplog, name):
    """`bash examples/configs/train_vppo_{7b,8b}.sh` in VPPO's checkout, as `rlstack train` arguments: its
    config, format prompt and reward file (named with `:compute_score_wo_format`) where the script names
    them; the model and the Hub rows replaced."""
    script = VPPO / "scripts" / name
    cfg, _ = load_with_notes(_launch(script, vppo_checkout, {"TOTAL_EPOCHES": "2"}), caplog)
    a = cfg.algorithm
    assert (a.use_vppo_on_perception, a.use_advantage_shaping, a.use_entropy_penalty) == (True, True, True)
    assert (a.use_vppo_on_entropy, a.top_p_perception_tokens, a.advantage_scaling_min) == (False, 0.4, 0.9)
    assert (a.online_filtering, a.unlimited_tries) == (True, True)  # its config.yaml's
    assert cfg.worker.reward.reward_function == "examples/reward_function/math.py:compute_score_wo_format"
    assert (cfg.worker.rollout.n, cfg.data.rollout_batch_size, cfg.worker.actor.global_batch_size) == (
        8,
        384,
        128,
    )
    assert (cfg.trainer.logger, cfg.trainer.n_gpus_per_node) == (["console", "swanlab"], 8)
    for key, want in VPPO_SCRIPTS[name].items():
        assert _get(cfg, key) == want, (key, _get(cfg, key))


def test_vppos_8b_script_as_shipped_passes_an_empty_total_epochs(vppo_checkout):
    """train_vppo_8b.sh passes `trainer.total_epochs=${TOTAL_EPOCHES}` without setting TOTAL_EPOCHES (its 7B
    script sets 2): an empty value, which VPPO's OmegaConf refuses too (None for an int); here a problem
    naming the key."""
    args = _launch(VPPO / "scripts" / "train_vppo_8b.sh", vppo_checkout)
    assert "trainer.total_epochs=" in args
    with pytest.raises(ConfigError) as e:
        load_config(args, machine_checks="warn")
    (problem,) = e.value.problems
    assert problem == (
        "trainer.total_epochs (command-line override 'trainer.total_epochs='): expected int, got '' (str); the "
        "command line gives it no value (a shell variable there that is not set?)"
    )


# ------------------------------------------------------------------------------------------ NeMo RL

NEMO = FIXTURES / "nemo_rl"


@pytest.fixture()
def nemo_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """NeMo RL's shipped files in the working directory, its prompt file where they name it (the only path)."""
    for f in (NEMO / "shipped").glob("*.yaml"):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "examples" / "prompts").mkdir(parents=True)
    shutil.copy(NEMO / "cot.txt", tmp_path / "examples" / "prompts" / "cot.txt")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _unnamed(shipped: dict, cfg: Any, notes: list[str]) -> list[str]:
    """The upstream keys that no note names (nor one of their sections) and that are not rlstack's own key
    with the same value."""
    out = []
    for key, value in _leaves(shipped).items():
        sections = [key.rsplit(".", i)[0] for i in range(max(1, key.count(".")))]  # the key and its sections
        # but the top one (a note naming `policy` does not name every policy key)
        named = (re.compile(rf"(?<![\w.]){re.escape(s)}(?![\w.])") for s in sections)  # whole keys, not parts
        if any(pattern.search(n) for pattern in named for n in notes):
            continue
        if _get(cfg, key) not in (KeyError,) and _get(cfg, key) == value:
            continue
        out.append(key)
    return out


def test_nemo_rls_grpo_math_1b_as_shipped_loads_and_every_key_is_read_or_said(nemo_dir, caplog):
    shipped = yaml.safe_load((nemo_dir / "grpo_math_1B.yaml").read_text())
    cfg, notes = load_with_notes([f"config={nemo_dir / 'grpo_math_1B.yaml'}"], caplog)
    assert _unnamed(shipped, cfg, notes) == []
    a, w, t = cfg.algorithm, cfg.worker, cfg.trainer
    assert cfg.data.val_split == 0.05  # OpenMathInstruct-2, 5% held out to validate
    assert (a.adv_estimator, a.use_kl_loss, a.kl_coef, a.kl_penalty) == ("loo_std", True, 0.01, "low_var_kl")
    assert (w.actor.clip_ratio_low, w.actor.clip_ratio_high, w.actor.clip_ratio_dual) == (
        0.2,
        0.2,
        float("inf"),
    )
    assert (w.actor.optim.lr, w.actor.padding_free, w.actor.dynamic_batching) == (5e-6, True, False)
    # NeMo RL validates by sampling at the training temperature, one sample per prompt
    assert (w.rollout.val_temperature, w.rollout.val_top_p, w.rollout.val_top_k, w.rollout.val_n) == (
        1.0,
        1.0,
        -1,
        1,
    )
    assert (w.actor.rollout_correction, a.online_filtering, w.reward.overlong_buffer_length) == (
        None,
        False,
        0,
    )
    assert (w.actor.model.lora.rank, w.actor.loss_type) == (0, "vanilla")
    assert (t.val_freq, t.save_freq, t.save_limit, t.save_best_metric) == (10, 10, 3, "val/reward_score")
    assert any(n.startswith("NeMo RL's keys left null") and "grpo.advantage_clip_low" in n for n in notes)


@pytest.mark.parametrize(
    ("override", "key", "want"),
    [
        (
            "++grpo.adv_estimator.name=reinforce_plus_plus",
            "algorithm.adv_estimator",
            "reinforce_plus_plus_baseline",
        ),
        ("++loss_fn.use_kl_in_reward=true", "algorithm.use_kl_in_reward", True),
        ("++loss_fn.use_cispo=true", "worker.actor.loss_type", "cispo"),
        ("++grpo.use_dynamic_sampling=true", "algorithm.online_filtering", True),
        ("++grpo.reward_shaping.enabled=true", "worker.reward.overlong_buffer_length", 128),
        ("++policy.dtensor_cfg.lora_cfg.enabled=true", "worker.actor.model.lora.rank", 8),
        ("++policy.generation.val_temperature=0.0", "worker.rollout.val_temperature", 0.0),
        ("++grpo.val_num_generations_per_prompt=4", "worker.rollout.val_n", 4),
    ],
)
def test_nemo_rls_switches_mean_what_they_mean_there(nemo_dir, caplog, override, key, want):
    cfg, _ = load_with_notes([f"config={nemo_dir / 'grpo_math_1B.yaml'}", override], caplog)
    assert _get(cfg, key) == want


def test_nemo_rls_importance_sampling_keys_set_the_rollout_correction(nemo_dir, caplog):
    base = [f"config={nemo_dir / 'grpo_math_1B.yaml'}", "++loss_fn.use_importance_sampling_correction=true"]
    actor = load_with_notes(base, caplog)[0].worker.actor  # NeMo RL's plain IS correction: weights not capped
    assert (actor.rollout_correction, actor.rollout_correction_high) == ("tis", float("inf"))
    icepop = [
        "++loss_fn.truncated_importance_sampling_type=icepop",
        "++loss_fn.truncated_importance_sampling_ratio=5.0",
        "++loss_fn.truncated_importance_sampling_ratio_min=0.5",
    ]
    actor = load_with_notes([*base, *icepop], caplog)[0].worker.actor
    assert (actor.rollout_correction, actor.rollout_correction_low, actor.rollout_correction_high) == (
        "icepop",
        0.5,
        5.0,
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("++grpo.reward_scaling.enabled=true", "rlstack does not rescale rewards"),
        ("++loss_fn.disable_ppo_ratio=true", "use the ratio to the sampling policy"),
        ("++loss_fn.positive_example_nll_weight=0.1", "VAPO's NLL term"),
        ("++checkpointing.save_optimizer=false", "hold the optimizer state"),
        ("++reward_penalties.penalize_empty_final_answer=true", "NeMo-Gym's reward-zeroing penalties"),
        ("++policy.draft.enabled=true", "no draft model"),
        ("++loss_fn.kl_output_clamp_value=5.0", "clamps the k3 estimate (low_var_kl) at 10 always"),
        ("++loss_fn.reference_policy_kl_type=k1", "k1 / k2 never"),  # with the file's clamps
    ],
)
def test_nemo_rl_values_rlstack_cannot_mean_are_refused_by_name(nemo_dir, override, message):
    with pytest.raises(ConfigError) as e:
        load_config([f"config={nemo_dir / 'grpo_math_1B.yaml'}", override], machine_checks="warn")
    assert message in str(e.value) and override.lstrip("+").split("=")[0] in str(e.value)


def _with_defaults(path: Path) -> dict:
    """A NeMo RL file's keys over those of the files its `defaults` names, as NeMo RL merges them."""
    values = yaml.safe_load(path.read_text())
    parents = values.pop("defaults", None)
    merged: dict = {}
    for parent in [parents] if isinstance(parents, str) else parents or []:
        tree.merge(merged, _with_defaults(path.parent / parent))
    tree.merge(merged, values)
    return merged


@pytest.mark.parametrize("name", ["grpo_rm_1B.yaml", "grpo_smoke.yaml", "code_grpo_test.yaml"])
def test_nemo_rl_files_over_the_shipped_base_read_or_say_every_key_of_both(nemo_dir, caplog, name):
    """Every key of the file and of the base it names (`defaults`): the base's environment that the file's
    data does not pick (env.math under the reward model, the code environment) is said, not dropped."""
    if not (nemo_dir / name).exists():
        shutil.copy(NEMO / name, nemo_dir / name)  # the research notes' code config, over the shipped base
    cfg, notes = load_with_notes([f"config={nemo_dir / name}"], caplog)
    assert _unnamed(_with_defaults(nemo_dir / name), cfg, notes) == []
    assert any(n.startswith("env.math (") and "num_workers, math_verify_impl" in n for n in notes) == (
        name != "grpo_smoke.yaml"  # the smoke recipe keeps the base's math environment
    )


def test_nemo_rls_grpo_rm_1b_as_shipped_scores_with_its_reward_model(nemo_dir, caplog):
    cfg, notes = load_with_notes([f"config={nemo_dir / 'grpo_rm_1B.yaml'}"], caplog)
    rw = cfg.worker.reward
    assert rw.reward_function == "builtin:reward_model"
    rm = rw.reward_model
    assert (rm.model_path, rm.dtype, rm.micro_batch_size, rm.max_length) == (
        "Skywork/Skywork-Reward-V2-Qwen3-0.6B",
        "bfloat16",
        4,
        2048,
    )
    # the cluster's 2 GPUs, as NeMo RL splits them: one rank of the policy, and the reward model in one reward
    # actor on a GPU of its own, which Ray places (the local backend would load it beside the policy)
    t = cfg.trainer
    assert (t.backend, t.nnodes, t.n_gpus_per_node) == ("ray", 1, 1)
    assert (rw.num_workers, rm.num_gpus, rm.device) == (1, 1, "auto")
    assert t.nnodes * t.n_gpus_per_node + rw.num_workers * rm.num_gpus == 2  # cluster.gpus_per_node, all used


@pytest.mark.parametrize(
    ("overrides", "placed"),
    [
        # NeMo RL's reward model over 2 GPUs (data-parallel): two reward actors, one GPU each
        (["++cluster.gpus_per_node=4", "++env.reward_model.resources.gpus_per_node=2"], (1, 2, 2, 1)),
        # on several nodes the reward model takes whole nodes, the policy the rest
        (
            [
                "++cluster.num_nodes=3",
                "++cluster.gpus_per_node=8",
                "++env.reward_model.resources.gpus_per_node=8",
            ],
            (2, 8, 8, 1),
        ),
        # a number of reward actors set in rlstack's name is kept, where they fit the reward model's GPUs
        (["worker.reward.num_workers=2", "worker.reward.reward_model.num_gpus=0.5"], (1, 1, 2, 0.5)),
    ],
)
def test_nemo_rls_reward_model_gpus_are_reward_actors_of_their_own(nemo_dir, caplog, overrides, placed):
    cfg, _ = load_with_notes([f"config={nemo_dir / 'grpo_rm_1B.yaml'}", *overrides], caplog)
    t, rw = cfg.trainer, cfg.worker.reward
    assert t.backend == "ray"
    assert (t.nnodes, t.n_gpus_per_node, rw.num_workers, rw.reward_model.num_gpus) == placed


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            ["worker.reward.num_workers=2"],
            "worker.reward.num_workers=2 (command-line override 'worker.reward.num_workers=2') reward actor(s) x "
            "worker.reward.reward_model.num_gpus=1 need 2 GPUs, but NeMo RL's env.reward_model.resources "
            "(grpo_rm_1B.yaml, line 20) gives the reward model 1 node(s) of 1 GPU(s), 1 in all (the rest of the "
            "cluster is the policy's: trainer.n_gpus_per_node=1 of cluster.gpus_per_node=2), and Ray would stop "
            "the run at start: set worker.reward.num_workers to at most 1, share the GPUs "
            "(worker.reward.reward_model.num_gpus=0.5), or give the reward model more "
            "(env.reward_model.resources.gpus_per_node, and cluster.gpus_per_node with it)",
        ),
        (
            [
                "++cluster.gpus_per_node=4",
                "++env.reward_model.resources.gpus_per_node=2",
                "worker.reward.num_workers=3",
            ],
            "need 3 GPUs, but NeMo RL's env.reward_model.resources (grpo_rm_1B.yaml, line 20) gives the reward "
            "model 1 node(s) of 2 GPU(s), 2 in all",
        ),
        (
            ["worker.reward.reward_model.num_gpus=2"],
            "one actor's 2 GPUs must be on one node, and NeMo RL's env.reward_model.resources (grpo_rm_1B.yaml, "
            "line 20) gives the reward model 1 node(s) of 1 GPU(s): set worker.reward.reward_model.num_gpus to "
            "at most 1",
        ),
    ],
)
def test_nemo_rls_reward_actors_beyond_the_reward_models_gpus_are_refused_at_load(nemo_dir, overrides, said):
    """More reward actors (or GPUs each) than NeMo RL gives the reward model: refused at load, naming the
    keys, the limit and the way out, not at start when Ray finds no GPU for them."""
    with pytest.raises(ConfigError) as e:
        load_config([f"config={nemo_dir / 'grpo_rm_1B.yaml'}", *overrides], machine_checks="warn")
    (problem,) = e.value.problems
    assert said in problem.replace(f"{nemo_dir}/", ""), problem


def test_nemo_rls_reward_model_on_the_local_backend_is_refused_by_name(nemo_dir):
    with pytest.raises(ConfigError) as e:
        load_config(
            [f"config={nemo_dir / 'grpo_rm_1B.yaml'}", "trainer.backend=local"], machine_checks="warn"
        )
    (problem,) = e.value.problems
    assert problem.startswith("trainer.backend=local") and "env.reward_model.resources" in problem
    assert "leave trainer.backend unset" in problem


def test_nemo_rls_smoke_recipe_reads_gsm8k_as_nemo_rl_does(nemo_dir, caplog):
    """grpo_smoke.yaml's `data.train.dataset_name: gsm8k` (NeMo RL's GSM8KDataset): openai/gsm8k, config main,
    the train split, no rows held out (the class ignores the base's split_validation_size), the problem from
    `question` and the answer the text after '####' of `answer` (extract_answer, its default)."""
    from rlstack.data.dataset import PromptDataset
    from rlstack.models.tiny import build_char_tokenizer

    cfg, notes = load_with_notes([f"config={nemo_dir / 'grpo_smoke.yaml'}"], caplog)
    d = cfg.data
    assert (d.train_files, d.val_files, d.val_split, d.format) == ("openai/gsm8k:main@train", "", 0.0, "auto")
    assert (cfg.data.rollout_batch_size, cfg.worker.rollout.n, cfg.trainer.step_cap) == (2, 4, 10)
    assert any(
        n.startswith("data.train.split_validation_size") and "gsm8k class holds out no rows" in n
        for n in notes
    )
    rows = FIXTURES / "formats" / "gsm8k.jsonl"  # openai/gsm8k's layout (the Hub is not reachable here)
    ds = PromptDataset(
        str(rows),
        build_char_tokenizer(),
        prompt_key=d.prompt_key,
        answer_key=d.answer_key,
        data_format=d.format,
        apply_chat_template=False,
        max_prompt_length=100_000,
    )
    raw = [json.loads(line) for line in rows.read_text().splitlines()]
    nemo_rl = [r["answer"].split("####")[1].strip() for r in raw]  # GSM8KDataset's _extract_hash_answer
    assert [i["prompt_messages"][0]["content"] for i in ds.items] == [r["question"] for r in raw]
    # the same answers; rlstack also drops a number's thousands separators (1,234 is 1234)
    assert [i["ground_truth"] for i in ds.items] == [a.replace(",", "") for a in nemo_rl]


@pytest.mark.parametrize(
    ("overrides", "files"),
    [
        (["++data.train.dataset_name=GSM8K"], "openai/gsm8k:main@train"),
        (["++data.train.dataset_name=gsm8k", "++data.train.subset=socratic"], "openai/gsm8k:socratic@train"),
        (["++data.train.dataset_name=gsm8k", "++data.train.subset=null"], "openai/gsm8k:main@train"),
        (["++data.train.dataset_name=gsm8k", "++data.train.extract_answer=true"], "openai/gsm8k:main@train"),
        (["++data.train.dataset_name=openai/gsm8k", "++data.train.subset=main"], "openai/gsm8k:main"),
        (
            [
                "++data.train.dataset_name=null",
                "++data.train.data_path=openai/gsm8k",
                "++data.train.subset=main",
            ],
            "openai/gsm8k:main",
        ),
        (["++data.default.subset=main"], "nvidia/OpenMathInstruct-2@train_1M"),  # its class loads no config
    ],
)
def test_nemo_rls_gsm8k_and_subset_name_the_hub_config(nemo_dir, caplog, overrides, files):
    cfg, notes = load_with_notes([f"config={nemo_dir / 'grpo_math_1B.yaml'}", *overrides], caplog)
    assert cfg.data.train_files == files
    for key in ("subset", "extract_answer"):  # read, and said
        given = [o.lstrip("+").split("=")[0] for o in overrides if f".{key}=" in o]
        assert all(any(n.startswith(k) for n in notes) for k in given), given


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["++data.train.dataset_name=gsm8k", "++data.train.extract_answer=false"],
            "data.train.extract_answer=False",
        ),
        (["++data.train.data_path=rows.jsonl", "++data.train.subset=main"], "data.train.subset='main'"),
        (["++data.train.dataset_name=tulu3_sft_mixture"], "data.train.dataset_name='tulu3_sft_mixture'"),
        (["++data.train.num_proc=4"], "data.train.num_proc"),
    ],
)
def test_nemo_rl_data_keys_rlstack_cannot_mean_are_refused_alone_by_name(nemo_dir, overrides, message):
    """One problem, naming the key: a refusal of the training rows brings in neither the demo's validation
    rows (builtin:addition@test) nor an `unknown key data.train`."""
    with pytest.raises(ConfigError) as e:
        load_config([f"config={nemo_dir / 'grpo_math_1B.yaml'}", *overrides], machine_checks="warn")
    (problem,) = e.value.problems
    assert problem.startswith(message), problem


def test_nemo_rls_k1_kl_without_clamps_is_rlstacks_kl(nemo_dir, caplog):
    args = [
        f"config={nemo_dir / 'grpo_math_1B.yaml'}",
        "++loss_fn.reference_policy_kl_type=k1",
        "++loss_fn.kl_input_clamp_value=null",
        "++loss_fn.kl_output_clamp_value=null",
    ]
    cfg, notes = load_with_notes(args, caplog)
    assert (cfg.algorithm.kl_penalty, cfg.algorithm.kl_coef) == ("kl", 0.01)
    assert any("rlstack does not clamp k1 / k2 either" in n for n in notes)
