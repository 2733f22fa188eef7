"""The preset registry and its command line, the shipped quantization recipes, and `--verify`'s
comparison of a quantized export with its own float weights, on tiny random checkpoints."""

from __future__ import annotations

import json

import pytest
from test_recipes import _hf_config, _tiny_checkpoint

import coreai  # noqa: F401 - system BLAS before mlx.core
from coreai import store
from coreai.cli import main
from recipes import ExportError, SourceError, export
from recipes.presets import PRESETS, output_name

# Issue 28's rows: every preset of the reference registry (macOS), plus the two offline rows.
ROWS = {
    "qwen2.5-1.5b-instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-4b": "Qwen/Qwen3-4B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-coder-30b-a3b-instruct": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    "gemma3-4b-it": "google/gemma-3-4b-it",
    "gemma3-12b-it": "google/gemma-3-12b-it",
    "mistral-7b-instruct-v0.3": "mistralai/Mistral-7B-Instruct-v0.3",
    "mixtral-8x7b-instruct-v0.1": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "phi-4-mini-instruct": "microsoft/Phi-4-mini-instruct",
    "phi-3.5-mini-instruct": "microsoft/Phi-3.5-mini-instruct",
    "phi-3-mini-instruct": "microsoft/Phi-3-mini-4k-instruct",
}


def test_list_models_lists_every_row(capsys):
    assert main(["export", "--list-models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [*ROWS, *store.REGISTRY]
    assert main(["export", "--list-models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"]: r["hf_id"] for r in rows if r["source"] == "hf"} == ROWS
    assert {r["name"] for r in rows if r["source"] == "embedded"} == set(store.REGISTRY)
    from recipes.families import RECIPES

    assert all(r["family"] in RECIPES for r in rows)  # every row has a recipe
    assert {r["name"] for r in rows if r["moe"]} == {
        "qwen3-coder-30b-a3b-instruct",
        "mixtral-8x7b-instruct-v0.1",
        "gpt-oss-20b",
    }


def test_model_info(capsys):
    assert main(["export", "--model-info", "qwen3-0.6b", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["quantization"] == "qwen3-0.6b-mixed-4bit-8bit" and info["context"] == 8192
    assert info["output_name"] == "qwen3_0_6b_mixed_4bit_8bit"
    assert main(["export", "--model-info", "llama-9"]) == 1
    err = capsys.readouterr().err
    assert "unknown model 'llama-9'" in err and "qwen3-4b" in err and err.count("\n") == 1


def test_output_names():
    assert output_name("Qwen/Qwen3-0.6B", "4bit") == "qwen3_0_6b_4bit"
    assert output_name("mistralai/Mistral-7B-Instruct-v0.3", "none") == "mistral_7b_instruct_v0_3"
    assert PRESETS["phi-3-mini-instruct"].output_name() == "phi_3_mini_4k_instruct_phi_4bit_embedding_excluded"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No hub and an empty hub cache, whatever the machine has."""
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))


@pytest.mark.parametrize("source", ["qwen3-4b", "Qwen/Qwen3-4B"])
def test_offline_repo_names_what_to_download(offline, tmp_path, capsys, source):
    assert main(["export", source, "--output-dir", str(tmp_path / "exports")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("coreai export: error: Qwen/Qwen3-4B: not in the Hugging Face cache")
    assert "hf download Qwen/Qwen3-4B" in err and err.count("\n") == 1
    assert not (tmp_path / "exports").exists()


def test_preset_from_folder_fills_its_options(tmp_path):
    """`coreai export qwen3-0.6b --from DIR`: the preset's mixed recipe, dtype, context and name."""
    config, cls = _hf_config("qwen3")
    config.max_position_embeddings = 40960  # Qwen3-0.6B's, above the preset's 8192
    _tiny_checkpoint((config, cls), tmp_path / "hf")
    argv = ["export", "qwen3-0.6b", "--from", str(tmp_path / "hf"), "--output-dir", str(tmp_path / "x"), "--quiet"]
    assert main(argv) == 0
    out = tmp_path / "x" / "qwen3_0_6b_mixed_4bit_8bit"
    meta = json.loads((out / "coreai.json").read_text())
    assert meta["preset"] == "qwen3-0.6b" and meta["dtype"] == "float16" and meta["max_context_length"] == 8192
    assert meta["quantization"]["preset"] == "qwen3-0.6b-mixed-4bit-8bit" and 4 < meta["bits_per_weight"] < 9


def test_qwen3_mixed_recipe_layers(tmp_path):
    """The shipped Qwen3 0.6B recipe on a tiny Qwen3: layer 0 at 8 bits, layer 1 at 4, the (tied)
    embedding at 8, norms float; more bits per weight than plain 4-bit."""
    import mlx.nn as nn
    from mlx_lm.utils import load_model

    _tiny_checkpoint("qwen3", tmp_path / "hf")
    mixed = export(tmp_path / "hf", tmp_path / "m", quantize="qwen3-0.6b-mixed-4bit-8bit", progress=False)
    plain = export(tmp_path / "hf", tmp_path / "p", quantize="4bit", group_size=32, progress=False)
    assert mixed.bits_per_weight > plain.bits_per_weight
    model, _ = load_model(tmp_path / "m")
    layers = model.model.layers
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert getattr(layers[0].self_attn, proj).bits == 8 and getattr(layers[1].self_attn, proj).bits == 4
    assert layers[0].mlp.down_proj.bits == 8 and layers[1].mlp.down_proj.bits == 4
    assert model.model.embed_tokens.bits == 8 and model.model.embed_tokens.group_size == 32
    assert type(layers[0].self_attn.q_norm) is nn.RMSNorm and type(layers[0].input_layernorm) is nn.RMSNorm


def test_phi_recipe_keeps_embedding_and_head_float(tmp_path):
    import mlx.nn as nn
    from mlx_lm.utils import load_model

    _tiny_checkpoint("phi3", tmp_path / "hf")
    export(tmp_path / "hf", tmp_path / "q", quantize="phi-4bit-embedding-excluded", progress=False)
    model, _ = load_model(tmp_path / "q")
    assert type(model.model.embed_tokens) is nn.Embedding and type(model.lm_head) is nn.Linear
    assert model.model.layers[0].self_attn.qkv_proj.bits == 4


def test_int8_embedding_option(tmp_path):
    from mlx_lm.utils import load_model

    _tiny_checkpoint("llama", tmp_path / "hf")
    export(tmp_path / "hf", tmp_path / "q", quantize="4bit", group_size=32, embedding_bits=8, progress=False)
    model, _ = load_model(tmp_path / "q")
    assert model.model.embed_tokens.bits == 8 and model.model.layers[0].mlp.up_proj.bits == 4
    with pytest.raises(ExportError, match="exclude each other"):
        export(tmp_path / "hf", tmp_path / "o", quantize="4bit", keep_embedding=True, embedding_bits=8)


def test_verify_compares_quantized_with_its_float_weights(tmp_path):
    """--verify on a quantized export: perplexity of both and top-1 agreement, without a second
    export; 8 bits agree with the float weights at least as well as 2 bits."""
    _tiny_checkpoint("qwen2", tmp_path / "hf")
    _paragraph_tokenizer(tmp_path / "hf")
    checks = {"max_perplexity": 1e9, "expect": None, "min_agreement": 0.0}
    q8 = export(tmp_path / "hf", tmp_path / "q8", quantize="8bit", verify=checks, progress=False).verify
    q2 = export(tmp_path / "hf", tmp_path / "q2", quantize="mixed", config=_two_bits(tmp_path), verify=checks)
    assert q8.reference_perplexity is not None and 0.0 <= q2.verify.agreement < q8.agreement
    assert "top-1 agreement" in q8.summary() and "unquantized perplexity" in q8.summary()


def _paragraph_tokenizer(folder):
    """Replace the tiny checkpoint's tokenizer by a word-level one over the words of the verify
    paragraph, so the paragraph encodes to real, distinct ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from recipes.check import paragraph

    backend = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    words = dict.fromkeys(w for w, _ in backend.pre_tokenizer.pre_tokenize_str(paragraph()))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>").save_pretrained(folder)


def _two_bits(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text("bits = 2\ngroup_size = 32\n")
    return path


def test_bad_preset_inputs(tmp_path):
    _tiny_checkpoint("qwen2", tmp_path / "hf")
    native = _hf_config("qwen2")[0].max_position_embeddings
    with pytest.raises(ExportError, match=f"context length 4096 exceeds the model's maximum {native}"):
        export(tmp_path / "hf", tmp_path / "o", max_context_length=4096, progress=False)
    with pytest.raises(ExportError, match="unknown quantization 'q3'.*qwen3-4b-mixed-4bit-8bit"):
        export(tmp_path / "hf", tmp_path / "o", quantize="q3", progress=False)
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"\0" * 64)  # a truncated download
    with pytest.raises(SourceError, match="model.safetensors"):
        export(tmp_path / "hf", tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()
