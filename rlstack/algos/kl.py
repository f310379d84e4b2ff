"""KL estimators between the policy and the reference policy, per token.

`low_var_kl` is Schulman's k3 estimator (http://joschu.net/blog/kl-approx.html) of
KL(pi || pi_ref) from samples of pi: k3 = exp(ref - logp) - (ref - logp) - 1, which is
unbiased and never negative. As in veRL, the value is clamped to [-10, 10] to keep rare
huge ratios from dominating a step.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import torch


class KLPenalty(str, Enum):
    LOW_VAR_KL = "low_var_kl"


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 per token. [B, T], [B, T] -> [B, T]"""
    log_ratio = ref_logprobs - logprobs
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)


KL_ESTIMATORS: dict[KLPenalty, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    KLPenalty.LOW_VAR_KL: low_var_kl
}
