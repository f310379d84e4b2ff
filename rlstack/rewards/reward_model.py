"""A reward model served in the trainer's process: a Hugging Face decoder sequence-classification model
with one output (Skywork-Reward, a Bradley-Terry model trained with TRL's `RewardTrainer`, ...), scoring
each prompt and response (veRL's `reward_model`, NeMo RL's reward-model environment). Encoders (DeBERTa,
RoBERTa) are refused: they pool another token than the last.

Each row is scored as the model was trained to read it: the row's chat messages (`prompt_messages`) with the response as
the assistant's turn, through the reward model's own chat template (the policy's template may differ,
veRL's `input_tokenizer` case). Without a template (or without the row's messages) the text is the
policy's prompt followed by the response. Rows are left-padded into micro-batches of similar length and
the score is the model's output at each row's last token. A text longer than `max_length` keeps its
last `max_length` tokens (the response's end) and is counted in `reward/rm_truncated`, or fails naming
the row with `truncation=error`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from rlstack.config import RewardModelConfig
from rlstack.errors import RLStackError


class RewardModelError(RLStackError, ValueError):
    """A reward model that cannot be loaded or cannot score a row, with how to fix it."""


KEY = "worker.reward.reward_model"


class RewardModel:
    """The loaded model and tokenizer of `worker.reward.reward_model`, and `score` over reward inputs."""

    def __init__(self, cfg: RewardModelConfig):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not cfg.model_path:
            raise RewardModelError(
                f"builtin:reward_model needs {KEY}.model_path: a Hugging Face sequence-classification model "
                "with one output (num_labels=1)"
            )
        self.cfg = cfg
        device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RewardModelError(
                f"{KEY}.device={cfg.device!r}, but this machine has no CUDA device: use auto or cpu"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(
                cfg.model_path, trust_remote_code=cfg.trust_remote_code
            )
            model = AutoModelForSequenceClassification.from_pretrained(
                cfg.model_path, dtype=getattr(torch, cfg.dtype), trust_remote_code=cfg.trust_remote_code
            )
        except (OSError, ValueError) as e:
            raise RewardModelError(
                f"{KEY}.model_path={cfg.model_path!r} cannot be loaded as a reward model: {e}"
            ) from e
        from transformers.modeling_layers import GenericForSequenceClassification

        if not isinstance(model, GenericForSequenceClassification):
            raise RewardModelError(
                f"{KEY}.model_path={cfg.model_path!r} is a {type(model).__name__}: reward models here are decoder "
                "models with a score head read at the text's last token (Qwen, Llama, Mistral, Gemma, ... "
                "ForSequenceClassification); an encoder (DeBERTa, RoBERTa) pools elsewhere and is not supported"
            )
        if model.config.num_labels != 1:
            raise RewardModelError(
                f"{KEY}.model_path={cfg.model_path!r} has {model.config.num_labels} outputs (num_labels); a reward "
                "model has one: a scalar score per text"
            )
        text_config = model.config.get_text_config()
        if text_config.pad_token_id is None:  # batches of several rows need one (the score never reads it)
            ids = (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, 0)
            text_config.pad_token_id = next(i for i in ids if i is not None)
        self.model = model.to(device).eval().requires_grad_(False)
        self.device = torch.device(device)
        self.pad_id = text_config.pad_token_id
        self.chat = getattr(self.tokenizer, "chat_template", None) is not None
        _quiet_padding_warning()

    def text(self, x: dict[str, Any]) -> str:
        """What the reward model reads for one reward input (see the module docstring)."""
        messages = x.get("prompt_messages")
        if self.chat and messages:
            turns = [*messages, {"role": "assistant", "content": str(x["response"])}]
            return self.tokenizer.apply_chat_template(turns, tokenize=False)
        return str(x.get("prompt", "")) + str(x["response"])

    def token_ids(self, reward_inputs: list[dict[str, Any]]) -> tuple[list[list[int]], list[bool]]:
        """Each input's token ids (at most `max_length`) and whether it was cut."""
        ids, cut = [], []
        for i, x in enumerate(reward_inputs):
            row = self.tokenizer(
                self.text(x), add_special_tokens=not (self.chat and x.get("prompt_messages"))
            )["input_ids"]
            too_long = len(row) > self.cfg.max_length
            if too_long and self.cfg.truncation == "error":
                raise RewardModelError(
                    f"reward input {i} is {len(row)} tokens for the reward model, more than {KEY}.max_length="
                    f"{self.cfg.max_length}: raise it, or set {KEY}.truncation=left to keep the last tokens"
                )
            ids.append(row[-self.cfg.max_length :])
            cut.append(too_long)
        return ids, cut

    @torch.inference_mode()
    def score(self, reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
        """`rm_score` (the model's output) and `rm_truncated` (1 where the text was cut) per input."""
        ids, cut = self.token_ids(reward_inputs)
        scores = [0.0] * len(ids)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a micro-batch
        size = self.cfg.micro_batch_size
        # Pooling: the output at the last position of left-padded rows, which is each row's last token. Hugging
        # Face's classification heads find it from the pad token in `input_ids`, which picks the wrong token
        # where the pad token is also the text's last (pad = EOS); embeddings make it read the last position.
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            width = max(len(ids[i]) for i in rows)
            batch = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for r, i in enumerate(rows):
                batch[r, width - len(ids[i]) :] = torch.tensor(ids[i])
                mask[r, width - len(ids[i]) :] = 1
            batch, mask = batch.to(self.device), mask.to(self.device)
            out = self.model(
                inputs_embeds=self.model.get_input_embeddings()(batch),
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            )
            for i, value in zip(rows, out.logits[:, 0].float().tolist()):
                scores[i] = value
        return [{"overall": s, "rm_score": s, "rm_truncated": float(c)} for s, c in zip(scores, cut)]


class _PaddingWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "inputs_embeds" not in record.getMessage()


def _quiet_padding_warning() -> None:
    """Drop the classification head's warning about padding in `inputs_embeds`: `score` reads the last
    position of left-padded rows, which is each row's last token, on purpose."""
    log = logging.getLogger("transformers.modeling_layers")
    if not any(isinstance(f, _PaddingWarning) for f in log.filters):
        log.addFilter(_PaddingWarning())
