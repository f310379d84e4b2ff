"""Prompt rows -> token ids, and a seeded, resumable loader of prompt batches."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import jinja2
import torch

from rlstack.batch import Batch
from rlstack.config import DataConfig, chat_template_text
from rlstack.config.paths import hub_config
from rlstack.data.formats import normalize_rows
from rlstack.data.images import fit_pixels, load_image
from rlstack.data.readers import DataError, read_rows
from rlstack.models.vision import VisionProcessor, encode_observation, encode_prompt


class PromptDataset:
    """Rows of a data spec, each rendered into a prompt and tokenized once.

    A row must hold `prompt_key` (a string, or a list of chat messages) and `answer_key`.
    With `format_prompt`, the Jinja2 file is rendered with the row's fields, `content` (the
    prompt) and `images` (the row's image list as written, empty for a text row) to form the user
    message; any other name the row lacks is an error naming the row. With `apply_chat_template` and a tokenizer that has a chat
    template, the messages are wrapped with it and the generation prompt is appended; a
    `system_prompt` becomes the first message unless the row brings its own.

    Images (`images` field) are decoded (`data.images.load_image`; relative paths from `image_dir`,
    default the data file's folder). With a vision `processor`, each is resized into
    [min_pixels, max_pixels] and each `<image>` placeholder of the prompt becomes its tokens; the row
    carries `pixel_values` / `image_grid_thw`. The row's `images` stay at their original resolution:
    they are what the agent's tools work on (as PyVision's interpreter opens the original files), so
    a crop can recover detail the model's pixel budget lost; tool coordinates are original pixels.
    """

    def __init__(
        self,
        spec: str,
        tokenizer,
        prompt_key: str = "problem",
        answer_key: str = "answer",
        data_source_key: str = "data_source",
        format_prompt: str | None = None,
        apply_chat_template: bool = True,
        max_prompt_length: int = 1024,
        filter_overlong_prompts: bool = True,
        max_samples: int = -1,
        data_format: str | None = "auto",
        processor: VisionProcessor | None = None,
        system_prompt: str | None = None,
        image_dir: str | None = None,
        min_pixels: int = 262144,
        max_pixels: int = 4194304,
        max_images: int | None = None,
        image_key: str = "images",
    ):
        rows, where = read_rows(spec)
        rows = normalize_rows(rows, where, data_format)
        if max_samples > 0:
            rows, where = rows[:max_samples], where[:max_samples]
        if not rows:
            raise DataError(f"{spec}: no rows")
        template = _load_template(format_prompt) if format_prompt else None
        use_chat = apply_chat_template and getattr(tokenizer, "chat_template", None) is not None
        name = hub_config(spec.split("@")[0])[0]  # openai/gsm8k:main -> openai/gsm8k
        default_source = Path(name).stem if not spec.startswith("builtin:") else spec
        local = Path(name)
        image_root = image_dir or (str(local if local.is_dir() else local.parent) if local.exists() else None)
        factor = processor.factor if processor is not None else 28
        self.items: list[dict[str, Any]] = []
        self.num_filtered = 0
        for row, loc in zip(rows, where):
            for key, name in ((prompt_key, "data.prompt_key"), (answer_key, "data.answer_key")):
                if key not in row:
                    raise DataError(
                        f"{loc}: row has no field {key!r} ({name}); its fields are {sorted(row)}. "
                        f"Set {name} to the field that holds it."
                    )
            field = image_key if image_key in row else "images"  # known formats are read into `images`
            messages = _messages(row[prompt_key], row, template, loc, format_prompt, row.get(field) or [])
            if system_prompt and messages[0]["role"] != "system":
                messages = [{"role": "system", "content": system_prompt}, *messages]
            images = [
                load_image(v, f"{loc} {field}[{k}]", image_root) for k, v in enumerate(row.get(field) or [])
            ]
            vision = {}
            if processor is not None and max_images is not None and len(images) > max_images:
                raise DataError(
                    f"{loc}: row has {len(images)} images, more than worker.rollout.agent.max_images={max_images} "
                    "(the images a trajectory may hold, its prompt's included; rollout engines are sized for it). "
                    "Raise worker.rollout.agent.max_images or drop the row."
                )
            if processor is not None:
                fitted = [fit_pixels(im, min_pixels, max_pixels, factor, loc) for im in images]
                encoded = encode_prompt(processor, messages, fitted, loc)
                ids = encoded.input_ids.tolist()
                text = processor.tokenizer.decode(ids)
                vision = {"pixel_values": encoded.pixel_values, "image_grid_thw": encoded.image_grid_thw}
            elif use_chat:
                ids = tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
                text = tokenizer.decode(ids)
            else:
                text = "\n".join(m["content"] for m in messages)
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > max_prompt_length:
                if filter_overlong_prompts:
                    self.num_filtered += 1
                    continue
                raise DataError(
                    f"{loc}: prompt has {len(ids)} tokens, more than data.max_prompt_length={max_prompt_length}. "
                    "Raise data.max_prompt_length or set data.filter_overlong_prompts=true."
                )
            # a known format's row keeps its metadata under `extra`; other fields join it
            nested = row.get("extra") if isinstance(row.get("extra"), dict) else {}
            skip = (prompt_key, answer_key, data_source_key, "extra", "images", image_key)
            extra = {**nested, **{k: v for k, v in row.items() if k not in skip}}
            self.items.append(
                {
                    "prompt_ids": list(ids),
                    "prompt": text,
                    "prompt_messages": messages,
                    "ground_truth": row[answer_key],
                    # a known format's own source fields (Nemotron's `source`, `dataset`) sit under `extra`
                    "data_source": str(row.get(data_source_key, nested.get(data_source_key, default_source))),
                    "extra": extra,
                    "images": images,
                    "where": loc,
                    **vision,
                }
            )
        if not self.items:
            raise DataError(
                f"{spec}: every one of {len(rows)} prompts is longer than data.max_prompt_length={max_prompt_length}"
            )

    @classmethod
    def from_config(
        cls,
        spec: str,
        tokenizer,
        d: DataConfig,
        max_samples: int = -1,
        processor: VisionProcessor | None = None,
        system_prompt: str | None = None,
        max_images: int | None = None,
    ) -> PromptDataset:
        return cls(
            spec,
            tokenizer,
            prompt_key=d.prompt_key,
            answer_key=d.answer_key,
            data_source_key=d.data_source_key,
            format_prompt=d.format_prompt,
            apply_chat_template=d.apply_chat_template,
            max_prompt_length=d.max_prompt_length,
            filter_overlong_prompts=d.filter_overlong_prompts,
            max_samples=max_samples,
            data_format=d.format,
            processor=processor,
            system_prompt=system_prompt,
            image_dir=d.image_dir,
            min_pixels=d.min_pixels,
            max_pixels=d.max_pixels,
            max_images=max_images,
            image_key=d.image_key,
        )

    def __len__(self) -> int:
        return len(self.items)

    def held_out(self, fraction: float, seed: int, max_samples: int = -1) -> PromptDataset:
        """Move a `fraction` of the rows (at least one, picked with `seed`) out of this dataset into a new
        one, for validation (at most `max_samples` of them kept there, -1: all). This keeps the rest, in
        their order."""
        if len(self.items) < 2:
            raise DataError(
                "data.val_split needs at least 2 training rows (one to train on, one to hold out)"
            )
        k = min(len(self.items) - 1, max(1, round(fraction * len(self.items))))
        picked = set(random.Random(seed).sample(range(len(self.items)), k))
        held = copy.copy(self)
        held.items = [it for i, it in enumerate(self.items) if i in picked]
        if max_samples >= 0:
            held.items = held.items[:max_samples]
        held.num_filtered = 0
        self.items = [it for i, it in enumerate(self.items) if i not in picked]
        return held

    def batch(self, indices: list[int], uid_prefix: str = "") -> Batch:
        """The rows at `indices` as a Batch, one `uid` per prompt."""
        items = [self.items[i] for i in indices]
        cols: dict[str, list] = {k: [it[k] for it in items] for k in items[0]}
        cols["uid"] = [f"{uid_prefix}{i}" for i in indices]
        return Batch(cols)


def prompt_sets(
    d: DataConfig,
    tokenizer,
    processor: VisionProcessor | None = None,
    system_prompt: str | None = None,
    max_images: int | None = None,
) -> tuple[PromptDataset, PromptDataset | None]:
    """The training prompts and the validation prompts: `data.val_files`, else a `data.val_split` share
    held out of the training rows, else none."""
    extra = (processor, system_prompt, max_images)
    train = PromptDataset.from_config(d.train_files, tokenizer, d, -1, *extra)
    if d.val_files:
        return train, PromptDataset.from_config(d.val_files, tokenizer, d, d.val_max_samples, *extra)
    return train, train.held_out(d.val_split, d.seed, d.val_max_samples) if d.val_split > 0 else None


def _load_template(path: str) -> jinja2.Template:
    """`data.format_prompt`: a template file, or the template's text itself."""
    try:
        return jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False).from_string(
            chat_template_text(path)
        )
    except (OSError, jinja2.TemplateSyntaxError) as e:
        raise DataError(f"data.format_prompt {path!r}: {e}") from e


def _messages(
    value: Any, row: dict, template: jinja2.Template | None, loc: str, tpl_path: str | None, images: list
) -> list[dict]:
    if isinstance(value, list):
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
            raise DataError(f"{loc}: a list prompt must hold chat messages ({{'role': ..., 'content': ...}})")
        return value
    if not isinstance(value, str):
        raise DataError(
            f"{loc}: prompt must be a string or a list of chat messages, got {type(value).__name__}"
        )
    if template is not None:
        try:
            # EasyR1's templates read the prompt as `content`; `prompt` too, unless the row has a field of that
            # name; and `images`, the row's image list: empty for a text row (its loops render nothing)
            value = template.render(**{"prompt": value, **row, "images": images, "content": value})
        except jinja2.UndefinedError as e:
            raise DataError(
                f"{loc}: data.format_prompt {tpl_path!r} uses a field the row lacks: {e.message}"
            ) from e
    return [{"role": "user", "content": value}]


class PromptLoader:
    """Batches of `batch_size` prompts, reshuffled each epoch with `seed + epoch`; drops the last partial batch.

    Its position (epoch and batch index) is saved with checkpoints, so a resumed run sees the
    same prompts in the same order as one that never stopped.
    """

    def __init__(self, dataset: PromptDataset, batch_size: int, shuffle: bool, seed: int):
        if len(dataset) < batch_size:
            raise DataError(
                f"the training set has {len(dataset)} prompts (after filtering), fewer than one batch of "
                f"data.rollout_batch_size={batch_size}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.index = 0

    def __len__(self) -> int:
        return len(self.dataset) // self.batch_size

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=g).tolist()

    def next_indices(self) -> list[int]:
        """Dataset indices of the next batch (advances the position)."""
        if self.index >= len(self):
            self.epoch, self.index = self.epoch + 1, 0
        order = self._order(self.epoch)
        idx = order[self.index * self.batch_size : (self.index + 1) * self.batch_size]
        self.index += 1
        return idx

    def next_batch(self) -> Batch:
        idx = self.next_indices()
        return self.dataset.batch(idx, uid_prefix=f"e{self.epoch}-")

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


def sft_batch(
    dataset: PromptDataset, indices: list[int], tokenizer, processor: VisionProcessor | None = None
) -> Batch:
    """Prompt + ground-truth answer + EOS per row, right-padded; `response_mask` marks the answer and EOS.

    A ground truth that is a list of chat messages is a multi-turn continuation, laid out as the agent
    loop lays out a trajectory: `assistant` messages are trained on (the last one ends with EOS);
    other messages (a tool's observation: `content` with `<image>` placeholders and the message's
    `images`) are rendered through the chat template as the next turn with `response_mask = 0`
    (`models.vision.encode_observation`). Rows of a vision model also carry their images; their
    M-RoPE positions need the model and are computed by the policy worker from the image grids."""
    seqs, masks, pixels, grids = [], [], [], []
    for i in indices:
        it = dataset.items[i]
        ids, mask = list(it["prompt_ids"]), [0] * len(it["prompt_ids"])
        row_pixels = [it["pixel_values"]] if "pixel_values" in it else []
        row_grids = [it["image_grid_thw"]] if "image_grid_thw" in it else []
        turns = it["ground_truth"]
        if not isinstance(turns, list):
            turns = [{"role": "assistant", "content": str(turns)}]
        for k, message in enumerate(turns):
            if message["role"] == "assistant":
                part = tokenizer(str(message["content"]), add_special_tokens=False)["input_ids"]
                part += [tokenizer.eos_token_id] if k == len(turns) - 1 else []
                ids, mask = ids + part, mask + [1] * len(part)
                continue
            encoded = encode_observation(
                processor or VisionProcessor(tokenizer, None),
                str(message["content"]),
                list(message.get("images") or []),
                f"{it['where']} answer[{k}]",
                response_ended_with_eos=False,
                role=message["role"],
            )
            ids, mask = ids + encoded.input_ids.tolist(), mask + [0] * len(encoded.input_ids)
            row_pixels.append(encoded.pixel_values)
            row_grids.append(encoded.image_grid_thw)
        seqs.append(ids)
        masks.append(mask)
        pixels.append(torch.cat(row_pixels) if row_pixels else None)
        grids.append(torch.cat(row_grids) if row_grids else None)
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    response_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, (s, m) in enumerate(zip(seqs, masks)):
        input_ids[r, : len(s)] = torch.tensor(s)
        attention_mask[r, : len(s)] = 1
        response_mask[r, : len(m)] = torch.tensor(m)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    batch = Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask,
        }
    )
    if processor is not None:  # a vision model: the actor computes M-RoPE positions
        batch["pixel_values"] = pixels
        batch["image_grid_thw"] = grids
    return batch
