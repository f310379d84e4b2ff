"""VPPO's own config files (an EasyR1 fork): the keys and values that issue 44 found refused."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from helpers.config_files import EASYR1_RUN, problems_of, write_yaml

from rlstack.batch import Batch
from rlstack.collection import Collector
from rlstack.config import load_config
from rlstack.errors import RLStackError
from rlstack.rewards.loader import RewardLoadError, load_reward_function

MATH = """
def format_reward(response):
    return 1.0

def compute_score(reward_inputs, format_weight=0.1):
    return [{"overall": 1.0} for _ in reward_inputs]
"""


def test_max_try_make_batch_minus_one_means_no_limit(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", "trainer:\n  max_try_make_batch: -1\n")
    alg = load_config([f"config={path}", *EASYR1_RUN]).algorithm
    assert alg.max_try_make_batch == -1 and alg.unlimited_tries
    assert not load_config([]).algorithm.unlimited_tries


@pytest.mark.parametrize("value", [0, -2])
def test_max_try_make_batch_zero_or_below_minus_one_is_refused(value):
    (problem,) = [p for p in problems_of([f"algorithm.max_try_make_batch={value}"]) if "max_try" in p]
    assert "-1" in problem and "no limit" in problem


def _stub_collector(limit: int, all_wrong_rounds: int) -> SimpleNamespace:
    """A collector whose rollouts give one all-wrong group for `all_wrong_rounds` rounds, then a mixed one."""
    cfg = load_config(
        [
            "algorithm.online_filtering=true",
            f"algorithm.max_try_make_batch={limit}",
            "data.rollout_batch_size=1",
            "worker.actor.global_batch_size=1",
        ]
    )
    rounds = iter(range(10_000))

    def generate_and_score(prompts, step, timing):
        scores = [0.0, 0.0] if next(rounds) < all_wrong_rounds else [0.0, 1.0]
        return Batch(
            {
                "uid": ["g", "g"],
                "reward_components": [{"overall": s} for s in scores],
                "scores": torch.tensor(scores),
                "data_source": ["d", "d"],
                "input_ids": torch.zeros(2, 3, dtype=torch.long),
            }
        )

    return SimpleNamespace(
        cfg=cfg,
        loader=SimpleNamespace(next_batch=lambda: Batch({"uid": ["p"]})),
        generate_and_score=generate_and_score,
        _trajectory_filter=lambda batch: torch.ones(len(batch), dtype=torch.bool),
        pad_token_id=0,
    )


def test_dynamic_sampling_without_a_limit_draws_until_the_batch_is_full():
    metrics: dict[str, float] = {}
    batch = Collector._filtered(_stub_collector(-1, 50), 1, defaultdict(float), metrics)
    assert metrics["online_filtering/num_tries"] == 51 and len(batch) == 2


def test_dynamic_sampling_with_a_limit_still_stops():
    with pytest.raises(RLStackError, match="max_try_make_batch=3"):
        Collector._filtered(_stub_collector(3, 50), 1, defaultdict(float), {})


def test_easyr1_ref_dynamic_batching_loads_as_following_the_actor(tmp_path):
    path = write_yaml(
        tmp_path / "c.yaml",
        """
        worker:
          actor:
            dynamic_batching: false
          ref:
            dynamic_batching: false
            padding_free: true
            fsdp:
              torch_dtype: bf16
        """,
    )
    cfg = load_config([f"config={path}", *EASYR1_RUN])
    assert not cfg.worker.actor.dynamic_batching


def test_a_reward_file_without_its_function_means_compute_score(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "math.py").write_text(MATH)
    cfg = load_config(["worker.reward.reward_function=math.py"])
    assert cfg.worker.reward.reward_function == "math.py"
    fn = load_reward_function("math.py")
    assert fn.fn.__name__ == "compute_score" and fn.name == "math.py:compute_score"


def test_a_reward_file_without_its_function_means_main_where_it_has_one(tmp_path, monkeypatch):
    """EasyR1 calls `main` of a file named without `:function`: a file with both is called as there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "both.py").write_text(
        MATH + "\n\ndef main(reward_inputs):\n    return compute_score(reward_inputs)\n"
    )
    assert load_config(["worker.reward.reward_function=both.py"]).worker.reward.reward_function == "both.py"
    fn = load_reward_function("both.py")
    assert fn.fn.__name__ == "main" and fn.name == "both.py:main"


def test_a_reward_file_with_neither_main_nor_compute_score_is_refused_at_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text("def score_all(reward_inputs):\n    return []\n")
    (problem,) = [p for p in problems_of(["worker.reward.reward_function=r.py"]) if "r.py" in p]
    assert "worker.reward.reward_function" in problem and "compute_score" in problem
    assert "main" in problem and "score_all" in problem and "r.py:function_name" in problem
    with pytest.raises(RewardLoadError, match=r"compute_score.*score_all.*r\.py:function_name"):
        load_reward_function("r.py")


def test_a_missing_reward_file_without_its_function_is_refused_at_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    problems = problems_of(["worker.reward.extra_reward_functions=[nothere.py]"])
    assert any("worker.reward.extra_reward_functions[0]" in p and "nothere.py" in p for p in problems)


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_easyr1_forks_estimator_names_select_the_loss(tmp_path, name):
    path = write_yaml(tmp_path / "c.yaml", f"algorithm:\n  adv_estimator: {name}\n  disable_kl: true\n")
    cfg = load_config([f"config={path}", *EASYR1_RUN])
    assert (cfg.algorithm.adv_estimator, cfg.worker.actor.loss_type) == ("grpo", name)


def test_an_estimator_name_against_another_loss_is_refused(tmp_path):
    path = write_yaml(
        tmp_path / "c.yaml",
        "algorithm:\n  adv_estimator: gspo\n  disable_kl: true\nworker:\n  actor:\n    loss_type: cispo\n",
    )
    assert any("keep one" in p for p in problems_of([f"config={path}"]))


@pytest.mark.parametrize("entropy", ["False", "True"])
def test_vppos_train_script_overrides_load(entropy):
    """The VPPO switches its train_vppo_7b.sh sets, as it writes them (Python's True/False)."""
    cfg = load_config(
        [
            f"algorithm.use_vppo_on_entropy={entropy}",
            "algorithm.use_vppo_on_perception=True",
            "algorithm.use_advantage_shaping=True",
            "algorithm.use_entropy_penalty=True",
            "algorithm.top_p_perception_tokens=0.4",
            "algorithm.top_p_entropy_tokens=0.2",
            "algorithm.entropy_penalty_coef=0.06",
            "algorithm.advantage_scaling_min=0.8",
        ]
    )
    a = cfg.algorithm
    assert (a.use_vppo_on_entropy, a.top_p_entropy_tokens) == (entropy == "True", 0.2)
    assert a.use_vppo_on_perception and a.use_advantage_shaping and a.use_entropy_penalty


def test_vppos_entropy_penalty_stands_alone():
    """VPPO adds its entropy penalty whether or not the perception mask is on (its dp_actor)."""
    assert load_config(["algorithm.use_entropy_penalty=true"]).algorithm.use_entropy_penalty
    (problem,) = problems_of(["algorithm.use_advantage_shaping=true"])
    assert "visual dependency" in problem and "use_vppo_on_perception=true" in problem
