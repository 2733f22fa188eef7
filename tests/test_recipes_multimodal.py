"""Multimodal checkpoints: the text decoder of a tiny random `Gemma3ForConditionalGeneration`
(Gemma 3 4B/12B's class) exported as `gemma3_text`, from the release's layout (sparse
text_config, `language_model.model.*`) and from the nested names (`model.language_model.*`);
a multimodal family with no unwrap is refused.

The text decoder keeps transformers' default head layout (8 heads, 4 KV heads, head_dim 256, as
the Gemma 3 release's config leaves unstated and mlx-lm's gemma3_text defaults differ from) at
width 64 and 4 layers, one full-attention layer in 2, linear rope scaling 8 on the full layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_recipes import VOCAB, _assert_parity, _tiny_checkpoint

import coreai  # noqa: F401 - system BLAS before mlx.core
from recipes import ExportError, export

# The text_config as the Gemma 3 release writes it: only what differs from transformers' defaults,
# in the pre-5.0 rope keys.
RELEASE_TEXT_CONFIG = {
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "vocab_size": VOCAB,
    "sliding_window": 4,
    "sliding_window_pattern": 2,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
}
VISION = ("vision_tower", "multi_modal_projector")


def gemma3_multimodal():
    """(transformers config, model class) of a tiny random Gemma 3 vision-language model."""
    import transformers as T

    text = T.Gemma3TextConfig(
        **{k: v for k, v in RELEASE_TEXT_CONFIG.items() if k not in ("model_type", "rope_scaling")},
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        initializer_range=0.1,
    )
    # 28 / 14 = 2 patches a side, pooled to mm_tokens_per_image = 4 (2 x 2) image tokens.
    vision = T.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    config = T.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    return config, T.Gemma3ForConditionalGeneration


def _as_release(folder: Path) -> None:
    """The Gemma 3 release's config.json: its sparse text_config (transformers 5 saves every key).
    The weight names are already the release's (transformers 5 saves the legacy llava names)."""
    config = json.loads((folder / "config.json").read_text())
    config["text_config"] = RELEASE_TEXT_CONFIG
    (folder / "config.json").write_text(json.dumps(config))


def _as_nested_names(folder: Path) -> None:
    """The weight names transformers uses in memory since 4.52 (`model.language_model.*`), which
    checkpoints saved without the reverse mapping carry."""
    import mlx.core as mx

    renames = (
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    )
    weights = mx.load(str(folder / "model.safetensors"))
    mx.eval(list(weights.values()))  # read before the file is overwritten
    renamed = {}
    for name, value in weights.items():
        old, new = next((o, n) for o, n in renames if name.startswith(o))
        renamed[new + name[len(old) :]] = value
    mx.save_safetensors(str(folder / "model.safetensors"), renamed, metadata={"format": "pt"})


@pytest.mark.parametrize("layout", [_as_release, _as_nested_names], ids=["release", "nested-names"])
def test_gemma3_multimodal_text_decoder_parity(layout, tmp_path):
    """Text logits equal transformers' (float32) over a prompt plus 4 cached steps; the folder is
    a gemma3_text model (rope scaling, sliding pattern and tied head kept) without vision weights,
    which mlx_lm.load and coreai.load take and generate from."""
    import mlx.core as mx
    import mlx_lm

    ref = _tiny_checkpoint(gemma3_multimodal(), tmp_path / "hf")
    layout(tmp_path / "hf")
    report = export(tmp_path / "hf", tmp_path / "mlx", dtype="float32", progress=False)
    assert report.recipe == "gemma3"
    _assert_parity(ref, tmp_path / "mlx")

    config = json.loads((tmp_path / "mlx" / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and "text_config" not in config and "vision_config" not in config
    assert config["sliding_window_pattern"] == 2 and config["sliding_window"] == 4
    assert config["rope_scaling"]["factor"] == 8.0 and config["rope_local_base_freq"] == 10_000.0
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (8, 4, 256)
    names = list(mx.load(str(tmp_path / "mlx" / "model.safetensors")))
    assert not [n for n in names if any(v in n for v in VISION)]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # the head stays tied

    model, tokenizer = mlx_lm.load(str(tmp_path / "mlx"))
    assert type(model).__module__ == "mlx_lm.models.gemma3_text"
    assert mlx_lm.generate(model, tokenizer, "w5 w17 w42", max_tokens=3)
    result = coreai.load(tmp_path / "mlx").generate("w5 w17 w42", max_tokens=3, temperature=0.0)
    assert result.usage.completion_tokens >= 1


@pytest.mark.parametrize("recipe", [None, "llama"])
def test_multimodal_family_without_unwrap_is_refused(recipe, tmp_path):
    """A llava checkpoint (a Llama decoder behind a CLIP tower): no recipe unwraps it, with or
    without --recipe; one line naming the folder and the types, nothing written."""
    import transformers as T

    folder = tmp_path / "llava"
    text = T.LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=VOCAB)
    vision = T.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    T.LlavaConfig(text_config=text, vision_config=vision).save_pretrained(folder)
    with pytest.raises(ExportError) as info:
        export(folder, tmp_path / "out", recipe=recipe, progress=False)
    message = str(info.value)
    assert message.startswith(f"{folder}: multimodal checkpoint (model_type 'llava', text decoder 'llama')")
    assert f"the {recipe} recipe does not" in message if recipe else "no recipe exports its text decoder" in message
    assert "multimodal types supported: gemma3" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llava"]


def test_gemma3_preset_from_release_folder(tmp_path):
    """`coreai export gemma3-4b-it --from DIR` on a folder in the release's layout: the preset's
    4-bit (group 32), bfloat16 and 131072-token context, and the text decoder only."""
    import mlx.core as mx

    from coreai.cli import main

    _tiny_checkpoint(gemma3_multimodal(), tmp_path / "hf")
    _as_release(tmp_path / "hf")
    argv = ["export", "gemma3-4b-it", "--from", str(tmp_path / "hf"), "--output-dir", str(tmp_path / "x"), "--quiet"]
    assert main(argv) == 0
    out = tmp_path / "x" / "gemma_3_4b_it_4bit"
    meta = json.loads((out / "coreai.json").read_text())
    assert meta["preset"] == "gemma3-4b-it" and meta["recipe"] == "gemma3" and meta["model_type"] == "gemma3_text"
    assert meta["dtype"] == "bfloat16" and meta["max_context_length"] == 131_072
    assert meta["quantization"]["group_size"] == 32 and 4 < meta["bits_per_weight"] < 6
    assert not [n for n in mx.load(str(out / "model.safetensors")) if any(v in n for v in VISION)]


def test_multimodal_tensor_of_neither_side_is_named(tmp_path):
    """A tensor outside the decoder and the vision tower (here an audio tower): one line naming it."""
    import mlx.core as mx

    _tiny_checkpoint(gemma3_multimodal(), tmp_path / "hf")
    mx.save_safetensors(str(tmp_path / "hf" / "extra.safetensors"), {"audio_tower.proj.weight": mx.zeros((4, 4))})
    with pytest.raises(ExportError, match="tensor audio_tower.proj.weight is neither the text decoder's"):
        export(tmp_path / "hf", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
