"""Every advantage estimator against values worked out by hand on tiny batches.

Layout as in the trainer: full-length `[B, T]` rows, prompt columns first, `response_mask` 1 on
sampled tokens only. Expected numbers are written out (with their arithmetic in comments), never
recomputed with the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlstack.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    AdvEstimator,
    compute_advantages,
    grpo_advantages,
    outcome_token_rewards,
)

ALL = list(AdvEstimator)
GROUP_RELATIVE = [
    AdvEstimator.GRPO,
    AdvEstimator.RLOO,
    AdvEstimator.REINFORCE_PLUS_PLUS_BASELINE,
    AdvEstimator.GRPO_PASSK,
    AdvEstimator.LOO_STD,
]
NO_EPS = AdvantageParams(eps=0.0)


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def outcome_inputs(scores: list[float], groups: list[int], mask: list[list[int]] | None = None):
    """Inputs for an outcome estimator; one sampled column per row unless `mask` is given."""
    m = torch.tensor(mask) if mask is not None else torch.ones(len(scores), 1, dtype=torch.long)
    s = torch.tensor(scores)
    return AdvantageInputs(outcome_token_rewards(s, m), s, torch.tensor(groups), m)


def mixed_batch(dtype: torch.dtype = torch.float32, requires_grad: bool = False) -> AdvantageInputs:
    """6 rows, groups of 3, 2 and 1; prompt columns, an observation gap and right padding."""
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor(
        [
            [0, 0, 1, 1, 1, 1, 1, 1],
            [0, 0, 1, 1, 0, 0, 1, 0],  # observation at columns 4-5, padding at 7
            [0, 0, 1, 0, 0, 0, 0, 0],
            [0, 1, 1, 1, 0, 1, 1, 1],
            [0, 1, 1, 0, 0, 0, 0, 0],
            [0, 0, 0, 1, 1, 0, 1, 0],
        ]
    )
    scores = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.2, 1.0], dtype=dtype)

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).requires_grad_(requires_grad)

    return AdvantageInputs(
        token_rewards=leaf(outcome_token_rewards(scores, mask) - 0.01 * torch.rand(6, 8, generator=g) * mask),
        scores=leaf(scores),
        groups=torch.tensor([0, 0, 0, 1, 1, 2]),
        response_mask=mask,
        values=leaf(torch.randn(6, 8, generator=g)),  # nonzero on prompt, gap and padding too
        baseline_scores=leaf(torch.tensor([0.5, 0.5, 0.5, 0.0, 0.0, 2.0])),
    )


# ------------------------------------------------------------------------------------- interface


def test_estimator_names_are_the_ones_users_files_spell():
    """The Enum is made of the config's Literal (`choice_enum`), so this pins the public names themselves
    (veRL's and EasyR1's `algorithm.adv_estimator` values): renaming one in the config breaks users' files."""
    assert {e.value for e in AdvEstimator} == {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "grpo_passk",
        "loo_std",
    }
    assert set(ADVANTAGE_ESTIMATORS) == set(AdvEstimator)


def test_compute_advantages_dispatches_by_enum_or_string():
    inputs = outcome_inputs([1.0, 0.0], [0, 0])
    by_enum = compute_advantages(AdvEstimator.RLOO, inputs, AdvantageParams())
    by_name = compute_advantages("rloo", inputs, AdvantageParams())
    assert by_enum[0].tolist() == by_name[0].tolist() == [[1.0], [-1.0]]
    with pytest.raises(ValueError):
        compute_advantages("ppo", inputs, AdvantageParams())


def test_outcome_token_rewards_sit_on_the_last_sampled_token():
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 1], [0, 0, 0, 0]])
    rewards = outcome_token_rewards(torch.tensor([2.0, 3.0, 4.0, 5.0]), mask)
    # a row without sampled tokens gets no reward at all
    assert rewards.tolist() == [[0, 0, 2, 0], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 0, 0]]


# ------------------------------------------------------------------------------------------- GAE


def gae_row(gap: int = 0, gamma: float = 0.5, lam: float = 0.5):
    """Prompt column, sampled tokens with values 0.5, 1.0 | `gap` observation columns | 0.25, pad."""
    obs = [7.0, -3.0, 11.0][:gap]  # values (and would-be rewards) on observation tokens are ignored
    mask = torch.tensor([[0, 1, 1] + [0] * gap + [1, 0]])
    values = torch.tensor([[9.0, 0.5, 1.0, *obs, 0.25, 100.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0] + [0.0] * gap + [1.0, 0.0]])
    inputs = AdvantageInputs(rewards, torch.tensor([1.0]), torch.tensor([0]), mask, values=values)
    return compute_advantages("gae", inputs, AdvantageParams(gamma=gamma, lam=lam, eps=0.0))


def test_gae_hand_values_with_prompt_and_padding():
    adv, returns = gae_row()
    # gamma = lam = 0.5; V after the last sampled token is 0 (the padding's 100 is not bootstrapped)
    # t3: delta = 1 + 0.5 * 0 - 0.25 = 0.75                     A = 0.75
    # t2: delta = 0 + 0.5 * 0.25 - 1.0 = -0.875                 A = -0.875 + 0.25 * 0.75 = -0.6875
    # t1: delta = 0 + 0.5 * 1.0 - 0.5 = 0                       A = 0 + 0.25 * -0.6875 = -0.171875
    # returns = A + V = 0.328125, 0.3125, 1.0
    close(returns, [[0.0, 0.328125, 0.3125, 1.0, 0.0]])
    # whitened: mean -0.0364583, unbiased std 0.728255
    close(adv, [[0.0, -0.185947, -0.893975, 1.079922, 0.0]])


def test_gae_with_gamma_and_lambda_one_returns_the_outcome():
    # gamma = lam = 1: A_t = (sum of later rewards) - V_t = 1 - V_t, so returns = A + V = 1 everywhere
    _, returns = gae_row(gamma=1.0, lam=1.0)
    close(returns, [[0.0, 1.0, 1.0, 1.0, 0.0]])


@pytest.mark.parametrize("gap", [1, 3])
@pytest.mark.parametrize(("gamma", "lam"), [(0.5, 0.5), (0.9, 0.7), (1.0, 1.0)])
def test_gae_skips_an_observation_gap(gap, gamma, lam):
    adv, returns = gae_row(0, gamma, lam)
    adv_gap, returns_gap = gae_row(gap, gamma, lam)
    sampled = [0, 1, 2, 3 + gap, 4 + gap]
    close(adv_gap[:, sampled], adv.tolist())
    close(returns_gap[:, sampled], returns.tolist())
    assert adv_gap[0, 3 : 3 + gap].tolist() == [0.0] * gap
    assert returns_gap[0, 3 : 3 + gap].tolist() == [0.0] * gap


def test_gae_whitens_over_the_whole_batch():
    # two rows, gamma = lam = 1, V = 0: A = the score on every sampled token: 1, 1 | -1
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, -1.0, 0.0]])
    inputs = AdvantageInputs(
        rewards, torch.tensor([1.0, -1.0]), torch.tensor([0, 1]), mask, torch.zeros(2, 3)
    )
    adv, returns = compute_advantages("gae", inputs, NO_EPS)
    assert returns.tolist() == [[1.0, 1.0, 0.0], [0.0, -1.0, 0.0]]
    # mean 1/3, unbiased std sqrt((4/9 + 4/9 + 16/9) / 2) = 1.154701 -> 0.57735, -1.154701
    close(adv, [[0.57735, 0.57735, 0.0], [0.0, -1.154701, 0.0]])


def test_gae_without_values_is_a_clear_error():
    with pytest.raises(ValueError, match="needs critic values"):
        compute_advantages("gae", outcome_inputs([1.0], [0]), AdvantageParams())


# ------------------------------------------------------------------------------------------ GRPO


def test_grpo_through_the_common_interface():
    inputs = outcome_inputs([1.0, 0.0, 1.0, 1.0, 3.0], [0, 0, 1, 1, 2], [[0, 1, 1]] * 5)
    adv, returns = compute_advantages("grpo", inputs, AdvantageParams())
    # group 0: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.707107; group 1: equal scores; 2: singleton
    a = 0.707106
    close(adv, [[0, a, a], [0, -a, -a], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert torch.equal(returns, adv)
    assert torch.equal(adv, grpo_advantages(inputs.scores, inputs.groups, inputs.response_mask))
    dr_grpo, _ = compute_advantages("grpo", inputs, AdvantageParams(norm_adv_by_std_in_grpo=False))
    close(dr_grpo[:, 1], [0.5, -0.5, 0.0, 0.0, 0.0])


# ------------------------------------------------------------------------------------------ RLOO


def test_rloo_hand_values():
    # group 0 (rows 0, 2, 4) = 2, 0, 1: 2 - (0 + 1) / 2 = 1.5, 0 - (2 + 1) / 2 = -1.5, 1 - (2 + 0) / 2 = 0
    # group 1 (rows 1, 3) = 3, 1: 3 - 1 = 2, 1 - 3 = -2; row 5 is alone: 0
    inputs = outcome_inputs([2.0, 3.0, 0.0, 1.0, 1.0, 5.0], [0, 1, 0, 1, 0, 2], [[0, 1, 1]] * 6)
    adv, returns = compute_advantages("rloo", inputs, AdvantageParams())
    close(adv[:, 1], [1.5, 2.0, -1.5, -2.0, 0.0, 0.0])
    assert adv[:, 0].tolist() == [0.0] * 6
    assert torch.equal(adv[:, 1], adv[:, 2])
    assert torch.equal(returns, adv)


# ------------------------------------------------------------------------------------ REINFORCE++


def test_reinforce_plus_plus_hand_values():
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 2.0, 0.0]])
    inputs = AdvantageInputs(rewards, torch.tensor([1.0, 2.0]), torch.tensor([0, 1]), mask)
    adv, returns = compute_advantages("reinforce_plus_plus", inputs, AdvantageParams(gamma=0.5, eps=0.0))
    # return-to-go with gamma 0.5: row 0: 0.25, 0.5, 1; row 1: 1, 2
    assert returns.tolist() == [[0.0, 0.25, 0.5, 1.0], [0.0, 1.0, 2.0, 0.0]]
    # mean 4.75 / 5 = 0.95, unbiased var (0.49 + 0.2025 + 0.0025 + 0.0025 + 1.1025) / 4 = 0.45
    # (G - 0.95) / 0.670820
    close(adv, [[0.0, -1.043498, -0.670820, 0.074536], [0.0, 0.074536, 1.565248, 0.0]])


def test_reinforce_plus_plus_carries_the_return_over_an_observation_gap():
    gamma = AdvantageParams(gamma=0.5, eps=0.0)
    plain = AdvantageInputs(
        torch.tensor([[0.0, 0.0, 4.0]]), torch.tensor([4.0]), torch.tensor([0]), torch.ones(1, 3)
    )
    gap = AdvantageInputs(
        torch.tensor([[0.0, 0.0, 0.0, 0.0, 4.0]]),
        torch.tensor([4.0]),
        torch.tensor([0]),
        torch.tensor([[1, 1, 0, 0, 1]]),
    )
    _, returns = compute_advantages("reinforce_plus_plus", plain, gamma)
    _, returns_gap = compute_advantages("reinforce_plus_plus", gap, gamma)
    # the discount counts sampled tokens only: 1, 2, 4 in both
    assert returns.tolist() == [[1.0, 2.0, 4.0]]
    assert returns_gap.tolist() == [[1.0, 2.0, 0.0, 0.0, 4.0]]


def test_reinforce_plus_plus_baseline_hand_values():
    # rows 0, 1 = group 0 (scores 1, 0: centred 0.5, -0.5); rows 2, 3 = group 1 (1, 1: centred 0, 0);
    # row 4 alone: 0 and left out of the statistics
    mask = [[1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 1, 1]]
    inputs = outcome_inputs([1.0, 0.0, 1.0, 1.0, 3.0], [0, 0, 1, 1, 2], mask)
    adv, returns = compute_advantages("reinforce_plus_plus_baseline", inputs, NO_EPS)
    # tokens 0.5, 0.5, -0.5, 0, 0, 0: mean 1/12, unbiased var 0.708333 / 5, std 0.376386
    a, b, c = 1.107019, -1.549826, -0.221404  # (0.5 - 1/12), (-0.5 - 1/12), (0 - 1/12) over the std
    close(adv, [[a, a, 0.0], [0.0, b, 0.0], [0.0, 0.0, c], [c, c, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(returns, adv)


# ----------------------------------------------------------------------------------------- ReMax


def test_remax_hand_values():
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    inputs = AdvantageInputs(
        torch.zeros(2, 3),
        torch.tensor([1.0, 0.5]),
        torch.tensor([0, 1]),
        mask,
        baseline_scores=torch.tensor([0.25, 1.0]),
    )
    adv, returns = compute_advantages("remax", inputs, AdvantageParams())
    assert adv.tolist() == [[0.0, 0.75, 0.75], [-0.5, -0.5, 0.0]]  # 1 - 0.25, 0.5 - 1
    assert torch.equal(returns, adv)


def test_remax_without_baseline_scores_is_a_clear_error():
    with pytest.raises(ValueError, match="greedy response"):
        compute_advantages("remax", outcome_inputs([1.0], [0]), AdvantageParams())


# ---------------------------------------------------------------------------------- GRPO pass@k


def test_grpo_passk_hand_values():
    # group 0 = 0.2, 1.0, 0.6: only row 1 gets 1.0 - 0.6 = 0.4; unbiased std of the group:
    #   mean 0.6, sqrt((0.16 + 0.16 + 0) / 2) = 0.4 -> 0.4 / 0.4 = 1
    # group 1 = 1, 1: a tie for the best, 1 - 1 = 0; group 2 = a single row: 0
    inputs = outcome_inputs([0.2, 1.0, 0.6, 1.0, 1.0, 5.0], [0, 0, 0, 1, 1, 2], [[0, 1, 1]] * 6)
    adv, returns = compute_advantages("grpo_passk", inputs, NO_EPS)
    close(adv[:, 1], [0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert torch.equal(adv[:, 1], adv[:, 2]) and adv[:, 0].tolist() == [0.0] * 6
    assert torch.equal(returns, adv)
    unnormalised, _ = compute_advantages("grpo_passk", inputs, AdvantageParams(norm_adv_by_std_in_grpo=False))
    close(unnormalised[:, 1], [0.0, 0.4, 0.0, 0.0, 0.0, 0.0])


def test_grpo_passk_second_best_is_taken_among_the_others():
    # rows 0 and 3 tie at 0.5 but 2.0 is the best: 2.0 - 0.5 = 1.5, interleaved with another group
    inputs = outcome_inputs([0.5, 9.0, 2.0, 0.5, 8.0], [0, 1, 0, 0, 1])
    adv, _ = compute_advantages("grpo_passk", inputs, AdvantageParams(norm_adv_by_std_in_grpo=False))
    close(adv[:, 0], [0.0, 1.0, 1.5, 0.0, 0.0])


# --------------------------------------------------------------------------------------- loo_std


def test_loo_std_matches_nemo_rl_numbers():
    # NeMo RL's own test: rewards 1, 2, 3 -> baselines 2.5, 2.0, 1.5 and stds 0.707107, 1.414214, 0.707107
    #   -> (1 - 2.5) / 0.707107 = -2.121320, 0, (3 - 1.5) / 0.707107 = 2.121320
    # a pair 4, 6: one other each, std 0 -> not divided: -2, 2
    # 1, 0, 0: row 0's others are equal (std 0): 1 - 0 = 1; rows 1, 2: others 1, 0 -> -0.5 / 0.707107
    # a single row: 0
    scores = [1.0, 2.0, 3.0, 4.0, 6.0, 1.0, 0.0, 0.0, 7.0]
    inputs = outcome_inputs(scores, [0, 0, 0, 1, 1, 2, 2, 2, 3])
    adv, returns = compute_advantages("loo_std", inputs, NO_EPS)
    close(adv[:, 0], [-2.121320, 0.0, 2.121320, -2.0, 2.0, 1.0, -0.707107, -0.707107, 0.0])
    assert torch.equal(returns, adv)
    rloo, _ = compute_advantages("rloo", inputs, NO_EPS)  # the same baseline, never divided
    close(rloo[:, 0], [-1.5, 0.0, 1.5, -2.0, 2.0, 1.0, -0.5, -0.5, 0.0])


def test_loo_std_is_not_divided_when_the_others_are_exactly_equal():
    # row 0's others are 0.9, 0.9, 0.9: std 0, so A = 0.5 - 0.9 = -0.4 and not -0.4 / ~eps (in float32
    # the mean of three 0.9 is not 0.9, so a two-pass variance would leave ~5e-15 behind);
    # rows 1-3: others 0.5, 0.9, 0.9, mean 2.3 / 3, std sqrt((0.0711111 + 2 * 0.0177778) / 2) = 0.230940
    #   -> (0.9 - 0.766667) / 0.230940 = 0.577350 = sqrt(3) / 3
    inputs = outcome_inputs([0.5, 0.9, 0.9, 0.9], [0, 0, 0, 0])
    adv, _ = compute_advantages("loo_std", inputs, AdvantageParams())
    close(adv[:, 0], [-0.4, math.sqrt(3) / 3, math.sqrt(3) / 3, math.sqrt(3) / 3])


# ------------------------------------------------------------------------ properties of every one


@pytest.mark.parametrize("estimator", ALL)
def test_zero_outside_the_response_mask(estimator):
    inputs = mixed_batch()
    adv, returns = compute_advantages(estimator, inputs, AdvantageParams(gamma=0.9, lam=0.95))
    outside = inputs.response_mask == 0
    assert adv.shape == returns.shape == inputs.response_mask.shape
    assert torch.isfinite(adv).all() and torch.isfinite(returns).all()
    assert (adv[outside] == 0).all() and (returns[outside] == 0).all()
    assert (adv[~outside] != 0).any()


@pytest.mark.parametrize("estimator", ALL)
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_singleton_groups_are_zero_never_nan(estimator, eps):
    inputs = mixed_batch()._replace(groups=torch.arange(6))  # every row alone
    adv, returns = compute_advantages(estimator, inputs, AdvantageParams(eps=eps))
    assert torch.isfinite(adv).all() and torch.isfinite(returns).all()
    if estimator in GROUP_RELATIVE:
        assert (adv == 0).all() and (returns == 0).all()


@pytest.mark.parametrize(
    "estimator", [AdvEstimator.GAE, AdvEstimator.REINFORCE_PLUS_PLUS, AdvEstimator.REMAX]
)
def test_estimators_without_groups_ignore_them(estimator):
    inputs = mixed_batch()
    adv, returns = compute_advantages(estimator, inputs, AdvantageParams())
    alone, alone_returns = compute_advantages(
        estimator, inputs._replace(groups=torch.arange(6)), AdvantageParams()
    )
    assert torch.equal(adv, alone) and torch.equal(returns, alone_returns)


@pytest.mark.parametrize("estimator", ALL)
def test_advantages_carry_no_gradient(estimator):
    # every estimator runs under torch.no_grad(): inputs that require grad give constant outputs
    inputs = mixed_batch(requires_grad=True)
    adv, returns = compute_advantages(estimator, inputs, AdvantageParams())
    assert not adv.requires_grad and adv.grad_fn is None
    assert not returns.requires_grad and returns.grad_fn is None
    # and the inputs can still take part in a graph afterwards
    inputs.values.sum().backward()
    assert inputs.values.grad is not None


@pytest.mark.parametrize("estimator", ALL)
def test_outputs_follow_the_input_dtype(estimator):
    adv, returns = compute_advantages(estimator, mixed_batch(torch.float64), AdvantageParams())
    assert adv.dtype == returns.dtype == torch.float64


@pytest.mark.parametrize(  # REINFORCE++'s baseline whitens over the batch afterwards: a tied group moves with it
    "estimator", [e for e in GROUP_RELATIVE if e != AdvEstimator.REINFORCE_PLUS_PLUS_BASELINE]
)
@pytest.mark.parametrize(("value", "n"), [(0.6, 6), (0.1, 7), (0.7, 12), (0.3, 5), (1.0, 6)])
def test_a_group_of_equal_scores_gets_exactly_zero(estimator, value, n):
    """n equal scores summed in float32 and divided by n can miss the value by a last bit (0.6 six times);
    the group still has nothing to learn from: every advantage is exactly 0, so no rounding pushes it
    and `worker.actor.skip_zero_advantage` can leave its rows out. A mixed group beside it is unchanged."""
    scores = [value] * n + [0.0, 1.0, 1.0]
    groups = [0] * n + [1, 1, 1]
    adv, _ = compute_advantages(estimator, outcome_inputs(scores, groups), AdvantageParams())
    assert adv[:n].eq(0).all()
    if estimator != AdvEstimator.GRPO_PASSK:  # pass@k gives the best row alone a nonzero advantage
        assert adv[n:].ne(0).all()
