"""Vision-language models: the tiny Qwen2.5-VL, images in every stored form, prompt encoding with
images, M-RoPE positions, rollout log-probs that match a forward pass, gradients, stop strings."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from rlstack.cli import main
from rlstack.data.images import fit_pixels, load_image
from rlstack.models.loading import (
    BUILTIN_VISION_MODEL,
    load_causal_lm,
    load_processor,
    load_tokenizer,
    resolve_model_path,
)
from rlstack.models.logprobs import forward_logprobs
from rlstack.models.vision import (
    TINY_MAX_PIXELS,
    TINY_MIN_PIXELS,
    EncodedPrompt,
    ImageInputError,
    VisionProcessor,
    as_model_positions,
    build_vision_tokenizer,
    encode_observation,
    encode_prompt,
    is_vision_model,
    position_ids,
    run_vision_tower_in_every_pass,
    vision_tower,
    vision_tower_parameters,
)
from rlstack.rollout.engine import Request, SamplingSettings
from rlstack.rollout.hf import HFEngine, StopStrings, sample

EOS_BIAS = 3.5  # responses end at different lengths with the near-uniform random model


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def png_bytes(image: Image.Image, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    image.convert(mode).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vl_dir() -> Path:
    return Path(resolve_model_path(BUILTIN_VISION_MODEL))


@pytest.fixture(scope="module")
def proc(vl_dir):
    return load_processor(str(vl_dir))


def sharpened(m, eos_token_id: int):
    """`m` in eval mode with sharpened attention and a bias towards EOS (responses of different lengths).

    A random initialisation attends almost uniformly, which hides position errors (a log-prob
    moves by ~1e-3 when every position is wrong); queries and keys 8x larger make them show.
    """
    m.eval()
    text = m.config.text_config
    head = torch.nn.Linear(text.hidden_size, text.vocab_size, bias=True)
    with torch.no_grad():
        for layer in m.model.language_model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
        head.weight.copy_(m.lm_head.weight)
        head.bias.zero_()
        head.bias[eos_token_id] = EOS_BIAS
    m.lm_head = head
    return m


@pytest.fixture(scope="module")
def vl_model(vl_dir, proc):
    return sharpened(load_causal_lm(str(vl_dir)), proc.tokenizer.eos_token_id)


def _tiny_text(tok, **extra) -> dict:
    """The language model part of a tiny Qwen-VL config (64 wide, 2 layers)."""
    return {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        **extra,
    }


def _vision_token_ids(tok) -> dict[str, int]:
    names = {"image_token_id": "<|image_pad|>", "vision_start_token_id": "<|vision_start|>"}
    names["vision_end_token_id"] = "<|vision_end|>"
    return {key: tok.convert_tokens_to_ids(token) for key, token in names.items()}


def tiny_qwen3_vl() -> tuple[torch.nn.Module, VisionProcessor]:
    """A tiny Qwen3-VL (patch 16, interleaved M-RoPE, deepstack features) and its processor."""
    tok = build_vision_tokenizer()
    config = Qwen3VLConfig(
        text_config=_tiny_text(
            tok,
            head_dim=16,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
        ),
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": 16,
            "out_hidden_size": 64,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        **_vision_token_ids(tok),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=16,
        min_pixels=4 * 32 * 32,
        max_pixels=16 * 32 * 32,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    return Qwen3VLForConditionalGeneration(config), VisionProcessor(tok, image_processor)


def tiny_qwen2_vl() -> tuple[torch.nn.Module, VisionProcessor]:
    """A tiny Qwen2-VL (the generation before 2.5: no window attention, the same M-RoPE layout)."""
    tok = build_vision_tokenizer()
    config = Qwen2VLConfig(
        text_config=_tiny_text(tok, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]}),
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
        },
        **_vision_token_ids(tok),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)
    return Qwen2VLForConditionalGeneration(config), VisionProcessor(tok, image_processor)


ROWS = [  # 0, 1 and 2 images, prompts of different lengths (so the batch is left-padded)
    ("Say hi.", []),
    ("<image>What is this?", [picture(60, 40, 1)]),
    ("Compare <image> with <image>.", [picture(30, 90, 2), picture(100, 100, 3)]),
]


def encode_rows(proc) -> list[EncodedPrompt]:
    return [
        encode_prompt(proc, [{"role": "user", "content": text}], images, f"test.jsonl:{i}")
        for i, (text, images) in enumerate(ROWS)
    ]


@pytest.fixture(scope="module")
def encoded(proc):
    return encode_rows(proc)


@pytest.fixture(scope="module", params=["qwen2.5-vl", "qwen2-vl", "qwen3-vl"])
def family(request):
    """(model, processor, encoded ROWS) for each supported model family."""
    if request.param == "qwen2.5-vl":
        proc = request.getfixturevalue("proc")
        return request.getfixturevalue("vl_model"), proc, request.getfixturevalue("encoded")
    model, proc = tiny_qwen2_vl() if request.param == "qwen2-vl" else tiny_qwen3_vl()
    return sharpened(model, proc.tokenizer.eos_token_id), proc, encode_rows(proc)


# ------------------------------------------------------------------------------------ the tiny model


def test_init_model_vision_writes_a_model_that_reloads_offline(tmp_path: Path, capsys, tiny_model_dir):
    out = tmp_path / "vl"
    sizes = ["--hidden-size", "32", "--num-layers", "1", "--num-heads", "2", "--num-kv-heads", "1"]
    assert main(["init-model", str(out), "--vision", *sizes]) == 0
    assert "Qwen2.5-VL" in capsys.readouterr().out
    model = load_causal_lm(str(out))
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration" and is_vision_model(model)
    assert (model.config.text_config.hidden_size, model.config.text_config.num_hidden_layers) == (32, 1)
    proc = load_processor(str(out))
    assert proc.image_processor.size.shortest_edge == TINY_MIN_PIXELS
    assert proc.image_processor.size.longest_edge == TINY_MAX_PIXELS
    assert proc.image_token_id == model.config.image_token_id and proc.factor == 28
    tok = load_tokenizer(str(out))
    assert tok.padding_side == "left" and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "1+1="}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        text
        == "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>1+1=<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(proc.image_token_id) == 1 and tok.decode(ids) == text
    # text-only models have no processor and load as causal LMs
    assert load_processor(str(tiny_model_dir)) is None and not is_vision_model(tiny_model_dir)


def test_builtin_vision_model_is_built_once_and_cached(vl_dir):
    assert is_vision_model(vl_dir) and (vl_dir / "preprocessor_config.json").is_file()
    stamp = (vl_dir / "config.json").stat().st_mtime_ns
    assert Path(resolve_model_path(BUILTIN_VISION_MODEL)) == vl_dir
    assert (vl_dir / "config.json").stat().st_mtime_ns == stamp


# ------------------------------------------------------------------------------------ images


def test_every_stored_form_gives_the_same_rgb_image(tmp_path: Path):
    original = picture(17, 11)
    data = png_bytes(original)
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(data)
    b64 = base64.b64encode(data).decode()
    assert len(b64) > 255  # longer than a file name may be: not mistaken for a path
    forms = {
        "bytes": data,
        "path": str(tmp_path / "imgs" / "a.png"),
        "relative path": "a.png",
        "base64": b64,
        "data URL": f"data:image/png;base64,{b64}",
        "PIL": original,
        "PIL RGBA": original.convert("RGBA"),
        "RGBA png": png_bytes(original, "RGBA"),
        "struct bytes": {"bytes": data, "path": None},
        "struct path": {"bytes": None, "path": str(tmp_path / "imgs" / "a.png")},
        "array": np.asarray(original),
    }
    for name, value in forms.items():
        image = load_image(value, f"row {name}", image_dir=tmp_path / "imgs")
        assert image.mode == "RGB" and image.size == (17, 11), name
        assert np.array_equal(np.asarray(image), np.asarray(original)), name


@pytest.mark.parametrize(
    "value, match",
    [
        (b"not an image at all", "not a readable image"),
        (png_bytes(picture(8, 8))[:40], "not a readable image"),  # truncated file
        ("missing/file.png", "neither an existing image file nor base64"),
        ("https://example.com/a.png", "never downloads"),
        ("data:image/png,rawdata", "not base64"),
        ({"bytes": None, "path": None}, "neither 'bytes' nor 'path'"),
        (12, "type int is not an image"),
    ],
)
def test_a_bad_image_names_the_row_and_the_fix(value, match):
    with pytest.raises(ImageInputError, match=match) as info:
        load_image(value, "train.jsonl:12 images[0]")
    assert str(info.value).startswith("train.jsonl:12 images[0]: ")


def test_a_row_with_more_images_than_a_trajectory_may_hold_is_refused_at_load(tmp_path: Path, proc):
    """`worker.rollout.agent.max_images` counts the prompt's images (vLLM is started with it as its limit
    per prompt): a row with more is named when the data loads, not refused by an engine mid-rollout."""
    import json

    from rlstack.data.dataset import DataError, PromptDataset

    image = base64.b64encode(png_bytes(picture(28, 28))).decode()
    rows = [
        {"problem": "<image>one", "answer": "1", "images": [image]},
        {"problem": "<image><image><image>three", "answer": "3", "images": [image] * 3},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kwargs = {"processor": proc, "min_pixels": TINY_MIN_PIXELS, "max_pixels": TINY_MAX_PIXELS}
    assert len(PromptDataset(str(path), proc.tokenizer, max_images=3, **kwargs)) == 2
    with pytest.raises(
        DataError, match=r"train.jsonl:2: row has 3 images, more than worker.rollout.agent.max_images=2"
    ):
        PromptDataset(str(path), proc.tokenizer, max_images=2, **kwargs)


def test_image_key_names_the_field_that_holds_a_rows_images(tmp_path: Path, proc):
    import json

    from rlstack.data.dataset import PromptDataset

    image = base64.b64encode(png_bytes(picture(28, 28))).decode()
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"problem": "<image>one", "answer": "1", "pictures": [image]}) + "\n")
    kwargs = {"processor": proc, "min_pixels": TINY_MIN_PIXELS, "max_pixels": TINY_MAX_PIXELS}
    (item,) = PromptDataset(str(path), proc.tokenizer, image_key="pictures", **kwargs).items
    assert len(item["images"]) == 1 and len(item["image_grid_thw"]) == 1
    assert "pictures" not in item["extra"]


def test_min_and_max_pixels_bound_the_image_and_its_grid(proc):
    big, small = picture(640, 480), picture(20, 10)
    fitted = fit_pixels(big, TINY_MIN_PIXELS, TINY_MAX_PIXELS)
    w, h = fitted.size
    assert w % 28 == 0 and h % 28 == 0 and w * h <= TINY_MAX_PIXELS and w > h
    w2, h2 = fit_pixels(small, TINY_MIN_PIXELS, TINY_MAX_PIXELS).size
    assert w2 % 28 == 0 and h2 % 28 == 0 and w2 * h2 >= TINY_MIN_PIXELS
    # the processor applies the same bounds: the grid (in 14-pixel patches) is the fitted image's
    enc = encode_prompt(proc, [{"role": "user", "content": "<image><image>"}], [big, small], "row")
    assert enc.image_grid_thw.tolist() == [[1, h // 14, w // 14], [1, h2 // 14, w2 // 14]]
    tokens_per_image = (enc.image_grid_thw.prod(-1) // 4).tolist()
    assert all(4 <= n <= 16 for n in tokens_per_image)
    assert int((enc.input_ids == proc.image_token_id).sum()) == sum(tokens_per_image)
    assert enc.pixel_values.shape == (int(enc.image_grid_thw.prod(-1).sum()), proc.patch_dim)
    with pytest.raises(ImageInputError, match="row 3 images"):
        fit_pixels(picture(1000, 2), TINY_MIN_PIXELS, TINY_MAX_PIXELS, where="row 3 images[0]")


# ------------------------------------------------------------------------------------ prompts


def test_placeholders_become_image_parts_in_order(proc, encoded):
    ids = encoded[2].input_ids.tolist()
    text = proc.tokenizer.decode(ids)
    pads = (8 * 4 // 4, 8 * 8 // 4)  # merged patches of the 30x90 and 100x100 pictures
    assert text == (
        "<|im_start|>user\nCompare <|vision_start|>"
        + "<|image_pad|>" * pads[0]
        + "<|vision_end|> with <|vision_start|>"
        + "<|image_pad|>" * pads[1]
        + "<|vision_end|>.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert encoded[0].pixel_values.shape == (0, proc.patch_dim) and encoded[0].image_grid_thw.shape == (0, 3)


@pytest.mark.parametrize(
    "content, n_images, match",
    [
        ("<image> and <image>", 1, "the prompt has 2 <image> placeholder\\(s\\) but the row has 1 image"),
        ("no placeholder", 1, "has 0 <image> placeholder"),
        ("<image>", 0, "has 1 <image> placeholder\\(s\\) but the row has 0 image"),
        ("<image> sneaky <|image_pad|>", 1, "2 <\\|image_pad\\|> token\\(s\\) for 1 image"),
    ],
)
def test_placeholder_and_image_mismatches_name_the_row(proc, content, n_images, match):
    with pytest.raises(ImageInputError, match=match) as info:
        encode_prompt(
            proc, [{"role": "user", "content": content}], [picture(28, 28)] * n_images, "geo.parquet:7"
        )
    assert str(info.value).startswith("geo.parquet:7: ")


def test_image_tokens_that_do_not_match_the_images_fail_before_any_forward_pass(vl_model, encoded):
    ids = encoded[1].input_ids
    first_pad = int((ids == vl_model.config.image_token_id).nonzero()[0])
    dropped = torch.cat([ids[:first_pad], ids[first_pad + 1 :]])  # one image token fewer than the image's 6
    hook = vl_model.register_forward_pre_hook(lambda *_: pytest.fail("the model ran"))
    try:
        with pytest.raises(ImageInputError, match="batch row 0: .*\\[5\\] image tokens.*\\[6\\] patches"):
            forward_logprobs(
                vl_model,
                dropped[None],
                torch.ones_like(dropped)[None],
                torch.zeros(1, 3, len(dropped), dtype=torch.long),
                torch.ones_like(dropped)[None],
                pixel_values=[encoded[1].pixel_values],
                image_grid_thw=[encoded[1].image_grid_thw],
            )
    finally:
        hook.remove()


def test_an_observation_continues_the_conversation_as_the_chat_template_renders_it(proc):
    tok = proc.tokenizer
    first, second = picture(56, 56, 4), picture(84, 28, 5)
    prompt = encode_prompt(proc, [{"role": "user", "content": "<image>Zoom?"}], [first], "row")
    response = tok("<code>zoom()</code>", add_special_tokens=False)["input_ids"]
    obs = encode_observation(proc, "<image>zoomed", [second], "row turn 1", response_ended_with_eos=False)
    assert tok.decode(obs.input_ids).startswith("<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|>")
    assert obs.image_grid_thw.shape == (1, 3) and obs.pixel_values.shape[0] == int(obs.image_grid_thw.prod())
    whole = encode_prompt(
        proc,
        [
            {"role": "user", "content": "<image>Zoom?"},
            {"role": "assistant", "content": "<code>zoom()</code>"},
            {"role": "user", "content": "<image>zoomed"},
        ],
        [first, second],
        "row",
    )
    joined = torch.cat([prompt.input_ids, torch.tensor(response), obs.input_ids])
    assert torch.equal(joined, whole.input_ids)
    assert torch.equal(torch.cat([prompt.pixel_values, obs.pixel_values]), whole.pixel_values)
    # after a response that ended with <|im_end|>, the observation starts with the newline after it
    after_eos = encode_observation(proc, "ok", [], "row", response_ended_with_eos=True, role="tool")
    assert tok.decode(after_eos.input_ids) == "\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ImageInputError, match="row turn 2: the observation has 0 <image>"):
        encode_observation(proc, "no slot", [second], "row turn 2", response_ended_with_eos=True)


# ------------------------------------------------------------------------------------ rollout log-probs


def images_of(encoded_rows):
    return {
        "pixel_values": [e.pixel_values for e in encoded_rows],
        "image_grid_thw": [e.image_grid_thw for e in encoded_rows],
    }


def model_positions(model, out, images) -> torch.Tensor:
    return position_ids(model, out["input_ids"], out["attention_mask"], images["image_grid_thw"])


def rescore(model, out, images, positions=None, temperature=1.0):
    with torch.no_grad():
        logp, _ = forward_logprobs(
            model,
            out["input_ids"],
            out["attention_mask"],
            model_positions(model, out, images) if positions is None else positions,
            out["response_mask"],
            temperature=temperature,
            **images,
        )
    return logp * out["response_mask"]


def sample_rows(vl_model, proc, encoded, **settings) -> dict[str, torch.Tensor]:
    """`sample` over the encoded image prompts, 10 new tokens at most."""
    return sample(
        vl_model,
        [e.input_ids.tolist() for e in encoded],
        max_new_tokens=10,
        eos_token_id=proc.tokenizer.eos_token_id,
        pad_token_id=proc.tokenizer.pad_token_id,
        **settings,
        **images_of(encoded),
    )


def test_rollout_logprobs_match_a_multimodal_forward_pass(family):
    vl_model, proc, encoded = family
    images = images_of(encoded)
    for seed in range(10):
        out = sample_rows(
            vl_model, proc, encoded, temperature=0.8, generator=torch.Generator().manual_seed(seed)
        )
        if len(set(out["response_mask"].sum(-1).tolist())) > 1:
            break  # rows that end at different steps
    assert len(set(out["response_mask"].sum(-1).tolist())) > 1
    prompt_lens = [len(e.input_ids) for e in encoded]
    P = max(prompt_lens)
    positions = model_positions(vl_model, out, images)
    assert positions.shape == (3, 3, out["input_ids"].shape[1])
    assert out["attention_mask"][:, :P].sum(-1).tolist() == prompt_lens  # left padding
    diff = (rescore(vl_model, out, images, temperature=0.8) - out["rollout_logprobs"]).abs().max()
    assert diff < 1e-4
    # the M-RoPE ids matter: image rows scored with plain text positions give other log-probs
    text_pos = (out["attention_mask"].cumsum(-1) - 1).clamp(min=0)[:, None, :].expand(-1, 3, -1)
    assert not torch.equal(text_pos[1:], positions[1:])
    assert torch.equal(text_pos[0] * out["attention_mask"][0], positions[0])  # no image: text ids
    wrong = rescore(vl_model, out, images, positions=text_pos, temperature=0.8)
    assert (wrong[1:] - out["rollout_logprobs"][1:]).abs().max() > 1e-2


def test_decoding_steps_take_the_lean_step_and_sample_as_the_module_does(family, monkeypatch):
    """After the multimodal prefill, each decoded token is a text token at one M-RoPE id in all three
    dimensions: the lean step (`rlstack.models.decoding`) computes it as the module's `forward` does."""
    import rlstack.rollout.hf_sampling as hf_sampling
    from rlstack.models.decoding import LeanDecoder, why_not_lean

    vl_model, proc, encoded = family
    assert why_not_lean(vl_model, 64) is None
    steps, step = [0], LeanDecoder.step

    def counted(self, *args, **kwargs):
        steps[0] += 1
        return step(self, *args, **kwargs)

    monkeypatch.setattr(LeanDecoder, "step", counted)

    def run(seeds: torch.Tensor, through_module: bool) -> dict:
        with monkeypatch.context() as mp:
            if through_module:
                mp.setattr(hf_sampling, "lean_decoder", lambda model, positions: None)
            return sample_rows(vl_model, proc, encoded, temperature=1.0, seeds=seeds)

    for seed in range(20):  # seeds under which some row decodes several tokens
        seeds = torch.arange(3) + 10 * seed
        steps[0] = 0
        lean = run(seeds, False)
        R = lean["input_ids"].shape[1] - max(len(e.input_ids) for e in encoded)
        if R >= 4:
            break
    assert R >= 4 and steps[0] == R - 1  # one lean step per token after the prefill's
    plain = run(seeds, True)
    assert steps[0] == R - 1  # none through the module's path
    assert torch.equal(lean["input_ids"], plain["input_ids"])
    torch.testing.assert_close(lean["rollout_logprobs"], plain["rollout_logprobs"], atol=1e-5, rtol=0)


STOP = tuple("aeiou0123456789")


def test_engine_samples_n_per_image_prompt_with_shared_prefill_and_stop_strings(vl_model, proc, encoded):
    tok = proc.tokenizer
    requests = [
        Request(e.input_ids.tolist(), pixel_values=e.pixel_values, image_grid_thw=e.image_grid_thw)
        for e in encoded
        for _ in range(2)  # n = 2: neighbours share their prefill
    ]
    for seed in range(10):
        engine = HFEngine(vl_model, tok, seed=seed, multimodal=True)
        completions = engine.generate(requests, SamplingSettings(max_tokens=12, stop=STOP))
        kinds = []
        for c in completions:
            text = tok.decode(c.token_ids, skip_special_tokens=True)
            assert not any(s in text[:-1] for s in STOP)  # nothing after a stop string
            if c.finish_reason == "length":
                kinds.append("length")
            elif c.token_ids[-1] == tok.eos_token_id:
                kinds.append("eos")
            else:
                assert text.endswith(STOP)
                kinds.append("stop")
        if "stop" in kinds and len(set(kinds)) > 1:
            break
    assert "stop" in kinds and len(set(kinds)) > 1, kinds
    # the same draws as the tensor-level sampler, whose log-probs match a forward pass (above)
    out = sample(
        vl_model,
        [r.prompt_ids for r in requests],
        max_new_tokens=12,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        temperature=1.0,
        generator=torch.Generator().manual_seed(seed),
        pixel_values=[r.pixel_values for r in requests],
        image_grid_thw=[r.image_grid_thw for r in requests],
        stop=StopStrings(tok, STOP),
    )
    P = max(len(r.prompt_ids) for r in requests)
    for b, c in enumerate(completions):
        assert c.token_ids == out["input_ids"][b, P : P + len(c.token_ids)].tolist()
    images = {
        "pixel_values": [r.pixel_values for r in requests],
        "image_grid_thw": [r.image_grid_thw for r in requests],
    }
    assert (rescore(vl_model, out, images) - out["rollout_logprobs"]).abs().max() < 1e-4


def test_gradients_reach_the_language_model_and_the_vision_tower_unless_frozen(vl_dir, proc, encoded):
    model = load_causal_lm(str(vl_dir)).train()
    out = sample(
        model.eval(),
        [e.input_ids.tolist() for e in encoded],
        max_new_tokens=4,
        eos_token_id=proc.tokenizer.eos_token_id,
        pad_token_id=proc.tokenizer.pad_token_id,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
        **images_of(encoded),
    )
    model.train()
    vision = vision_tower_parameters(model)
    vision_ids = {id(p) for p in vision}
    language = [p for p in model.parameters() if id(p) not in vision_ids]
    assert vision and language

    def backward():
        model.zero_grad(set_to_none=True)
        logp, _ = forward_logprobs(
            model,
            out["input_ids"],
            out["attention_mask"],
            model_positions(model, out, images_of(encoded)),
            out["response_mask"],
            **images_of(encoded),
        )
        (-(logp * out["response_mask"]).sum()).backward()

    backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in vision)
    assert model.model.language_model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    for p in vision:
        p.requires_grad_(False)
    backward()
    assert all(p.grad is None for p in vision)
    assert model.model.language_model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_a_pass_without_images_can_run_the_vision_tower_and_change_nothing(family):
    """`run_vision_tower_in_every_pass` (what FSDP2 sharding installs): a text-only pass runs the tower on a
    blank image, with the same logits, and every tower weight gets a gradient (zero); a pass with images
    runs the tower once, as before."""
    import copy

    model, proc, _ = family
    model = copy.deepcopy(model).train()
    ids = proc.tokenizer("What is 3+3? 6", return_tensors="pt").input_ids
    before = model(input_ids=ids).logits.detach()
    run_vision_tower_in_every_pass(model)
    tower = vision_tower_parameters(model)
    calls = []
    vision_tower(model).register_forward_hook(lambda *_: calls.append(1))
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    assert torch.equal(logits, before) and len(calls) == 1
    logits.sum().backward()
    assert all(p.grad is not None and not p.grad.any() for p in tower)

    encoded = next(e for e in encode_rows(proc) if len(e.image_grid_thw))
    row = encoded.input_ids[None]
    images = {"pixel_values": encoded.pixel_values, "image_grid_thw": encoded.image_grid_thw}
    positions = position_ids(model, row, torch.ones_like(row), [encoded.image_grid_thw])
    model(input_ids=row, position_ids=as_model_positions(positions), **images)
    assert len(calls) == 2  # one more pass, one more run of the tower: no blank image


# ------------------------------------------------------------------------------------ stop strings


def first_hit(text_ids: list[int], tok, strings: tuple[str, ...]) -> int | None:
    """Index of the token that first completes one of `strings`, or None."""
    for t in range(len(text_ids)):
        if any(s in tok.decode(text_ids[: t + 1], skip_special_tokens=True) for s in strings):
            return t
    return None


def test_stop_strings_end_text_rows_exactly_where_the_string_completes(model, tok):
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "12+34=", "ab", "x"]]

    def run(stop=None):
        return sample(
            model,
            prompts,
            max_new_tokens=16,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            temperature=1.0,
            generator=torch.Generator().manual_seed(0),
            stop=stop,
        )

    free = run()
    P = max(len(p) for p in prompts)
    free_rows = [row[P:][m[P:].bool()].tolist() for row, m in zip(free["input_ids"], free["attention_mask"])]
    # stop strings taken from what two rows sample: a 2-character one and a 1-character one
    strings = (tok.decode(free_rows[0][5:7]), tok.decode(free_rows[1][9:10]))
    stopped = run(StopStrings(tok, strings))
    ended_by_stop = 0
    for b, free_ids in enumerate(free_rows):
        mask = stopped["response_mask"][b, P:].bool()
        ids = stopped["input_ids"][b, P:][mask].tolist()
        hit = first_hit(free_ids, tok, strings)
        expected = free_ids if hit is None else free_ids[: hit + 1]
        assert ids == expected, b  # same draws, cut right after the completing token
        if hit is not None:
            ended_by_stop += 1
            assert not bool(stopped["truncated"][b]) and tok.decode(ids).endswith(strings)
            kept = stopped["rollout_logprobs"][b, P:][mask]
            assert torch.allclose(kept, free["rollout_logprobs"][b, P:][: hit + 1], atol=1e-6)
    assert ended_by_stop >= 2
    with pytest.raises(ValueError, match="non-empty"):
        StopStrings(tok, ["</code>", ""])
