"""`builtin:reward_model`: a sequence-classification reward model built offline, scoring reward inputs as
its own forward pass does, in its own chat template, with truncation and the config's errors; and a GRPO
run that adds its score to a rule reward."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from scored_batches import make_batch
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from rlstack.config import ConfigError, RewardModelConfig, load_config
from rlstack.errors import RLStackError
from rlstack.models.tiny import build_char_tokenizer
from rlstack.rewards.manager import RewardManager, reward_inputs
from rlstack.rewards.reward_model import RewardModel, RewardModelError
from rlstack.trainer import Trainer


def write_reward_model(path: Path, num_labels: int = 1, pad_is_eos: bool = False) -> Path:
    tok = build_char_tokenizer()
    if pad_is_eos:
        tok.pad_token = tok.eos_token
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=num_labels,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reward_model(tmp_path_factory.mktemp("rm") / "rm")


def alone(rm: RewardModel, ids: list[int]) -> float:
    """The model's output at the last token of one unpadded text: its score head over its last hidden state."""
    with torch.no_grad():
        hidden = rm.model.model(input_ids=torch.tensor([ids])).last_hidden_state
        return rm.model.score(hidden[0, -1]).item()


INPUTS = [
    {"prompt": "1+2=", "response": "3"},
    {"prompt": "12+34=", "response": "a much longer answer: 46"},
    {"prompt": "x", "response": ""},
    {"prompt": "99+1=", "response": "100<|im_end|>"},
]


def test_scores_are_the_models_output_at_each_texts_last_token_in_any_batch(rm_dir):
    rm = RewardModel(RewardModelConfig(model_path=str(rm_dir), micro_batch_size=2))
    out = rm.score(INPUTS)
    ids, _ = rm.token_ids(INPUTS)
    want = [alone(rm, row) for row in ids]
    assert [o["rm_score"] for o in out] == pytest.approx(want, abs=1e-5)
    assert [o["overall"] for o in out] == [o["rm_score"] for o in out]
    assert len(set(round(w, 4) for w in want)) == len(want)  # the texts score differently
    one_by_one = RewardModel(RewardModelConfig(model_path=str(rm_dir), micro_batch_size=1)).score(INPUTS)
    assert [o["rm_score"] for o in one_by_one] == pytest.approx(want, abs=1e-5)


def test_a_pad_token_that_is_also_the_texts_last_token_does_not_move_the_score(tmp_path):
    rm = RewardModel(RewardModelConfig(model_path=str(write_reward_model(tmp_path / "rm", pad_is_eos=True))))
    assert rm.pad_id == rm.tokenizer.eos_token_id
    ids, _ = rm.token_ids(INPUTS)
    assert ids[3][-1] == rm.pad_id  # "...<|im_end|>": the text ends with the pad token
    assert [o["rm_score"] for o in rm.score(INPUTS)] == pytest.approx([alone(rm, r) for r in ids], abs=1e-5)
    with torch.no_grad():  # Hugging Face's own pooling finds the last token by the pad id: the one before
        pooled = rm.model(input_ids=torch.tensor([ids[3]])).logits[0, 0].item()
    assert pooled != pytest.approx(alone(rm, ids[3]), abs=1e-3)


def test_the_rows_messages_are_read_in_the_reward_models_chat_template(rm_dir):
    rm = RewardModel(RewardModelConfig(model_path=str(rm_dir)))
    row = {
        "prompt": "<policy template> 1+2=",
        "response": "3",
        "prompt_messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+2="}],
    }
    text = rm.text(row)
    assert (
        text
        == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n3<|im_end|>\n"
    )
    assert rm.text({"prompt": "1+2=", "response": "3"}) == "1+2=3"  # no messages: the policy's text


def test_long_texts_keep_their_end_and_are_counted_or_fail_naming_the_row(rm_dir):
    rm = RewardModel(RewardModelConfig(model_path=str(rm_dir), max_length=5))
    out = rm.score(INPUTS)
    assert [o["rm_truncated"] for o in out] == [0.0, 1.0, 0.0, 1.0]
    full, _ = RewardModel(RewardModelConfig(model_path=str(rm_dir))).token_ids(INPUTS[1:2])
    assert out[1]["rm_score"] == pytest.approx(alone(rm, full[0][-5:]), abs=1e-5)
    strict = RewardModel(RewardModelConfig(model_path=str(rm_dir), max_length=5, truncation="error"))
    with pytest.raises(RewardModelError, match=r"reward input 1 is \d+ tokens .*max_length=5"):
        strict.score(INPUTS)


def test_bad_reward_models_and_settings_say_what_to_fix(rm_dir, tmp_path):
    two = write_reward_model(tmp_path / "two", num_labels=2)
    with pytest.raises(RewardModelError, match="has 2 outputs"):
        RewardModel(RewardModelConfig(model_path=str(two)))
    if not torch.cuda.is_available():
        with pytest.raises(RewardModelError, match="no CUDA device: use auto or cpu"):
            RewardModel(RewardModelConfig(model_path=str(rm_dir), device="cuda"))
    with pytest.raises(RewardModelError, match="cannot be loaded as a reward model"):
        RewardModel(RewardModelConfig(model_path=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="builtin:reward_model needs worker.reward.reward_model.model_path"):
        load_config(["worker.reward.extra_reward_functions=[builtin:reward_model]"])
    with pytest.raises(
        ConfigError, match="worker.reward.num_workers=0 would load the reward model in the driver"
    ):
        load_config(
            [
                "worker.reward.reward_function=builtin:reward_model",
                f"worker.reward.reward_model.model_path={rm_dir}",
                "trainer.backend=ray",
                "worker.reward.num_workers=0",
            ]
        )


def test_an_encoder_classifier_is_refused_not_misread(tmp_path):
    """Encoders (BERT, DeBERTa, RoBERTa) pool their first token or offset their positions: reading them at
    the last token of left-padded rows would give wrong scores without an error."""
    from transformers import BertConfig, BertForSequenceClassification

    tok = build_char_tokenizer()
    config = BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    config.num_labels = 1
    BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    tok.save_pretrained(tmp_path / "bert")
    with pytest.raises(RewardModelError, match="is a BertForSequenceClassification: .* encoder"):
        RewardModel(RewardModelConfig(model_path=str(tmp_path / "bert")))


def test_the_manager_loads_it_once_and_logs_its_components(rm_dir, monkeypatch):
    cfg = load_config(
        [
            "worker.reward.reward_function=builtin:reward_model",
            "worker.reward.reward_function_by_source={gsm8k: 'builtin:reward_model'}",
            f"worker.reward.reward_model.model_path={rm_dir}",
        ]
    )
    loads = []
    init = RewardModel.__init__
    monkeypatch.setattr(RewardModel, "__init__", lambda self, c: (loads.append(c), init(self, c))[1])
    manager = RewardManager.of(cfg.worker.reward, max_response_length=16)
    assert len(loads) == 1  # named twice (a route and the default), loaded once
    batch = make_batch(["3", "46"], ["3", "46"])
    out = manager.score(batch)
    direct = RewardModel(cfg.worker.reward.reward_model).score(reward_inputs(batch))
    assert out["scores"].tolist() == pytest.approx([d["rm_score"] for d in direct], abs=1e-5)
    assert out["reward_components"][0].keys() >= {"rm_score", "rm_truncated"}


def _rm_run(model: Path, rm_dir: Path, out: Path, *extra: str):
    rows = out / "train.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    rows.write_text(
        "".join(json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8))
    )
    cfg = load_config(
        [
            f"worker.actor.model.model_path={model}",
            f"trainer.output_dir={out}",
            f"data.train_files={rows}",
            "data.val_files=",
            "data.rollout_batch_size=4",
            "data.max_prompt_length=64",
            "data.max_response_length=8",
            "worker.actor.global_batch_size=4",
            "worker.rollout.n=2",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.reward.reward_function=builtin:exact_match",
            "worker.reward.extra_reward_functions=[builtin:reward_model]",
            "worker.reward.reward_weights=[1.0,0.5]",
            f"worker.reward.reward_model.model_path={rm_dir}",
            "trainer.max_steps=2",
            "trainer.logger=[file]",
            "trainer.num_threads=1",
            *extra,
        ]
    )
    Trainer(cfg).fit()
    return [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_grpo_adds_the_reward_models_score_to_a_rule_reward_also_in_a_ray_reward_actor(
    tiny_model_dir, rm_dir, tmp_path
):
    metrics = _rm_run(tiny_model_dir, rm_dir, tmp_path / "local")
    assert len(metrics) == 2
    for m in metrics:
        # an extra function's components are logged under its name
        score = m["reward/reward_model/rm_score"]
        assert score != 0.0 and m["reward/reward_model/rm_truncated"] == 0.0
        # overall = exact match + 0.5 rm_score
        assert m["critic/score/mean"] == pytest.approx(m["reward/accuracy"] + 0.5 * score, abs=1e-4)
    ray = pytest.importorskip("ray")
    # with trainer.backend=ray, the reward model loads in the reward actor and scores as it does locally
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = _rm_run(tiny_model_dir, rm_dir, tmp_path / "ray", "trainer.backend=ray")
        # a reward actor that asks for GPUs the cluster does not have left is refused, not left pending
        with pytest.raises(
            RLStackError, match=r"num_gpus=1 = 1 GPUs, but the Ray cluster has 0 GPU\(s\) left"
        ):
            _rm_run(
                tiny_model_dir,
                rm_dir,
                tmp_path / "gpus",
                "trainer.backend=ray",
                "worker.reward.reward_model.num_gpus=1",
            )
        deadline = time.monotonic() + 30  # and nothing of it is left holding the CPUs (Ray frees them lazily)
        while ray.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ray.available_resources().get("CPU") == 2
    finally:
        ray.shutdown()
    for local, remote in zip(metrics, on_ray):
        for key in ("reward/reward_model/rm_score", "reward/accuracy", "critic/score/mean"):
            assert remote[key] == pytest.approx(local[key], abs=1e-5), key
