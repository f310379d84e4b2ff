"""A short seeded GRPO run on the random tiny model, shared by the Ray and asynchronous-GRPO tests.

The random tiny model never answers an addition right: the reward is the share of digits in the
response (plus a bonus for ending early), so that advantages, losses and gradients are not zero.
"""

from __future__ import annotations

from pathlib import Path

from rlstack.config import Config, load_config

REWARD = """
REWARD_TYPE = "sequential"

def compute_score(reward_input):
    text = reward_input["response"]
    return {"overall": sum(c.isdigit() for c in text) / max(1, len(text)) + 0.5 * (len(text) < 4)}
"""


def digits_run(model: Path, out: Path, name: str, *extra: str, steps: int = 3) -> Config:
    """`steps` GRPO steps of 4 prompts x 4 samples in two mini-batches (old log-probs, two optimizer
    steps per batch), under `out/<project>/<name>`."""
    reward = out / "reward.py"
    reward.parent.mkdir(parents=True, exist_ok=True)
    reward.write_text(REWARD)
    return load_config(
        [
            f"worker.actor.model.model_path={model}",
            f"trainer.output_dir={out}",
            f"trainer.experiment_name={name}",
            "data.train_files=builtin:addition@train",
            "data.val_files=",
            "data.rollout_batch_size=4",
            "data.max_response_length=6",
            "worker.rollout.n=4",
            "worker.actor.global_batch_size=2",
            "worker.actor.micro_batch_size_per_device_for_update=4",
            "worker.actor.optim.lr=1e-3",
            f"worker.reward.reward_function={reward}:compute_score",
            f"trainer.max_steps={steps}",
            "trainer.logger=[file]",
            "trainer.save_freq=-1",
            "trainer.num_threads=1",
            *extra,
        ]
    )


# The agentic GRPO run on the visual task with the sandboxed Python tool (tests/helpers/visual_agent.py's model).
AGENT_RUN = [
    "data.train_files=builtin:visual@test",
    "data.val_files=",
    "data.max_prompt_length=256",
    "data.max_response_length=160",
    "data.min_pixels=3136",
    "data.max_pixels=12544",
    "data.rollout_batch_size=2",
    "worker.actor.global_batch_size=2",
    "worker.rollout.n=4",
    "worker.actor.optim.lr=1e-4",
    "worker.rollout.agent.tools=[{name: python, import_path: 'builtin:python'}]",
    "worker.rollout.agent.max_turns=3",
    "worker.reward.reward_function=builtin:agent",
    "trainer.max_steps=2",
    "trainer.logger=[file]",
    "trainer.save_model_only=true",
]
