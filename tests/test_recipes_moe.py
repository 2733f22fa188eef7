"""MoE and gpt-oss recipes: parity against transformers on tiny random checkpoints (Hugging Face
folders and llama.cpp-layout GGUFs), per-expert quantization, routers and sinks kept in float,
Harmony special tokens kept in the tokenizer.

The checkpoints are width 64, 2 layers, 4 experts (2 active): each export takes well under a second.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_recipes import VOCAB, _assert_parity, _gguf_close, _gguf_writer, _llama_cpp_permute, _tiny_checkpoint

import coreai  # noqa: F401 - system BLAS before mlx.core
from recipes import ExportError, SourceError, export

# openai/gpt-oss-20b config.json rope_scaling (there with "truncate": false).
GPT_OSS_YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "rope_theta": 150000.0,
    "original_max_position_embeddings": 4096,
}

# The Harmony chat format's special tokens (openai/gpt-oss-20b tokenizer_config.json).
HARMONY = ("<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")


def moe_config(family: str, truncate: bool = True):
    """(transformers config, model class) of a tiny random MoE checkpoint of `family`; `truncate`:
    gpt-oss's YaRN correction range rounded to whole dimensions (the release says false)."""
    import transformers as T

    common = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        initializer_range=0.1,
        num_experts_per_tok=2,
    )
    return {
        "qwen3_moe": lambda: (
            T.Qwen3MoeConfig(
                **common,
                head_dim=16,
                intermediate_size=128,
                moe_intermediate_size=32,
                num_experts=4,
                norm_topk_prob=True,
            ),
            T.Qwen3MoeForCausalLM,
        ),
        "mixtral": lambda: (T.MixtralConfig(**common, intermediate_size=64, num_local_experts=4), T.MixtralForCausalLM),
        "gpt_oss": lambda: (
            # sliding window 4 < the 14 tokens of the parity run: the rotating cache is exercised.
            T.GptOssConfig(
                **common,
                head_dim=16,
                intermediate_size=32,
                num_local_experts=4,
                sliding_window=4,
                rope_parameters={**GPT_OSS_YARN, "truncate": truncate},
            ),
            T.GptOssForCausalLM,
        ),
    }[family]()


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_moe_hf_parity_with_transformers(family, tmp_path):
    ref = _tiny_checkpoint(moe_config(family), tmp_path / "hf")
    report = export(tmp_path / "hf", tmp_path / "mlx", dtype="float32", progress=False)
    assert report.recipe == family
    _assert_parity(ref, tmp_path / "mlx")


def test_gpt_oss_untruncated_yarn_parity(tmp_path):
    """The released gpt-oss config says `truncate: false`; mlx-lm 0.32.2 rounds the YaRN
    correction range anyway (~4e-3 off transformers after position 0). `coreai.load`
    (runtime.rope) recomputes the frequencies unrounded and matches transformers; mlx-lm's own
    loader still does not (when that half fails, mlx-lm honours the flag and runtime.rope can go)."""
    from mlx_lm.utils import load_model

    from runtime.model import load_model as coreai_load_model

    ref = _tiny_checkpoint(moe_config("gpt_oss", truncate=False), tmp_path / "hf")
    export(tmp_path / "hf", tmp_path / "mlx", dtype="float32", progress=False)
    _assert_parity(ref, tmp_path / "mlx", model=coreai_load_model(tmp_path / "mlx", dtype="float32").network)
    with pytest.raises(AssertionError, match=r"(?i)not equal"):  # what the runtime fixes
        _assert_parity(ref, tmp_path / "mlx", model=load_model(tmp_path / "mlx")[0])


def test_yarn_frequencies_match_mlx_lm_when_truncated():
    """runtime.rope's YaRN, rounded, is mlx-lm's YarnRoPE (so only the rounding differs); with the
    gpt-oss release's parameters the unrounded range moves the ramp's ends."""
    import mlx.core as mx
    from mlx_lm.models.rope_utils import YarnRoPE

    from runtime.rope import yarn_frequencies

    yarn = {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
    ours = yarn_frequencies(64, 150000.0, **yarn, truncate=True)
    theirs = YarnRoPE(64, base=150000.0, scaling_factor=32.0, original_max_position_embeddings=4096)._freqs
    assert mx.allclose(ours, theirs, rtol=1e-6).item()
    assert not mx.allclose(yarn_frequencies(64, 150000.0, **yarn, truncate=False), theirs, rtol=1e-4).item()


# llama.cpp's GGUF architecture of each MoE family (Mixtral GGUFs say llama, with experts).
GGUF_ARCH = {"qwen3_moe": "qwen3moe", "mixtral": "llama"}


def _tiny_moe_gguf(family: str, ref, folder: Path, path: Path, drop: tuple[str, ...] = ()) -> None:
    """Write the tiny HF checkpoint in `folder` as a float32 GGUF the way llama.cpp's
    convert_hf_to_gguf.py does for Qwen3-MoE (`Qwen2MoeModel.modify_tensors`) and Mixtral
    (`LlamaModel.modify_tensors`): the per-expert 2-D weights of each block stacked into one
    [experts, out, in] tensor, named through gguf-py's `TensorNameMap` (Qwen: the merged
    `mlp.experts.<w>`, Mixtral: `layers.N.feed_forward.experts.w1|w2|w3`), Mixtral Q/K permuted,
    `expert_count` / `expert_used_count` (and Qwen's `expert_feed_forward_length`) in the
    metadata. `drop`: GGUF tensor names left out (a broken conversion)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    arch, cfg = GGUF_ARCH[family], ref.config
    experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), cfg.num_hidden_layers)
    w = _gguf_writer(arch, cfg, path)
    w.add_expert_count(experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if family == "qwen3_moe":
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    tensors, stacks = {}, {}
    for name, data in load_file(folder / "model.safetensors").items():
        expert = re.fullmatch(r"model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight", name)
        if expert:
            layer, _, index, proj = expert.groups()
            stacks.setdefault((int(layer), proj), {})[int(index)] = data
            continue
        if family == "mixtral" and ".q_proj." in name:
            data = _llama_cpp_permute(data, cfg.num_attention_heads)
        if family == "mixtral" and ".k_proj." in name:
            data = _llama_cpp_permute(data, cfg.num_key_value_heads)
        tensors[names.get_name(name, try_suffixes=(".weight", ".bias"))] = data
    assert stacks, "the checkpoint has no per-expert tensors"
    for (layer, proj), per_expert in stacks.items():
        if family == "qwen3_moe":
            merged = f"model.layers.{layer}.mlp.experts.{proj}"
        else:
            merged = f"layers.{layer}.feed_forward.experts.{proj}"
        tensors[f"{names.get_name(merged)}.weight"] = np.stack([per_expert[i] for i in range(experts)])
    for name, data in tensors.items():
        if name not in drop:
            w.add_tensor(name, data)
    _gguf_close(w)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_moe_gguf_parity_with_transformers(family, tmp_path):
    """GGUF in for the MoE families: stacked `ffn_*_exps` experts and the `ffn_gate_inp` router."""
    ref = _tiny_checkpoint(moe_config(family), tmp_path / "hf")
    _tiny_moe_gguf(family, ref, tmp_path / "hf", tmp_path / "tiny.gguf")
    report = export(tmp_path / "tiny.gguf", tmp_path / "mlx", dtype="float32", progress=False)
    assert report.recipe == family
    _assert_parity(ref, tmp_path / "mlx")


def test_moe_gguf_missing_expert_tensor(tmp_path):
    """A GGUF MoE without one block's stacked experts: one line naming the tensor, nothing written."""
    ref = _tiny_checkpoint(moe_config("qwen3_moe"), tmp_path / "hf")
    _tiny_moe_gguf("qwen3_moe", ref, tmp_path / "hf", tmp_path / "cut.gguf", drop=("blk.1.ffn_up_exps.weight",))
    with pytest.raises(SourceError, match=r"cut\.gguf: MoE tensor blk\.1\.ffn_up_exps\.weight is missing") as info:
        export(tmp_path / "cut.gguf", tmp_path / "out", progress=False)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf", "hf"]


def test_gpt_oss_gguf_is_refused_with_what_to_do(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "gpt-oss.gguf"
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    _gguf_close(w)
    with pytest.raises(ExportError, match="gpt-oss GGUFs .* are not supported; export the Hugging Face folder"):
        export(path, tmp_path / "out", progress=False)
    with pytest.raises(ExportError, match="the gpt_oss recipe reads Hugging Face folders only"):
        export(path, tmp_path / "out", recipe="gpt_oss", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_moe_4bit_per_expert_routers_float_loads_and_generates(family, tmp_path, capsys):
    """4-bit export: experts become QuantizedSwitchLinear ([experts, out, in / 8] uint32 words,
    groups inside one expert's row), routers, norms and sinks stay float; the folder loads in
    mlx_lm.load and coreai.load, both generate; bits per weight is printed."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_lm
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    _tiny_checkpoint(moe_config(family), tmp_path / "hf")
    report = export(tmp_path / "hf", tmp_path / "q", quantize="4bit", group_size=32)
    assert "bits/weight" in capsys.readouterr().out
    assert 4.0 < report.bits_per_weight < 6.0  # 4 + 32/32 (scales, biases) + the float routers and norms
    model, tokenizer = mlx_lm.load(str(tmp_path / "q"))
    layer = model.model.layers[0]
    moe, router = {
        "qwen3_moe": lambda: (layer.mlp.switch_mlp, layer.mlp.gate),
        "mixtral": lambda: (layer.block_sparse_moe.switch_mlp, layer.block_sparse_moe.gate),
        "gpt_oss": lambda: (layer.mlp.experts, layer.mlp.router),
    }[family]()
    for proj in (moe.gate_proj, moe.up_proj, moe.down_proj):
        assert isinstance(proj, QuantizedSwitchLinear) and proj.bits == 4
        assert proj.weight.shape[0] == 4 and proj.scales.shape[:2] == proj.weight.shape[:2]
    assert type(router) is nn.Linear and router.weight.dtype == mx.float16
    if family == "gpt_oss":
        assert layer.self_attn.sinks.dtype == mx.float16
    assert mlx_lm.generate(model, tokenizer, "w5 w17 w42", max_tokens=4)

    loaded = coreai.load(tmp_path / "q")
    result = loaded.generate("w5 w17 w42", max_tokens=4, temperature=0.0)
    assert result.usage.completion_tokens >= 1


def test_gpt_oss_keeps_harmony_tokens(tmp_path):
    """The Harmony format's special tokens stay single special tokens, and the end-of-turn ones
    (<|return|>, <|call|>) stay EOS ids, as in openai/gpt-oss-20b's generation_config.json."""
    import json

    from transformers import AutoTokenizer

    _tiny_checkpoint(moe_config("gpt_oss"), tmp_path / "hf", special=HARMONY)
    ids = AutoTokenizer.from_pretrained(tmp_path / "hf").convert_tokens_to_ids(["<|return|>", "<|call|>"])
    gen = tmp_path / "hf" / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "eos_token_id": [2, *ids]}))
    export(tmp_path / "hf", tmp_path / "mlx", progress=False)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "mlx")
    for token in HARMONY:
        (token_id,) = tokenizer.encode(token, add_special_tokens=False)
        assert tokenizer.convert_ids_to_tokens(token_id) == token and token_id in tokenizer.all_special_ids
    config = json.loads((tmp_path / "mlx" / "config.json").read_text())
    assert set(config["eos_token_id"]) == {2, *ids}
