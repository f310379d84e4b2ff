"""Top-fraction token selection and the batch-level high-entropy mask, by hand."""

from __future__ import annotations

import pytest
import torch

from rlstack.algos.entropy import high_entropy_mask, top_fraction_mask
from rlstack.algos.policy_loss import token_mean

T, F = True, False


def test_top_fraction_mask_is_per_row_and_skips_masked_positions():
    values = torch.tensor([[0.5, 0.9, 0.1, 0.7], [0.3, 0.2, 0.8, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    # row 0: n = 4, k = 2 -> 0.9, 0.7; row 1: n = 2, k = 1 -> 0.3 (0.8 is masked out)
    assert top_fraction_mask(values, mask, 0.5).tolist() == [[F, T, F, T], [T, F, F, F]]


@pytest.mark.parametrize(
    ("n", "fraction", "k"), [(10, 0.7, 7), (5, 0.2, 1), (5, 0.3, 2), (3, 0.0, 0), (3, 1.0, 3)]
)
def test_top_fraction_mask_keeps_ceil_of_fraction_times_n(n: int, fraction: float, k: int):
    values = torch.arange(n, dtype=torch.float32)[None]
    out = top_fraction_mask(values, torch.ones(1, n), fraction)
    assert int(out.sum()) == k
    assert out[0, n - k :].all()  # the k largest are the last k


def test_top_fraction_mask_ties_go_to_the_earlier_position():
    out = top_fraction_mask(torch.ones(1, 4), torch.ones(1, 4), 0.5)
    assert out.tolist() == [[T, T, F, F]]


def test_top_fraction_mask_row_without_tokens_selects_nothing():
    out = top_fraction_mask(torch.tensor([[9.0, 9.0]]), torch.zeros(1, 2), 1.0)
    assert out.tolist() == [[F, F]]


def test_top_fraction_mask_rejects_a_bad_fraction():
    for fraction in (-0.1, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            top_fraction_mask(torch.ones(1, 2), torch.ones(1, 2), fraction)


def test_high_entropy_mask_ranks_over_the_whole_batch():
    entropy = torch.tensor([[2.0, 0.1, 0.5], [1.0, 3.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # N = 5 sampled tokens, k = ceil(0.4 * 5) = 2 -> 3.0 and 2.0; 9.0 is not sampled.
    # (Per response it would have been 2.0, 0.5 in row 0 and 3.0 in row 1.)
    assert high_entropy_mask(entropy, mask, 0.4).tolist() == [[T, F, F], [F, T, F]]
    assert high_entropy_mask(entropy, mask, 1.0).tolist() == mask.bool().tolist()


def test_high_entropy_mask_ties_across_rows_go_to_the_earlier_row():
    out = high_entropy_mask(torch.ones(2, 2), torch.ones(2, 2), 0.5)
    assert out.tolist() == [[T, T], [F, F]]


def test_high_entropy_mask_gradient_reaches_only_selected_tokens():
    entropy = torch.tensor([[2.0, 0.1, 0.5], [1.0, 3.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    keep = high_entropy_mask(entropy, mask, 0.4)
    assert keep.dtype == torch.bool and not keep.requires_grad
    per_token_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    token_mean(per_token_loss * keep, mask).backward()
    # token-mean over the 5 sampled tokens: 1 / 5 on the two selected, 0 elsewhere
    torch.testing.assert_close(per_token_loss.grad, torch.tensor([[0.2, 0.0, 0.0], [0.0, 0.2, 0.0]]))
    assert entropy.grad is None
