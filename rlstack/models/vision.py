"""Vision-language models of the Qwen-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): a tiny one built
offline, the processor, prompt encoding with images, and M-RoPE position ids.

Prompts follow Qwen-VL's layout: each image is `<|vision_start|><|image_pad|>...<|vision_end|>`,
where `<|image_pad|>` is repeated once per merged patch (`grid_t * grid_h * grid_w / merge**2`)
and the vision tower's output for that image replaces those token embeddings. Rows of a batch
have different numbers of images, so `pixel_values` ([patches, C * T * P * P]) and
`image_grid_thw` ([images, 3]) are kept per row and concatenated in row order for a forward pass.

Positions are M-RoPE: three ids (time, height, width) per token, computed by the model's own
`get_rope_index`. rlstack stores them as `[B, 3, T]` (rows first, so batches split, pad and
concatenate like every other token column); the model's forward takes `[3, B, T]`
(`as_model_positions`). Text tokens have the same id in all three; the tokens after an image
continue from its start plus `max(grid_h, grid_w) / merge`, so a text token's position is not
its index: decoding continues from the prompt's largest position + 1.

`transformers` 5.x builds `Qwen2_5_VLProcessor` only with a video processor, which needs
torchvision; `VisionProcessor` (a tokenizer and an image processor) does the same job for images
and loads from any Qwen-VL model directory with transformers' PIL image processor.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from rlstack.errors import RLStackError
from rlstack.models.tiny import BOS, build_char_tokenizer

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
IMAGE_PLACEHOLDER = "<image>"
"""Where an image goes in a prompt's text (EasyR1 / geometry3k convention)."""

VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""Qwen2.5-VL's chat template without its default system prompt: text or content parts per message."""

TINY_MIN_PIXELS, TINY_MAX_PIXELS = 4 * 28 * 28, 16 * 28 * 28
"""The tiny model's image budget: 4 to 16 merged patches (image tokens) per image."""


class ImageInputError(RLStackError, ValueError):
    """An image that cannot be read, or images that do not match their places in a prompt."""


@dataclass
class VisionProcessor:
    """A tokenizer and an image processor: what a Qwen-VL processor does for images."""

    tokenizer: PreTrainedTokenizerFast
    image_processor: Any
    """A Qwen2-VL-style image processor (`Qwen2VLImageProcessorPil` or the same interface); None for a
    text-only model, whose prompts and observations are then encoded without images."""

    @property
    def image_token_id(self) -> int:
        """The image pad token; -1 (matching no token) for a text-only tokenizer that lacks it, so that
        a text model's observations can be encoded too."""
        token_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        return -1 if token_id is None or token_id == self.tokenizer.unk_token_id else token_id

    @property
    def merge_size(self) -> int:
        return self.image_processor.merge_size

    @property
    def factor(self) -> int:
        """Image sides are resized to multiples of this (patch size x merge size)."""
        return self.image_processor.patch_size * self.image_processor.merge_size

    @property
    def patch_dim(self) -> int:
        """Width of one row of `pixel_values` (channels x temporal patch x patch x patch)."""
        p = self.image_processor.patch_size
        return 3 * self.image_processor.temporal_patch_size * p * p

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(path)
        if self.image_processor is not None:
            self.image_processor.save_pretrained(path)

    def process_images(self, images: list, where: str) -> tuple[torch.Tensor, torch.Tensor]:
        """`pixel_values` [patches, patch_dim] and `image_grid_thw` [len(images), 3]; empty for no images."""
        if not images:
            width = self.patch_dim if self.image_processor is not None else 0
            return torch.zeros(0, width), torch.zeros(0, 3, dtype=torch.long)
        if self.image_processor is None:
            raise ImageInputError(
                f"{where}: {len(images)} image(s) for a text-only model, which cannot see them"
            )
        try:
            out = self.image_processor(images=images, return_tensors="pt")
        except ValueError as e:  # e.g. an aspect ratio over 200
            raise ImageInputError(f"{where}: the image processor cannot use these images: {e}") from e
        return out["pixel_values"], out["image_grid_thw"].long()


@dataclass
class EncodedPrompt:
    """Token ids with every image's pad tokens expanded, and the images' processor outputs."""

    input_ids: torch.Tensor  # [T] long
    pixel_values: torch.Tensor  # [patches, patch_dim]; [0, patch_dim] without images
    image_grid_thw: torch.Tensor  # [images, 3] long; [0, 3] without images


# ------------------------------------------------------------------------------------ the tiny model


def build_vision_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny character tokenizer plus Qwen-VL's vision tokens and a chat template for image parts."""
    tok = build_char_tokenizer()
    tok.add_special_tokens(
        {"additional_special_tokens": [BOS, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]}
    )
    tok.chat_template = VL_CHAT_TEMPLATE
    return tok


def mrope_sections(head_dim: int) -> list[int]:
    """Split of the rotary frequencies between time, height and width, in Qwen2.5-VL's 2:3:3 ratio."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def build_tiny_qwen2_5_vl(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vision_hidden_size: int = 32,
    vision_depth: int = 2,
    seed: int = 0,
) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised Qwen2.5-VL (patch 14, spatial merge 2) sized for CPU."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": 4 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "max_position_embeddings": 2048,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": mrope_sections(hidden_size // num_heads),
            },
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": None,
            "tie_word_embeddings": True,
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_hidden_size,
            "intermediate_size": 2 * vision_hidden_size,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": hidden_size,
            "window_size": 56,  # 2x2 merged patches per attention window
            "fullatt_block_indexes": [vision_depth - 1],
            "tokens_per_second": 2,
        },
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def init_vision_model(
    out_dir: str | Path,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
) -> Path:
    """Write a tiny Qwen2.5-VL, its tokenizer and image processor to `out_dir` (`rlstack init-model --vision`)."""
    out = Path(out_dir)
    tok = build_vision_tokenizer()
    model = build_tiny_qwen2_5_vl(tok, hidden_size, num_layers, num_heads, num_kv_heads, seed=seed)
    processor = VisionProcessor(
        tok, Qwen2VLImageProcessorPil(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


VISION_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
"""The config keys of a Qwen-VL model's image / video / vision start and end tokens."""


def vision_token_ids(config_value: Callable[[str], Any], vocab_size: int) -> list[int]:
    """Ids of a Qwen-VL model's image / video / vision start and end tokens, read with `config_value`
    (a key -> value lookup of its config, None when absent). A model must never sample them: each would
    claim image features that do not exist."""
    ids = (config_value(key) for key in VISION_TOKEN_KEYS)
    return [i for i in ids if isinstance(i, int) and 0 <= i < vocab_size]


def is_vision_model(model_or_config: Any) -> bool:
    """True for a model (or its config, or a model directory) with a vision tower."""
    if isinstance(model_or_config, (str, Path)):
        config_file = Path(model_or_config) / "config.json"
        return config_file.is_file() and "vision_config" in json.loads(config_file.read_text())
    config = getattr(model_or_config, "config", model_or_config)
    return getattr(config, "vision_config", None) is not None


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The vision encoder (patch embedding, blocks and the merger that projects into the LM)."""
    for name in ("model.visual", "visual"):
        module = model
        for part in name.split("."):
            module = getattr(module, part, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise ValueError(f"{type(model).__name__} has no vision tower (`model.visual`)")


class BlankImages:
    """The hooks `run_vision_tower_in_every_pass` installs on a model, and what they track: whether the
    tower ran in the current pass, and whether a pass with gradients since the last optimizer step had
    real images (the blank images only give the tower zero gradients)."""

    ATTR = "_rlstack_blank_images"

    def __init__(self, tower: torch.nn.Module, vision_config: Any):
        self.tower = tower
        self.merge = vision_config.spatial_merge_size
        self.patch_dim = (
            vision_config.in_channels * vision_config.temporal_patch_size * vision_config.patch_size**2
        )
        self.ran = False
        """The tower ran in the current forward pass."""
        self.blank = False
        """The tower is running on the blank image."""
        self.saw_images = False
        """A pass computing gradients ran the tower on real images (since `step_done`)."""

    @classmethod
    def of(cls, model: torch.nn.Module) -> BlankImages | None:
        return getattr(model, cls.ATTR, None)

    def step_done(self, any_rank_saw_images: bool) -> None:
        """Before an optimizer step. Where no rank's mini-batch had an image, the tower's gradients are the
        blank images' zeros: they become None, as in one process, where AdamW then leaves the tower alone
        (with zeros it would still apply weight decay and momentum)."""
        if not any_rank_saw_images:
            for p in self.tower.parameters():
                p.grad = None
        self.saw_images = False

    def new_pass(self, module, args, kwargs) -> None:
        self.ran = False

    def tower_ran(self, module, args, output) -> None:
        self.ran = True
        if not self.blank and torch.is_grad_enabled():
            self.saw_images = True

    def blank_image_first(self, module, args, kwargs):
        """Before the language model: where the tower has not run in this pass, run it on a blank image
        and add its features times zero to the input embeddings."""
        if self.ran or kwargs.get("inputs_embeds") is None:
            return None
        embeds = kwargs["inputs_embeds"]
        grid = torch.tensor([[1, self.merge, self.merge]], device=embeds.device)
        self.blank = True
        try:
            out = self.tower(torch.zeros(self.merge**2, self.patch_dim, device=embeds.device), grid_thw=grid)
        finally:
            self.blank = False
        nothing = sum(t.float().sum() for t in _tensors(out)) * 0.0
        return args, {**kwargs, "inputs_embeds": embeds + nothing.to(embeds.dtype)}


def run_vision_tower_in_every_pass(model: torch.nn.Module) -> BlankImages:
    """Make every forward pass of `model` run its vision tower: a pass without images runs it on one
    blank image, whose features enter the pass times zero (the outputs and gradients are those of the
    pass without it; the tower's weights get zero gradients, see `BlankImages.step_done`).

    For a model sharded with FSDP2 over several ranks: each rank all-gathers a block's weights when the
    block runs and reduce-scatters its gradients after, and ranks must make the same collectives in the
    same order. A rank whose micro-batch has no image would otherwise skip the tower's, and pair its next
    collectives with another rank's vision blocks (a mismatch error with gloo, a hang or garbage with NCCL).
    The blank image runs before the language model, where a pass with images runs the tower."""
    language = getattr(getattr(model, "model", None), "language_model", None)
    if not isinstance(language, torch.nn.Module):
        raise ValueError(f"{type(model).__name__} has no language model (`model.language_model`)")
    state = BlankImages(vision_tower(model), model.config.vision_config)
    model.register_forward_pre_hook(state.new_pass, with_kwargs=True)
    state.tower.register_forward_hook(state.tower_ran)
    language.register_forward_pre_hook(state.blank_image_first, with_kwargs=True)
    setattr(model, BlankImages.ATTR, state)
    return state


def _tensors(out: Any) -> list[torch.Tensor]:
    """Every floating-point tensor in a module's output (model outputs, tuples, lists)."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):  # ModelOutput is an ordered dict of its set fields
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in _tensors(item)]
    return []


def vision_tower_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters of the vision tower, e.g. to freeze them (`worker.actor.freeze_vision_tower`)."""
    return list(vision_tower(model).parameters())


# ------------------------------------------------------------------------------------ prompts


def with_image_parts(message: dict) -> dict:
    """A chat message whose text content has `<image>` placeholders, as content parts in order:
    "a<image>b" -> [text a, image, text b]. Messages with content parts already pass through."""
    content = message["content"]
    if not isinstance(content, str) or IMAGE_PLACEHOLDER not in content:
        return message
    parts: list[dict] = []
    for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
        if i:
            parts.append({"type": "image"})
        if text:
            parts.append({"type": "text", "text": text})
    return {**message, "content": parts}


def _count_image_parts(messages: list[dict]) -> int:
    return sum(
        1
        for m in messages
        if not isinstance(m["content"], str)
        for part in m["content"]
        if part.get("type") == "image"
    )


def encode_prompt(
    processor: VisionProcessor, messages: list[dict], images: list, where: str
) -> EncodedPrompt:
    """Chat messages (text with `<image>` placeholders, or content parts) and the row's images -> the
    prompt's token ids (generation prompt appended), `pixel_values` and `image_grid_thw`.

    The i-th placeholder is the i-th image. Any mismatch between placeholders, image tokens and
    images raises `ImageInputError` naming `where`, before a model sees the row.
    """
    messages = [with_image_parts(m) for m in messages]
    slots = _count_image_parts(messages)
    if slots != len(images):
        raise ImageInputError(
            f"{where}: the prompt has {slots} {IMAGE_PLACEHOLDER} placeholder(s) but the row has "
            f"{len(images)} image(s); put one {IMAGE_PLACEHOLDER} in the prompt text where each image "
            "goes (the i-th placeholder is the i-th image), or give the row as many images as placeholders."
        )
    text = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return _expand_images(processor, text, images, where)


def encode_observation(
    processor: VisionProcessor,
    content: str,
    images: list,
    where: str,
    response_ended_with_eos: bool,
    role: str = "user",
) -> EncodedPrompt:
    """The tokens that follow an assistant response to add a `role` turn (a tool's observation or a
    user's reply; `<image>` placeholders in `content` mark the images) and open the next assistant
    turn; `pixel_values` / `image_grid_thw` cover the new images only.

    The tokens are what the chat template renders after the assistant's text: they close the
    assistant turn (its end-of-turn token is left out when the response already ended with it,
    `response_ended_with_eos`), render the new turn, and add the generation prompt.
    """
    marker = "\x00rlstack-response\x00"
    messages = [
        {"role": "assistant", "content": marker},
        with_image_parts({"role": role, "content": content}),
    ]
    slots = _count_image_parts(messages)
    if slots != len(images):
        raise ImageInputError(
            f"{where}: the observation has {slots} {IMAGE_PLACEHOLDER} placeholder(s) but {len(images)} "
            f"image(s); put one {IMAGE_PLACEHOLDER} in the observation text where each image goes."
        )
    rendered = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    text = rendered[rendered.index(marker) + len(marker) :]
    eos = processor.tokenizer.eos_token
    if response_ended_with_eos and eos and text.startswith(eos):
        text = text[len(eos) :]
    return _expand_images(processor, text, images, where)


def _expand_images(processor: VisionProcessor, text: str, images: list, where: str) -> EncodedPrompt:
    """Tokenize `text` and repeat its i-th `<|image_pad|>` once per merged patch of image i."""
    ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    pad = processor.image_token_id
    n_pads = ids.count(pad)
    if n_pads != len(images):
        raise ImageInputError(
            f"{where}: the rendered prompt has {n_pads} {IMAGE_PAD} token(s) for {len(images)} image(s). "
            f"The prompt text must not contain {IMAGE_PAD} itself, and the chat template must render each "
            f"image part as {VISION_START}{IMAGE_PAD}{VISION_END} (Qwen-VL's templates do)."
        )
    pixel_values, grid = processor.process_images(images, where)
    if not images:  # nothing to expand (and a text-only processor has no merge size)
        return EncodedPrompt(torch.tensor(ids, dtype=torch.long), pixel_values, grid)
    counts = iter((grid.prod(-1) // processor.merge_size**2).tolist())
    expanded: list[int] = []
    for t in ids:
        expanded.extend([pad] * next(counts) if t == pad else [t])
    input_ids = torch.tensor(expanded, dtype=torch.long)
    check_image_tokens(input_ids, grid, pad, processor.merge_size, where)
    return EncodedPrompt(input_ids, pixel_values, grid)


def check_image_tokens(
    input_ids: torch.Tensor,  # [T]
    image_grid_thw: torch.Tensor,  # [images, 3]
    image_token_id: int,
    merge_size: int,
    where: str,
) -> None:
    """Raise `ImageInputError` unless `input_ids` holds one run of image tokens per image, each as long
    as that image's merged patches (what the model's forward needs)."""
    is_pad = input_ids == image_token_id
    run_starts = is_pad & ~torch.cat([is_pad.new_zeros(1), is_pad[:-1]])
    runs = int(run_starts.sum())
    expected = (image_grid_thw.prod(-1) // merge_size**2).tolist()
    ends = torch.cat([is_pad[1:], is_pad.new_zeros(1)])
    lengths = (is_pad & ~ends).nonzero().squeeze(-1) - run_starts.nonzero().squeeze(-1) + 1
    if runs != len(expected) or lengths.tolist() != expected:
        raise ImageInputError(
            f"{where}: the tokens hold {runs} image(s) with {lengths.tolist()} image tokens, but the images "
            f"have {expected} patches (after merging); each image needs exactly its own number of "
            f"{IMAGE_PAD} tokens, in image order, between {VISION_START} and {VISION_END}. "
            "Encode prompts with rlstack.models.vision.encode_prompt."
        )


# ------------------------------------------------------------------------------------ positions


def mrope_position_ids(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    image_grid_thw: list[torch.Tensor],  # per row, [images_b, 3]
) -> torch.Tensor:
    """`[B, 3, T]` M-RoPE position ids from the model's own `get_rope_index`; 0 on padding."""
    owner = _rope_index_owner(model)
    grids = [g for g in image_grid_thw if len(g)]
    grid = torch.cat(grids).to(input_ids.device) if grids else None
    mm_token_type_ids = (input_ids == model.config.image_token_id).int()
    positions, _ = owner.get_rope_index(
        input_ids, mm_token_type_ids=mm_token_type_ids, image_grid_thw=grid, attention_mask=attention_mask
    )
    return positions.permute(1, 0, 2).contiguous()


def position_ids(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """The position ids the model gives a batch of left-padded rows: M-RoPE `[B, 3, T]` for a row
    layout with images (`image_grid_thw`, one tensor per row), else `[B, T]` counting the attended
    tokens (0 on left padding)."""
    if image_grid_thw is not None:
        return mrope_position_ids(model, input_ids, attention_mask, image_grid_thw)
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def as_model_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """rlstack's `[B, T]` / `[B, 3, T]` position ids in the layout the model's forward takes
    (`[B, T]` / `[3, B, T]`)."""
    return position_ids.transpose(0, 1) if position_ids.dim() == 3 else position_ids


def multimodal_inputs(
    pixel_values: list[torch.Tensor], image_grid_thw: list[torch.Tensor], device: torch.device
) -> dict[str, torch.Tensor]:
    """Per-row images concatenated in row order as forward kwargs; empty when no row has an image."""
    rows = [i for i, g in enumerate(image_grid_thw) if len(g)]
    if not rows:
        return {}
    return {
        "pixel_values": torch.cat([pixel_values[i] for i in rows]).to(device),
        "image_grid_thw": torch.cat([image_grid_thw[i] for i in rows]).to(device),
    }


def check_batch_image_tokens(
    model: torch.nn.Module, input_ids: torch.Tensor, image_grid_thw: list[torch.Tensor]
) -> None:
    """`check_image_tokens` for every row of a batch, named by row index."""
    merge = model.config.vision_config.spatial_merge_size
    for b, (row, grid) in enumerate(zip(input_ids, image_grid_thw)):
        check_image_tokens(row, grid.to(row.device), model.config.image_token_id, merge, f"batch row {b}")


def _rope_index_owner(model: torch.nn.Module) -> torch.nn.Module:
    for module in (getattr(model, "model", None), model):
        if module is not None and hasattr(module, "get_rope_index"):
            return module
    raise ValueError(f"{type(model).__name__} has no get_rope_index: it is not a Qwen-VL model")


def mask_patches(
    pixel_values: torch.Tensor,  # [patches, C * T * P * P], one row per patch
    processor: VisionProcessor,
    probability: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """A copy of `pixel_values` with each patch blacked out with `probability` (VPPO's perturbation):
    a blacked-out row holds, per channel, the normalized value of a black pixel."""
    if len(pixel_values) == 0:
        return pixel_values
    ip = processor.image_processor
    mean = torch.as_tensor(ip.image_mean, dtype=pixel_values.dtype)
    std = torch.as_tensor(ip.image_std, dtype=pixel_values.dtype)
    channels = len(mean)
    black = ((0.0 - mean) / std).repeat_interleave(pixel_values.shape[1] // channels)  # [C * T * P * P]
    hit = torch.rand(len(pixel_values), generator=generator) < probability
    return torch.where(hit[:, None], black.to(pixel_values.device), pixel_values)
