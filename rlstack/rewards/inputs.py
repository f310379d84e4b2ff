"""What a reward function is given for each row (`reward_inputs`), and the question in it (`question_of`)."""

from __future__ import annotations

from typing import Any

from rlstack.batch import Batch


def reward_inputs(batch: Batch) -> list[dict[str, Any]]:
    """One dict per row for the reward function: the response and its length, the ground truth, prompt and
    data source, the row's other dataset fields both under `extra` and at the top level (as EasyR1 passes
    them; never over a key above), the row's chat messages before the policy's template (`prompt_messages`), its
    images (PIL images, for vision-language datasets) and, from the agent loop, its tool-call counts, its
    `turns` (each model turn with its parsed call, each tool reply with `ok` and the indices of its images
    into `tool_images`) and `tool_images` (the images the tools returned): what a tool-aware reward reads."""
    lengths = batch["response_mask"].sum(-1).tolist()
    return [
        {
            **(batch["extra"][i] if isinstance(batch["extra"][i], dict) else {}),
            "response": batch["response_text"][i],
            "response_length": int(lengths[i]),
            "ground_truth": batch["ground_truth"][i],
            "prompt": batch["prompt"][i],
            "data_source": batch["data_source"][i],
            "extra": batch["extra"][i],
            **({"prompt_messages": batch["prompt_messages"][i]} if "prompt_messages" in batch else {}),
            **({"images": batch["images"][i]} if "images" in batch else {}),
            **(
                {
                    "num_tool_calls": int(batch["tool_calls"][i]),
                    "num_tool_errors": int(batch["tool_errors"][i]),
                }
                if "tool_calls" in batch
                else {}
            ),
            **(
                {"turns": batch["turns"][i], "tool_images": batch["tool_images"][i]}
                if "turns" in batch
                else {}
            ),
        }
        for i in range(len(batch))
    ]


def question_of(x: dict[str, Any]) -> str:
    """The question a judge is asked about for a reward input: the row's `question` field, else the text of its
    last user message before the chat template, else its prompt."""
    if x.get("question") is not None:
        return str(x["question"])
    users = [m for m in x.get("prompt_messages") or () if m.get("role") == "user"]
    if users:
        content = users[-1]["content"]
        if isinstance(content, str):
            return content
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(x.get("prompt", ""))
