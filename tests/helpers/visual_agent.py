"""A tiny Qwen2.5-VL warm-started to call the Python tool on the visual task, and batches of visual
prompts: shared by the agent tests here and the vLLM lane (`tests_vllm/`)."""

from __future__ import annotations

import json
from pathlib import Path

from rlstack.batch import Batch

MIN_PIXELS, MAX_PIXELS = 3136, 12544


def build_tool_vlm(folder: Path, base_model: str) -> Path:
    """`base_model` after 60 SFT steps on 64 visual rows whose answer is a Python cell that returns a
    crop of the image (the last expression comes back as an image)."""
    from rlstack.config import load_config
    from rlstack.data.visual import row
    from rlstack.sft import run_sft

    lines = []
    for i in range(64):
        r = row("train", i)
        path = folder / f"img{i}.png"
        r["images"][0].save(path)
        call = "<code>```python\nimage_1.crop((0, 0, 112, 112))\n```</code>"
        lines.append(json.dumps({"problem": r["problem"], "answer": call, "images": [path.name]}))
    (folder / "sft.jsonl").write_text("\n".join(lines) + "\n")
    cfg = load_config(
        [
            f"worker.actor.model.model_path={base_model}",
            f"trainer.output_dir={folder}",
            f"data.train_files={folder / 'sft.jsonl'}",
            "worker.reward.reward_function=builtin:agent",  # unused by the warm start; rows of its own name one
            "data.val_files=",
            "data.max_prompt_length=256",
            "data.max_response_length=64",
            f"data.min_pixels={MIN_PIXELS}",
            f"data.max_pixels={MAX_PIXELS}",
            "data.rollout_batch_size=8",
            "worker.actor.global_batch_size=8",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.actor.optim.lr=3e-3",
            "trainer.max_steps=60",
            "trainer.total_epochs=100",
            "trainer.logger=[file]",
        ]
    )
    return run_sft(cfg)


def visual_batch(processor, n_rows: int, where: str = "visual") -> Batch:
    """`n_rows` prompts of the visual task's test split, encoded as the dataset does."""
    from rlstack.data.images import fit_pixels
    from rlstack.data.visual import row
    from rlstack.models.vision import encode_prompt

    cols: dict[str, list] = {k: [] for k in ("prompt_ids", "uid", "images", "extra", "where")}
    cols |= {"pixel_values": [], "image_grid_thw": []}
    for i in range(n_rows):
        r = row("test", i)
        image = fit_pixels(r["images"][0], MIN_PIXELS, MAX_PIXELS, processor.factor)
        enc = encode_prompt(processor, [{"role": "user", "content": r["problem"]}], [image], f"{where}:{i}")
        cols["prompt_ids"].append(enc.input_ids.tolist())
        cols["pixel_values"].append(enc.pixel_values)
        cols["image_grid_thw"].append(enc.image_grid_thw)
        cols["uid"].append(str(i))
        cols["images"].append(r["images"])  # tools work on the original picture
        cols["extra"].append(r["extra"])
        cols["where"].append(f"{where}:{i}")
    return Batch(cols)
