"""Supervised fine-tuning on (prompt, answer) rows: the warm start before RL.

Reads the same configuration as `rlstack train`: `data.*` for rows and prompt formatting
(`data.rollout_batch_size` prompts per step), `worker.actor.*` for the model, optimizer and
micro-batches, `trainer.*` for steps, seed and output. The model is trained to produce the
`data.answer_key` field followed by EOS, and written in Hugging Face format to
`<run_dir>/huggingface`.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from rlstack import checkpoint
from rlstack.config import Config, resolve_device, to_yaml
from rlstack.data.dataset import PromptDataset, PromptLoader, sft_batch
from rlstack.models.loading import load_tokenizer_and_processor, model_dir
from rlstack.rollout.agent import agent_system_prompt
from rlstack.workers.policy import PolicyWorker


def run_sft(cfg: Config) -> Path:
    d, t, a = cfg.data, cfg.trainer, cfg.worker.actor
    if t.num_threads > 0:
        import torch

        torch.set_num_threads(t.num_threads)
    checkpoint.seed_everything(t.seed, t.full_determinism)
    tok, processor = load_tokenizer_and_processor(a.model, model_dir(a.model))
    system = agent_system_prompt(cfg.worker.rollout.agent)
    dataset = PromptDataset.from_config(d.train_files, tok, d, -1, processor, system)
    loader = PromptLoader(dataset, d.rollout_batch_size, d.shuffle, d.seed)
    total = t.max_steps or len(loader) * t.total_epochs
    device = resolve_device(t.device)
    actor = PolicyWorker(a, cfg.algorithm, d.max_response_length, total, cfg.worker.rollout.seed, device)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "config.yaml").write_text(to_yaml(cfg))
    bar = tqdm(range(total), desc=f"sft {t.experiment_name}", unit="step", disable="console" not in t.logger)
    for _ in bar:
        metrics = actor.sft_update(sft_batch(dataset, loader.next_indices(), tok, processor))
        bar.set_postfix(loss=f"{metrics['sft/loss']:.3f}", refresh=False)
    out = cfg.run_dir / "huggingface"
    actor.save_model(out)
    return out
