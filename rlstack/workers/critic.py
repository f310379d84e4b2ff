"""The critic: a value model (the policy's architecture with a scalar head) for GAE."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForTokenClassification

from rlstack.algos.policy_loss import token_mean
from rlstack.algos.value_loss import clipped_value_loss, explained_variance
from rlstack.batch import Batch, columns_read_by
from rlstack.config import CriticConfig
from rlstack.config.actor import heads_problem
from rlstack.errors import RLStackError
from rlstack.models import ulysses
from rlstack.models.loading import DTYPES, ModelLoadError, resolve_model_path
from rlstack.models.vision import position_ids
from rlstack.workers import distributed
from rlstack.workers.distributed import MiniBatchTotals
from rlstack.workers.group import MODEL_INPUTS, Dispatch, remote
from rlstack.workers.training import MicroBatching, apply_optim_config, build_optimizer, optimizer_steps


class CriticWorker:
    """`values[b, t]` estimates the return from the state just before token t (aligned with log-probs)."""

    def __init__(
        self,
        cfg: CriticConfig,
        actor_model_path: str,
        total_steps: int,
        device: str = "cpu",
        ulysses_size: int = 1,
    ):
        """`ulysses_size`: the policy's (`worker.actor.ulysses_size`): the critic splits its padding-free passes
        over the same sequence-parallel groups."""
        self.cfg = cfg
        path = resolve_model_path(cfg.model.model_path) if cfg.model.model_path else actor_model_path
        self.sequence_group = distributed.sequence_group(ulysses_size)
        self.model = self._load(path).to(device)
        if distributed.sharded():
            distributed.shard_model(self.model, device)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, total_steps)
        dynamic = cfg.dynamic_batching
        self.experience_micro_batching = MicroBatching.of(
            cfg.micro_batch_size_per_device_for_experience,
            cfg.max_token_len_per_device_for_experience,
            dynamic,
            "worker.critic",
            "experience",
        )
        self.update_micro_batching = MicroBatching.of(
            cfg.micro_batch_size_per_device_for_update,
            cfg.max_token_len_per_device_for_update,
            dynamic,
            "worker.critic",
            "update",
        )

    def _load(self, path: str) -> torch.nn.Module:
        trust = self.cfg.model.trust_remote_code
        try:
            config = AutoConfig.from_pretrained(path, num_labels=1, trust_remote_code=trust)
            config.classifier_dropout = 0.0  # transformers' head would drop 10% of the features in training
            split = {} if self.sequence_group is None else {"attn_implementation": ulysses.NAME}
            model, info = AutoModelForTokenClassification.from_pretrained(
                path,
                config=config,
                dtype=DTYPES[self.cfg.model.dtype],
                trust_remote_code=trust,
                output_loading_info=True,
                **split,
            )
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"could not load a critic from {path!r}: {e}") from e
        if self.sequence_group is not None:
            size = torch.distributed.get_world_size(self.sequence_group)
            if problem := heads_problem(size, *ulysses.heads(config), path):
                raise RLStackError(problem)
        head = model.score  # transformers' name for the token-classification head of decoder LMs
        if any(k.startswith("score.") for k in info["missing_keys"]):
            with torch.no_grad():  # a new head starts at value 0 rather than at noise
                head.weight.zero_()
                if head.bias is not None:
                    head.bias.zero_()
        return model

    def _values(self, b: Batch) -> torch.Tensor:
        b = b.to(self.model.device)
        ids, mask = b["input_ids"], b["attention_mask"]
        positions = position_ids(self.model, ids, mask)
        if self.cfg.padding_free:  # the rows end to end without padding, as the policy's padding_free
            attended = mask.bool()
            packed_ids, packed_positions = ids[attended][None], positions[attended][None]
            split = {}
            if self.sequence_group is not None:  # each rank runs its slice (`rlstack.models.ulysses`)
                ulysses.install(self.model)
                every = torch.arange(packed_ids.shape[1], device=ids.device)
                sp = ulysses.shard_packed(self.sequence_group, packed_ids, packed_positions, every)
                packed_ids, packed_positions = sp.input_ids, sp.position_ids
                split = {"sequence_shard": sp.shard}
            # no cache: Hugging Face finds the packed rows (where the positions restart) only without one
            out = self.model(
                input_ids=packed_ids,
                attention_mask=None,
                position_ids=packed_positions,
                use_cache=False,
                **split,
            )
            packed = out.logits[0, :, 0].float()
            if split:  # the values of the slice's tokens (not its padding), gathered from the group
                packed = ulysses.gather_pieces(packed[sp.keep], self.sequence_group, sp.pieces)
            v = out.logits.new_zeros(ids.shape, dtype=torch.float32)
            v[attended] = packed
        else:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions)
            v = out.logits[..., 0].float()  # [B, T]: value of the prefix ending at each column
        shifted = torch.zeros_like(v)
        shifted[:, 1:] = v[:, :-1]
        return shifted * b["response_mask"]

    @remote(Dispatch.ROWS, reads=MODEL_INPUTS)
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        self.model.eval()
        values = self.experience_micro_batching.map(batch, lambda mb: self._values(mb).cpu(), "value pass")
        return batch.update({"values": values})

    @remote(Dispatch.MINI_BATCHES, reads=(*MODEL_INPUTS, *columns_read_by("critic")))
    def update(self, batch: Batch, mini_batch_size: int) -> dict[str, float]:
        def micro_loss(mb: Batch, totals: MiniBatchTotals):
            mb = mb.to(self.model.device)
            mask, normalizer = mb["response_mask"].float(), totals.tokens
            out = clipped_value_loss(
                self._values(mb), mb["values"], mb["returns"], mask, self.cfg.cliprange_value
            )
            loss = token_mean(out.loss, mask, normalizer)
            return loss, {
                "critic/vf_loss": loss.detach(),
                "critic/vf_clipfrac": token_mean(out.clipped, mask, normalizer),
            }

        c = self.cfg
        metrics = optimizer_steps(
            self.model,
            self.optimizer,
            self.scheduler,
            batch,
            micro_loss,
            mini_batch_size,
            self.update_micro_batching,
            c.ppo_epochs,
            c.max_grad_norm,
            role="critic",
            sequence_group=self.sequence_group,
        )
        metrics["critic/vf_explained_var"] = float(
            explained_variance(batch["values"], batch["returns"], batch["response_mask"])
        )
        return metrics

    @remote(Dispatch.ALL)
    def save_checkpoint(self, path: Path) -> None:
        """Like the policy's: the Hugging Face model, and with several ranks the sharded state too."""
        distributed.save_pretrained(self.model, path / "critic")
        state = {"scheduler": self.scheduler.state_dict()}
        if distributed.sharded():
            distributed.save_sharded(self.model, self.optimizer, path / "critic_dcp")
        else:
            state["optimizer"] = self.optimizer.state_dict()
        if distributed.current().rank == 0:
            torch.save(state, path / "critic_state.pt")

    @remote(Dispatch.ALL)
    def load_checkpoint(self, path: Path) -> None:
        s = torch.load(path / "critic_state.pt", map_location="cpu", weights_only=False)
        if (path / "critic_dcp").is_dir() or distributed.sharded():
            distributed.load_sharded(self.model, self.optimizer, path / "critic_dcp")
        else:
            saved = self._load(str(path / "critic"))
            self.model.load_state_dict(saved.state_dict())
            self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])
        apply_optim_config(self.optimizer, self.scheduler, self.cfg.optim)
