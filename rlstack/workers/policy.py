"""The policy (the trained model: log-probs, updates, checkpoints, its weights for a rollout engine)
and the frozen reference model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

from rlstack.algos.actor_loss import ActorLossInputs, ActorLossParams, actor_loss
from rlstack.algos.kl import kl_full
from rlstack.algos.policy_loss import (
    LossNormalizers,
    token_mean,
)
from rlstack.batch import Batch, columns_read_by, pad_right
from rlstack.checkpoint import default_modes
from rlstack.config import ActorConfig, AlgorithmConfig, ModelConfig, RefConfig
from rlstack.config.actor import heads_problem
from rlstack.errors import RLStackError
from rlstack.models import ulysses
from rlstack.models.loading import load_causal_lm, load_tokenizer_and_processor, model_dir
from rlstack.models.logprobs import forward_logprobs, packed_response_logits, response_logits
from rlstack.models.lora import add_lora, load_adapter, merged_weights, save_adapter
from rlstack.models.vision import mask_patches, position_ids, vision_tower_parameters
from rlstack.plan import actor_loss_params, exact_kl
from rlstack.workers import distributed
from rlstack.workers.distributed import MiniBatchTotals
from rlstack.workers.group import MODEL_INPUTS, Dispatch, remote
from rlstack.workers.memory import peaks_since_last
from rlstack.workers.training import MicroBatching, apply_optim_config, build_optimizer, optimizer_steps

# loss_fn(micro_batch, mini-batch totals, logprobs, entropy, exact KL to the reference or None)
#   -> (loss, {metric: contribution summed over the mini-batch})
UPDATE_READS = (*MODEL_INPUTS, *columns_read_by("update"))
"""The columns the policy update reads (where present)."""

LossFn = Callable[
    [Batch, MiniBatchTotals, torch.Tensor, torch.Tensor, torch.Tensor | None],
    tuple[torch.Tensor, dict[str, torch.Tensor]],
]


def _model_inputs(model: torch.nn.Module, b: Batch, device: str) -> dict[str, torch.Tensor]:
    """Forward inputs of a (micro-)batch on the device the model computes on (the worker's: with FSDP2's
    CPU offload the parameters themselves live in host memory): token columns with the model's position
    ids, plus each row's images for a vision model."""
    inputs = {k: b[k].to(device) for k in ("input_ids", "attention_mask", "response_mask")}
    grids = b.get("image_grid_thw")
    if grids is not None:
        inputs |= {"pixel_values": b["pixel_values"], "image_grid_thw": grids}
    inputs["position_ids"] = position_ids(model, inputs["input_ids"], inputs["attention_mask"], grids)
    return inputs


def load_trained_model(m: ModelConfig, path: str, device: str, ulysses_size: int = 1) -> torch.nn.Module:
    """The model at `path` as `worker.actor.model` asks (dtype, attention kernel, gradient checkpointing),
    on `device`; with `ulysses_size` > 1 its attention takes sequence-parallel passes (`rlstack.models.ulysses`),
    after checking that its heads split."""
    model = load_causal_lm(path, m.dtype, m.trust_remote_code, m.attn_implementation, ulysses_size > 1)
    problem = heads_problem(ulysses_size, *ulysses.heads(model.config), m.model_path)
    if problem:
        raise RLStackError(problem)
    model = model.to(device)
    if m.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


class PolicyWorker:
    """Owns the policy model, its optimizer and scheduler: log-probs, updates, checkpoints, and its
    weights under Hugging Face names for a rollout engine that does not share the module."""

    def __init__(
        self,
        actor: ActorConfig,
        algorithm: AlgorithmConfig,
        max_response_length: int,
        total_steps: int,
        seed: int,
        device: str = "cpu",
        temperature: float = 1.0,
        old_logprobs: bool = True,
        loss: ActorLossParams | None = None,
    ):
        """`temperature`, `old_logprobs` and `loss` come from the step plan (`rlstack/plan.py`); `loss`
        unset: the one `actor_loss_params` makes of `actor` and `algorithm`, as the plan does."""
        self.cfg, self.algo = actor, algorithm
        self.loss = loss
        self.temperature = temperature
        """The temperature log-probs are taken at: the rollout's sampling temperature."""
        self.old_logprobs = old_logprobs
        """Update batches come with `old_logprobs`; else the update is on-policy and its first forward pass
        serves as the old policy."""
        path = model_dir(actor.model)
        self.tokenizer, self.processor = load_tokenizer_and_processor(actor.model, path)
        self.device = device
        self.path = path
        self.sequence_group = distributed.sequence_group(actor.ulysses_size)
        """Sequence parallelism: the ranks that hold this rank's rows and split their packed sequences."""
        self.model = load_trained_model(actor.model, path, device, actor.ulysses_size)
        if actor.freeze_vision_tower and self.processor is None:
            raise ValueError(
                f"worker.actor.freeze_vision_tower=true, but {actor.model.model_path} is not a vision model"
            )
        self.lora = actor.model.lora.rank > 0
        """Only LoRA adapters train; the base with the adapters off is the reference (`rlstack.models.lora`)."""
        if self.lora:
            self.model = add_lora(self.model, actor.model.lora, actor.freeze_vision_tower)
        elif actor.freeze_vision_tower:
            for p in vision_tower_parameters(self.model):
                p.requires_grad_(False)
        self.model.train()
        self.max_response_length = max_response_length
        self.ref_model = None
        """A frozen copy of the initial policy, colocated for the exact KL (`kl_penalty=full`), which needs
        the reference's whole distributions per micro-batch rather than sampled-token log-probs (with LoRA
        the policy's own base serves)."""
        self.exact_kl = exact_kl(algorithm)
        if self.exact_kl and not self.lora:
            self.ref_model = load_trained_model(actor.model, path, device, actor.ulysses_size).eval()
            self.ref_model.requires_grad_(False)
        if distributed.sharded():  # FSDP2 over the role's ranks; the optimizer then holds the shards
            fsdp = actor.fsdp
            distributed.shard_model(self.model, device, fsdp.mp_param_dtype, fsdp.offload_params)
            if self.ref_model is not None:
                distributed.shard_model(self.ref_model, device, fsdp.mp_param_dtype, fsdp.offload_params)
        self.optimizer, self.scheduler = build_optimizer(self.model, actor.optim, total_steps)
        self.seed = seed
        self.vppo_generator = torch.Generator().manual_seed(seed + 1)
        """Draws VPPO's patch masks (saved with checkpoints)."""
        dynamic = actor.dynamic_batching
        self.experience_micro_batching = MicroBatching.of(
            actor.micro_batch_size_per_device_for_experience,
            actor.max_token_len_per_device_for_experience,
            dynamic,
            "worker.actor",
            "experience",
        )
        self.update_micro_batching = MicroBatching.of(
            actor.micro_batch_size_per_device_for_update,
            actor.max_token_len_per_device_for_update,
            dynamic,
            "worker.actor",
            "update",
        )

    @remote(Dispatch.ALL, stays_remote=True)
    def gathered_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The whole weights on rank 0, in host memory (every rank joins the gathering; the others return
        nothing): what is sent to rollout workers placed apart from the policy, through the driver, which
        may have no GPU."""
        keep = distributed.current().rank == 0
        return [(name, t.cpu()) for name, t in self.named_weights() if keep]  # every rank iterates (gathers)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's whole weights under their Hugging Face names (what a rollout engine loads; with LoRA
        the base weights with the adapters merged in); with several ranks each is gathered from its
        shards, so every rank iterates."""
        if self.lora:
            yield from merged_weights(self.model)
        else:
            yield from distributed.full_state_dict(self.model)

    @contextmanager
    def _reference_model(self) -> Iterator[torch.nn.Module]:
        """The reference model inside this worker: with LoRA the policy's module with its adapters switched
        off, else the colocated copy (`kl_penalty=full`)."""
        if not self.lora:
            yield self.ref_model
            return
        with self.model.disable_adapter():
            yield self.model

    @remote(Dispatch.ROWS, reads=MODEL_INPUTS)
    @torch.no_grad()
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """LoRA: adds `ref_logprobs` [B, T], those of the base model (the adapters switched off)."""
        with self._reference_model() as base:  # in eval mode, as every log-prob pass (`_batched_logprobs`)
            logp, _ = _batched_logprobs(
                base,
                batch,
                self.experience_micro_batching,
                False,
                self.cfg.padding_free,
                self.device,
                self.temperature,
                self.sequence_group,
            )
        return batch.update({"ref_logprobs": logp})

    # ----------------------------------------------------------------------------- log-probs

    @remote(Dispatch.ALL)
    @torch.no_grad()
    def probe_logprobs(self, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
        """Log-probs (temperature 1) of `token_ids` after a text prompt, under the current weights."""
        ids = torch.tensor([prompt_ids + token_ids])
        response = torch.zeros_like(ids)
        response[0, len(prompt_ids) :] = 1
        row = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": response})
        if self.processor is not None:
            pixel_values, grid = self.processor.process_images([], "the weight-sync probe")
            row.update({"pixel_values": [pixel_values], "image_grid_thw": [grid]})
        logp, _ = _batched_logprobs(self.model, row, MicroBatching(1), False, False, self.device, 1.0)
        return logp[0, len(prompt_ids) :].tolist()

    @remote(Dispatch.ROWS, reads=MODEL_INPUTS)
    @torch.no_grad()
    def compute_logprobs(self, batch: Batch) -> Batch:
        """Adds `old_logprobs` and `entropy` [B, T] under the current weights."""
        logp, ent = _batched_logprobs(
            self.model,
            batch,
            self.experience_micro_batching,
            True,
            self.cfg.padding_free,
            self.device,
            self.temperature,
            self.sequence_group,
        )
        return batch.update({"old_logprobs": logp, "entropy": ent})

    @remote(Dispatch.ROWS, reads=MODEL_INPUTS)
    @torch.no_grad()
    def compute_masked_image_logprobs(self, batch: Batch) -> Batch:
        """Adds `masked_logprobs` [B, T]: log-probs of the sampled tokens under the current weights with
        every image's patches blacked out at random (`algorithm.vppo_mask_prob`), for VPPO's visual
        dependency. The masks are drawn from a generator saved with checkpoints."""
        if self.processor is None or "image_grid_thw" not in batch:
            raise ValueError(
                "algorithm.use_vppo_on_perception needs a vision-language model and rows with images "
                f"(worker.actor.model.model_path={self.cfg.model.model_path})"
            )
        masked = [
            mask_patches(pv, self.processor, self.algo.vppo_mask_prob, self.vppo_generator)
            for pv in batch["pixel_values"]
        ]
        perturbed = Batch({**batch.columns, "pixel_values": masked}, batch.meta)  # the originals stay
        logp, _ = _batched_logprobs(
            self.model,
            perturbed,
            self.experience_micro_batching,
            False,
            self.cfg.padding_free,
            self.device,
            self.temperature,
            self.sequence_group,
        )
        return batch.update({"masked_logprobs": logp})

    # -------------------------------------------------------------------------------- update

    @remote(Dispatch.MINI_BATCHES, reads=UPDATE_READS)
    def update(self, batch: Batch, mini_batch_size: int) -> dict[str, float]:
        """Policy update over `ppo_epochs` passes of mini-batches of `mini_batch_size` trajectories."""
        c, alg = self.cfg, self.algo
        params = self.loss if self.loss is not None else actor_loss_params(c, alg)

        def loss_fn(
            micro: Batch,
            totals: MiniBatchTotals,
            logp: torch.Tensor,
            ent: torch.Tensor,
            exact_kl: torch.Tensor | None,
        ):
            inputs = ActorLossInputs(
                logprobs=logp,
                entropy=ent,
                old_logprobs=micro["old_logprobs"] if self.old_logprobs else logp.detach(),
                advantages=micro["advantages"],
                response_mask=micro["response_mask"],
                rollout_logprobs=micro.get("rollout_logprobs"),
                perception_mask=micro.get("perception_mask"),
                ref_logprobs=micro.get("ref_logprobs"),
                exact_kl=exact_kl,
            )
            normalizers = LossNormalizers(
                totals.tokens, totals.sequences, self.max_response_length, totals.computed_tokens
            )
            return actor_loss(inputs, params, normalizers)

        metrics = self._train(
            batch,
            mini_batch_size,
            loss_fn,
            epochs=c.ppo_epochs,
            shuffle=c.shuffle_mini_batches,
            takes_pass=_nonzero_advantage if c.skip_zero_advantage else None,
        )
        if params.kl_penalty is not None:
            metrics["actor/kl_coef"] = alg.kl_coef
        by_rank = distributed.gather_objects(peaks_since_last())  # the most any policy rank held
        metrics |= {f"perf/{k}": max(p[k] for p in by_rank) for k in by_rank[0]}
        return metrics

    @remote(Dispatch.MINI_BATCHES, reads=MODEL_INPUTS)
    def sft_update(self, batch: Batch, mini_batch_size: int) -> dict[str, float]:
        """Supervised fine-tuning: one optimizer step per mini-batch of `mini_batch_size` rows, each the
        mean NLL of its `response_mask` tokens (`sft/loss`)."""

        def nll(
            micro: Batch,
            totals: MiniBatchTotals,
            logp: torch.Tensor,
            ent: torch.Tensor,
            exact_kl: torch.Tensor | None,
        ):
            loss = token_mean(-logp, micro["response_mask"].float(), totals.tokens)
            return loss, {"sft/loss": loss.detach()}

        return self._train(batch, mini_batch_size, nll, epochs=1, shuffle=False)

    def _train(
        self,
        batch: Batch,
        mini_batch_size: int,
        loss_fn: LossFn,
        epochs: int,
        shuffle: bool,
        takes_pass: Callable[[Batch], torch.Tensor] | None = None,
    ) -> dict[str, float]:
        temperature = self.temperature
        entropy_grad = self.cfg.entropy_coeff != 0

        forward = (
            partial(packed_response_logits, sequence_group=self.sequence_group)
            if self.cfg.padding_free
            else response_logits
        )

        def micro_loss(micro: Batch, totals: MiniBatchTotals):
            micro = micro.to(self.device)
            scored = forward(self.model, **_model_inputs(self.model, micro, self.device)).scaled(temperature)
            logp, ent = scored.logprobs(True, entropy_grad)
            exact_kl = None
            if self.exact_kl:  # KL over whole next-token distributions (kl_penalty=full)
                with torch.no_grad(), self._reference_model() as ref_model:
                    ref = forward(ref_model, **_model_inputs(ref_model, micro, self.device)).scaled(
                        temperature
                    )
                exact_kl = scored.to_full(kl_full(scored.tempered(), ref.tempered()))
            return loss_fn(micro, totals, logp, ent, exact_kl)

        c = self.cfg
        return optimizer_steps(
            self.model,
            self.optimizer,
            self.scheduler,
            batch,
            micro_loss,
            mini_batch_size,
            self.update_micro_batching,
            epochs,
            c.max_grad_norm,
            role="actor",
            shuffle_seed=self.seed if shuffle else None,
            sequence_group=self.sequence_group,
            takes_pass=takes_pass,
        )

    # --------------------------------------------------------------------------- checkpoints

    @remote(Dispatch.ALL)
    def save_model(self, path: Path) -> None:
        """The model, tokenizer and (vision models) image processor in Hugging Face format; with several
        ranks the whole weights are gathered on every rank and rank 0 writes them. With LoRA: the merged
        model, and the adapters in `adapter/`."""
        if self.lora:
            merged = load_causal_lm(self.path, self.cfg.model.dtype, self.cfg.model.trust_remote_code)
            merged.load_state_dict(dict(merged_weights(self.model)))
            merged.save_pretrained(path)
            save_adapter(self.model, path / "adapter")
            self._save_processing(path)
            default_modes(path)
        elif distributed.save_pretrained(self.model, path):
            self._save_processing(path)
            default_modes(path)

    def _save_processing(self, path: Path) -> None:
        if self.processor is not None:
            self.processor.save_pretrained(path)
        else:
            self.tokenizer.save_pretrained(path)

    @remote(Dispatch.ALL)
    def save_checkpoint(self, path: Path) -> None:
        """Model, optimizer and scheduler. One process: the Hugging Face model (`model/`) and the optimizer's
        state. Several ranks: model and optimizer as `torch.distributed.checkpoint` shards (`actor_dcp/`,
        every rank writes its own; a run on any number of ranks can load them), and in `model/` only the
        config, tokenizer and processor (`rlstack merge` makes the Hugging Face model)."""
        state = {"scheduler": self.scheduler.state_dict(), "vppo_generator": self.vppo_generator.get_state()}
        if distributed.sharded():
            distributed.save_sharded(self.model, self.optimizer, path / "actor_dcp")
            if distributed.current().rank == 0:
                self.model.config.save_pretrained(path / "model")
                self._save_processing(path / "model")
        elif self.lora:  # the adapters only, beside the base's config (what `rlstack merge` needs)
            save_adapter(self.model, path / "model")
            self.model.config.save_pretrained(path / "model")
            self._save_processing(path / "model")
            state["optimizer"] = self.optimizer.state_dict()
        else:
            self.save_model(path / "model")
            state["optimizer"] = self.optimizer.state_dict()
        if distributed.current().rank == 0:
            torch.save(state, path / "actor_state.pt")

    @remote(Dispatch.ALL)
    def load_checkpoint(self, path: Path) -> None:
        _check_same_model(path / "model", self.model, self.cfg.model.model_path)
        s = torch.load(path / "actor_state.pt", map_location="cpu", weights_only=False)
        adapters = (path / "model" / "adapter_config.json").is_file()
        if adapters != self.lora:
            raise RLStackError(
                f"the checkpoint {path} was written by a run "
                + ("with" if adapters else "without")
                + " LoRA adapters, and this run has worker.actor.model.lora.rank="
                + f"{self.cfg.model.lora.rank}: resume with the settings the run was started with"
            )
        if (path / "actor_dcp").is_dir() or distributed.sharded():
            _check_sharded(path, "actor_dcp")
            distributed.load_sharded(self.model, self.optimizer, path / "actor_dcp")
        elif self.lora:
            load_adapter(self.model, path / "model")
            self.optimizer.load_state_dict(s["optimizer"])
        else:
            # from_pretrained reads sharded weights and ties embeddings; its tensors are copied in place
            # so that the optimizer, which holds the live parameters, stays attached to them.
            saved = load_causal_lm(
                str(path / "model"), self.cfg.model.dtype, self.cfg.model.trust_remote_code
            )
            self.model.load_state_dict(saved.state_dict())
            del saved
            self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])
        apply_optim_config(self.optimizer, self.scheduler, self.cfg.optim)
        self.vppo_generator.set_state(s["vppo_generator"])


class RefWorker:
    """A frozen copy of the initial policy, for KL terms. It lays out and cuts batches as the policy does
    (`worker.actor.padding_free`, `worker.actor.dynamic_batching`), with its own micro-batch sizes."""

    def __init__(self, actor: ActorConfig, ref: RefConfig, device: str = "cpu", temperature: float = 1.0):
        """`temperature`: the one log-probs are taken at (the rollout's sampling temperature)."""
        path = model_dir(actor.model)
        self.temperature = temperature
        self.device = device
        self.sequence_group = distributed.sequence_group(actor.ulysses_size)
        self.model = load_trained_model(actor.model, path, device, actor.ulysses_size).eval()
        self.model.requires_grad_(False)
        if distributed.sharded():
            distributed.shard_model(self.model, device, actor.fsdp.mp_param_dtype, actor.fsdp.offload_params)
        self.padding_free = actor.padding_free
        self.micro_batching = MicroBatching.of(
            ref.micro_batch_size_per_device_for_experience,
            ref.max_token_len_per_device_for_experience,
            actor.dynamic_batching,
            "worker.ref",
            "experience",
        )

    @remote(Dispatch.ROWS, reads=MODEL_INPUTS)
    @torch.no_grad()
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        logp, _ = _batched_logprobs(
            self.model,
            batch,
            self.micro_batching,
            False,
            self.padding_free,
            self.device,
            self.temperature,
            self.sequence_group,
        )
        return batch.update({"ref_logprobs": logp})


def _nonzero_advantage(mb: Batch) -> torch.Tensor:
    """[rows] True where a row has a non-zero advantage on a sampled token: the rows whose policy loss can
    be other than 0 (`worker.actor.skip_zero_advantage`)."""
    return (mb["advantages"] * mb["response_mask"]).ne(0).any(-1)


def _batched_logprobs(
    model,
    batch: Batch,
    micro: MicroBatching,
    with_entropy: bool,
    padding_free: bool,
    device: str,
    temperature: float,
    sequence_group: torch.distributed.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) `[B, T]` of a batch at `temperature`, computed micro-batch by micro-batch,
    in eval mode (no dropout: LoRA's would make them random); padding-free passes split across
    `sequence_group` (sequence parallelism)."""

    def run(mb: Batch) -> torch.Tensor:
        width = mb["input_ids"].shape[-1]
        mb = mb.trimmed()  # its own columns only; the results padded back to the batch's
        lp, ent = forward_logprobs(
            model,
            **_model_inputs(model, mb, device),
            temperature=temperature,
            with_entropy=with_entropy,
            padding_free=padding_free,
            sequence_group=sequence_group,
        )
        return pad_right(
            torch.stack([lp, ent] if with_entropy else [lp], dim=1).cpu(), width
        )  # [rows, 1|2, T]

    was_training = model.training
    model.eval()
    try:
        out = micro.map(batch, run, "log-prob pass")
    finally:
        model.train(was_training)
    return out[:, 0], (out[:, 1] if with_entropy else None)


def _check_sharded(path: Path, name: str) -> None:
    if not (path / name).is_dir():
        raise FileNotFoundError(
            f"{path} was written by a one-process run (no {name}/): resume it with trainer.backend=local, or "
            f"start this run from its model (worker.actor.model.model_path={path}/model)"
        )


SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def _check_same_model(saved_dir: Path, model: torch.nn.Module, model_path: str) -> None:
    """A checkpoint of another model is one clear message, not a shape error deep inside loading."""
    import json

    saved = json.loads((saved_dir / "config.json").read_text())
    saved = saved.get("text_config", saved) | {"model_type": saved.get("model_type")}
    ours = model.config.to_dict()
    ours = ours.get("text_config", ours) | {"model_type": ours.get("model_type")}
    differ = {k: (saved.get(k), ours.get(k)) for k in SHAPE_KEYS if saved.get(k) != ours.get(k)}
    if differ:
        diffs = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in differ.items())
        raise ValueError(
            f"the checkpoint {saved_dir.parent} holds a different model than worker.actor.model.model_path="
            f"{model_path} ({diffs}: checkpoint vs this run): resume with the model it was trained from, or "
            "start a new run (trainer.find_last_checkpoint=false)"
        )
