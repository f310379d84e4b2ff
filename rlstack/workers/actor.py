"""The actor (trained policy, with its colocated HF rollout engine) and the frozen reference model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from rlstack.algos.kl import KL_ESTIMATORS, KLPenalty
from rlstack.algos.policy_loss import ppo_clip_loss, token_mean
from rlstack.batch import Batch
from rlstack.config import ActorConfig, AlgorithmConfig, RolloutConfig
from rlstack.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlstack.models.logprobs import forward_logprobs
from rlstack.rollout.hf import HFEngine
from rlstack.workers.training import build_optimizer, optimizer_steps

# loss_fn(micro_batch, logprobs, normalizer) -> (loss, {metric: value summed over the mini-batch})
LossFn = Callable[[Batch, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _model_inputs(b: Batch) -> dict[str, torch.Tensor]:
    return {k: b[k] for k in ("input_ids", "attention_mask", "position_ids", "response_mask")}


class ActorWorker:
    """Owns the policy model, its optimizer and scheduler, and the rollout engine that samples from it."""

    def __init__(
        self,
        actor: ActorConfig,
        rollout: RolloutConfig,
        algorithm: AlgorithmConfig,
        max_response_length: int,
        total_steps: int,
    ):
        self.cfg, self.rollout_cfg, self.algo = actor, rollout, algorithm
        path = resolve_model_path(actor.model.model_path)
        self.tokenizer = load_tokenizer(actor.model.tokenizer_path or path, actor.model.trust_remote_code)
        self.model = load_causal_lm(path, actor.model.dtype, actor.model.trust_remote_code)
        self.model.train()
        self.engine = HFEngine(self.model, self.tokenizer, max_response_length, seed=rollout.seed)
        self.optimizer, self.scheduler = build_optimizer(self.model, actor.optim, total_steps)

    # ------------------------------------------------------------------------------ rollout

    def generate(self, prompts: Batch, validate: bool = False) -> Batch:
        r = self.rollout_cfg
        if validate:
            return self.engine.generate(prompts, r.val_n, r.val_temperature, r.val_top_p, r.val_top_k)
        return self.engine.generate(prompts, r.n, r.temperature, r.top_p, r.top_k)

    # ----------------------------------------------------------------------------- log-probs

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch) -> Batch:
        """Adds `old_logprobs` and `entropy` [B, T] under the current weights."""
        logp, ent = _batched_logprobs(
            self.model, batch, self.cfg.micro_batch_size_per_device_for_experience, with_entropy=True
        )
        return batch.update({"old_logprobs": logp, "entropy": ent})

    # -------------------------------------------------------------------------------- update

    def update(self, batch: Batch, mini_batch_size: int) -> dict[str, float]:
        """PPO-clip update over `ppo_epochs` passes of mini-batches of `mini_batch_size` trajectories."""
        c = self.cfg
        kl_fn = KL_ESTIMATORS[KLPenalty(self.algo.kl_penalty)] if self.algo.use_kl_loss else None

        def ppo_loss(mb: Batch, logp: torch.Tensor, normalizer: torch.Tensor):
            mask = mb["response_mask"].float()
            old = mb["old_logprobs"] if "old_logprobs" in mb else logp.detach()
            out = ppo_clip_loss(logp, old, mb["advantages"], mask, c.clip_ratio_low, c.clip_ratio_high)
            pg_loss = token_mean(out.loss, mask, normalizer)
            stats = {
                "actor/pg_loss": pg_loss.detach(),
                "actor/pg_clipfrac": token_mean(out.clipped, mask, normalizer),
                "actor/ppo_kl": token_mean(out.approx_kl, mask, normalizer),
            }
            loss = pg_loss
            if kl_fn is not None:
                kl_loss = token_mean(kl_fn(logp, mb["ref_logprobs"]), mask, normalizer)
                loss = loss + self.algo.kl_coef * kl_loss
                stats["actor/kl_loss"] = kl_loss.detach()
            return loss, stats

        metrics = self._train(
            batch, mini_batch_size, ppo_loss, epochs=c.ppo_epochs, shuffle=c.shuffle_mini_batches
        )
        if kl_fn is not None:
            metrics["actor/kl_coef"] = self.algo.kl_coef
        return metrics

    def sft_update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step of supervised fine-tuning: mean NLL of the `response_mask` tokens."""

        def nll(mb: Batch, logp: torch.Tensor, normalizer: torch.Tensor):
            loss = token_mean(-logp, mb["response_mask"].float(), normalizer)
            return loss, {"sft/loss": loss.detach()}

        return self._train(batch, len(batch), nll, epochs=1, shuffle=False)

    def _train(
        self, batch: Batch, mini_batch_size: int, loss_fn: LossFn, epochs: int, shuffle: bool
    ) -> dict[str, float]:
        temperature = batch.meta.get("temperature", 1.0)

        def micro_loss(micro: Batch, normalizer: torch.Tensor):
            logp, ent = forward_logprobs(
                self.model, **_model_inputs(micro), temperature=temperature, with_entropy=True
            )
            loss, stats = loss_fn(micro, logp, normalizer)
            stats["actor/entropy"] = token_mean(ent, micro["response_mask"].float(), normalizer)
            return loss, stats

        c = self.cfg
        return optimizer_steps(
            self.model,
            self.optimizer,
            self.scheduler,
            batch,
            micro_loss,
            mini_batch_size,
            c.micro_batch_size_per_device_for_update,
            epochs,
            c.max_grad_norm,
            role="actor",
            shuffle_seed=self.rollout_cfg.seed if shuffle else None,
        )

    # --------------------------------------------------------------------------- checkpoints

    def save_model(self, path: Path) -> None:
        """The model and tokenizer in Hugging Face format (loadable with `from_pretrained`)."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def save_checkpoint(self, path: Path) -> None:
        self.save_model(path / "model")
        torch.save(
            {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "engine": self.engine.state_dict(),
            },
            path / "actor_state.pt",
        )

    def load_checkpoint(self, path: Path) -> None:
        # from_pretrained reads sharded weights and ties embeddings; its tensors are copied in place
        # so that the optimizer, which holds the live parameters, stays attached to them.
        saved = load_causal_lm(str(path / "model"), self.cfg.model.dtype, self.cfg.model.trust_remote_code)
        self.model.load_state_dict(saved.state_dict())
        del saved
        s = torch.load(path / "actor_state.pt", weights_only=False)
        self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])
        self.engine.load_state_dict(s["engine"])


class RefWorker:
    """A frozen copy of the initial policy, for KL terms."""

    def __init__(self, actor: ActorConfig, micro_batch_size: int):
        path = resolve_model_path(actor.model.model_path)
        self.model = load_causal_lm(path, actor.model.dtype, actor.model.trust_remote_code).eval()
        self.model.requires_grad_(False)
        self.micro_batch_size = micro_batch_size

    @torch.no_grad()
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        logp, _ = _batched_logprobs(self.model, batch, self.micro_batch_size, with_entropy=False)
        return batch.update({"ref_logprobs": logp})


def _batched_logprobs(
    model, batch: Batch, micro: int, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    temperature = batch.meta.get("temperature", 1.0)
    logps, ents = [], []
    for mb in batch.split(micro):
        lp, ent = forward_logprobs(
            model, **_model_inputs(mb), temperature=temperature, with_entropy=with_entropy
        )
        logps.append(lp)
        ents.append(ent)
    logp = torch.cat(logps)
    return logp, (torch.cat(ents) if with_entropy else None)
