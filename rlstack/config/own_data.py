"""Defaults that are the tiny demo's, kept out of a run on the user's own rows.

rlstack's defaults make `rlstack train` with no config the embedded demo: `builtin:addition`, 64-token
prompts, 16-token responses, validation on `builtin:addition@test`, `builtin:exact_match`. A config whose
`data.train_files` names its own rows (not a `builtin:` task) would inherit those silently, so there:

- `data.val_files` left out means no validation rows (EasyR1's default), not the demo's test split;
- `data.max_prompt_length`, `data.max_response_length` and `worker.reward.reward_function` left out are
  problems that name the key (EasyR1's lengths are 512 / 512; it has no default reward either).

A config that names its own model (not a `builtin:` one) and no `data.train_files` trains it on the demo's
task: a note says so (the tests' tiny models do that on purpose).

EasyR1's and NeMo RL's files are translated first and set these keys their own way
(`compat.easyr1.EASYR1_DEFAULTS`, `compat.nemo_rl`).
"""

from __future__ import annotations

import rlstack.config.tree as tree
from rlstack.config.data import DataConfig
from rlstack.config.reward import RewardConfig

MUST_SET = {
    "data.max_prompt_length": "its default (64 tokens) is the tiny demo's; EasyR1's is 512",
    "data.max_response_length": "its default (16 tokens) is the tiny demo's; EasyR1's is 512",
    "worker.reward.reward_function": (
        "its default (builtin:exact_match) is the tiny demo's: name yours (path/to/file.py:fn) or a built-in "
        "(builtin:math, builtin:code, ...)"
    ),
}


def own_data_rule(values: dict, problems: list[str], rewards: bool = True, trains: bool = True) -> list[str]:
    """The problems and notes of a config on its own rows that leaves the demo's keys unset; the notes.
    `rewards=False`: a supervised run, which scores nothing. `trains=False`: an evaluation, which reads
    no training rows."""
    rows = tree.get(values, "data.train_files")
    if rows is tree.MISSING and trains:
        return own_model_note(values, rewards)
    if not isinstance(rows, str) or not rows or rows.startswith("builtin:"):
        return []
    for key, why in MUST_SET.items():
        if key == "worker.reward.reward_function" and not rewards:
            continue
        if tree.get(values, key) is tree.MISSING and not any(p.startswith(key) for p in problems):
            problems.append(f"{key} is not set for data.train_files={rows!r}: {why}; set {key}")
    if tree.get(values, "data.val_files") is tree.MISSING:
        tree.set(values, "data.val_files", "")
        return [
            f"data.val_files is not set for data.train_files={rows!r}: no validation rows (the default, "
            "builtin:addition@test, is the tiny demo's); set data.val_files or data.val_split to validate"
        ]
    return []


def own_model_note(values: dict, rewards: bool = True) -> list[str]:
    """A config that names its own model and no data trains it on the demo's task: said, not silent."""
    model = tree.get(values, "worker.actor.model.model_path")
    if not isinstance(model, str) or model.startswith("builtin:"):
        return []
    data, reward = DataConfig(), RewardConfig()  # the defaults, which are the demo's
    demo = {
        "data.max_prompt_length": f"{data.max_prompt_length} tokens",
        "data.max_response_length": f"{data.max_response_length} tokens",
        "worker.reward.reward_function": reward.reward_function,
    }
    if not rewards:
        del demo["worker.reward.reward_function"]
    left = [f"{key}={value}" for key, value in demo.items() if tree.get(values, key) is tree.MISSING]
    also = f", with the demo's {', '.join(left)}" if left else ""
    return [
        f"data.train_files is not set: worker.actor.model.model_path={model!r} trains on the tiny demo's task "
        f"(builtin:addition){also}; set data.train_files to train on your rows"
    ]
