"""A GGUF file as a `Checkpoint`: the mlx-lm config from llama.cpp's metadata (rope scaling recovered
from its tensors where the metadata lost it), the mlx-lm name of every tensor, and tensors loaded
dequantized, with llama.cpp's Q/K row permutation undone. The tokenizer: `recipes.gguf_tokenizer`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import Checkpoint
from .errors import ExportError, SourceError
from .families import CONFIG_MAP, Recipe, detect, get_recipe
from .gguf_file import GGUFFile, plain_value
from .gguf_tokenizer import write_gguf_tokenizer


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (inverse of `LlamaModel.permute` in llama.cpp's
    convert_hf_to_gguf.py, which interleaves the two rotary halves of each head).

    w: [n_head * head_dim, ...] (a weight or a bias). Returns the same shape in the HF layout.
    """
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _gguf_config(gguf, recipe: Recipe) -> dict:
    md = gguf.metadata
    arch = md["general.architecture"]
    config: dict[str, Any] = {"model_type": recipe.model_type}
    for key, gguf_key in CONFIG_MAP.items():
        value = md.get(f"{arch}.{gguf_key}")
        if isinstance(value, np.ndarray):  # per-layer values (e.g. head_count_kv): must be uniform here
            if len(set(value.tolist())) != 1:
                raise ExportError(f"{gguf.path}: per-layer {gguf_key} values are not supported")
            value = value[0]
        if value is not None:
            config[key] = plain_value(value)
    config.update(recipe.config_defaults)
    if md.get(f"{arch}.expert_count"):
        config[recipe.experts_key] = int(md[f"{arch}.expert_count"])
    config["vocab_size"] = gguf.tensors["token_embd.weight"].shape[0]
    config["tie_word_embeddings"] = "output.weight" not in gguf.tensors
    heads = config["num_attention_heads"]
    config.setdefault("num_key_value_heads", heads)
    config.setdefault("head_dim", config["hidden_size"] // heads)
    rope_dims = md.get(f"{arch}.rope.dimension_count")
    scaling = md.get(f"{arch}.rope.scaling.type")
    if recipe.name == "gemma3":
        # llama.cpp scales queries by 1/sqrt(head_dim) for every size but 27B (hidden / heads there).
        config["query_pre_attn_scalar"] = config["head_dim"]
        if scaling == "linear":
            config["rope_scaling"] = {"rope_type": "linear", "factor": float(md[f"{arch}.rope.scaling.factor"])}
    elif recipe.name == "phi3":
        if rope_dims:
            config["partial_rotary_factor"] = rope_dims / config["head_dim"]
        if "rope_factors_long.weight" in gguf.tensors:
            config["rope_scaling"] = {
                "type": "longrope",
                "long_factor": gguf.read("rope_factors_long.weight").tolist(),
                "short_factor": gguf.read("rope_factors_short.weight").tolist(),
            }
            config["original_max_position_embeddings"] = int(md[f"{arch}.rope.scaling.original_context_length"])
    else:
        if rope_dims and rope_dims != config["head_dim"]:
            raise ExportError(
                f"{gguf.path}: partial rotary embeddings ({rope_dims} of "
                f"{config['head_dim']}) are not supported for {recipe.name}"
            )
        if recipe.name in ("llama", "mistral"):
            config["attention_bias"] = "blk.0.attn_q.bias" in gguf.tensors
            config["mlp_bias"] = "blk.0.ffn_up.bias" in gguf.tensors
        if "rope_freqs.weight" in gguf.tensors:
            config["rope_scaling"] = _llama3_rope(gguf, config)
        elif scaling == "linear":
            config["rope_scaling"] = {"type": "linear", "factor": float(md[f"{arch}.rope.scaling.factor"])}
        elif scaling not in (None, "none"):
            raise ExportError(f"{gguf.path}: rope scaling {scaling!r} is not supported for {recipe.name}")
    return config


def _llama3_rope(gguf, config: dict) -> dict:
    """Recover Llama 3.x rope_scaling from llama.cpp's `rope_freqs` tensor (per-dimension divisors
    computed in convert_hf_to_gguf.py `LlamaModel.generate_extra_tensors`): the GGUF keeps only
    the divisors, so the published parameter sets are tried and must reproduce them."""
    stored = gguf.read("rope_freqs.weight").astype(np.float64)
    dims = config["head_dim"]
    freqs = 1.0 / config["rope_theta"] ** (np.arange(0, dims, 2) / dims)
    for factor, low, high, original in ((8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192), (16.0, 1.0, 4.0, 8192)):
        wavelen = 2 * np.pi / freqs
        smooth = (original / wavelen - low) / (high - low)
        divisors = np.where(
            wavelen < original / high,
            1.0,
            np.where(wavelen > original / low, factor, 1 / ((1 - smooth) / factor + smooth)),
        )
        if divisors.shape == stored.shape and np.allclose(divisors, stored, rtol=1e-4):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": original,
            }
    raise ExportError(f"{gguf.path}: rope_freqs does not match any known Llama 3 rope scaling")


# GGUF tensors consumed by the config rather than copied.
_CONFIG_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


# What every block of a llama.cpp MoE GGUF holds: the router and the experts stacked [experts, out, in].
MOE_TENSORS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def _check_experts(gguf, recipe: Recipe, config: dict) -> None:
    """Raise SourceError naming the first missing or mis-sized MoE tensor of the GGUF (a truncated
    or hand-edited conversion), before anything is converted."""
    arch = gguf.metadata["general.architecture"]
    experts = config.get(recipe.experts_key)
    if not experts:
        raise SourceError(f"{gguf.path}: MoE GGUF without {arch}.expert_count")
    for layer in range(config["num_hidden_layers"]):
        for part in MOE_TENSORS:
            name = f"blk.{layer}.{part}.weight"
            info = gguf.tensors.get(name)
            if info is None:
                raise SourceError(
                    f"{gguf.path}: MoE tensor {name} is missing (every block needs {', '.join(MOE_TENSORS)})"
                )
            if info.shape[0] != experts:
                raise SourceError(f"{gguf.path}: {name} has {info.shape[0]} experts, {arch}.expert_count {experts}")


def open_gguf(path: Path, recipe_name: str | None) -> Checkpoint:
    """The `Checkpoint` of the GGUF file `path` (`recipes.sources.open_source`): its recipe named or
    detected from `general.architecture`, its config and tensor names checked before anything is read."""
    gguf = GGUFFile(path)
    arch = gguf.metadata.get("general.architecture")
    if arch is None:
        raise SourceError(f"{path}: GGUF metadata has no general.architecture")
    experts = bool(gguf.metadata.get(f"{arch}.expert_count"))
    recipe = get_recipe(recipe_name) if recipe_name else detect(str(path), arch, hf=False, experts=experts)
    if not recipe.gguf_architectures:
        raise ExportError(f"{path}: the {recipe.name} recipe reads Hugging Face folders only, not GGUF files")
    if "token_embd.weight" not in gguf.tensors:
        raise SourceError(f"{path}: GGUF has no token_embd.weight tensor")
    config = _gguf_config(gguf, recipe)
    if recipe.moe:
        _check_experts(gguf, recipe, config)
    names, shapes = {}, {}
    for gname, info in gguf.tensors.items():
        if gname in _CONFIG_TENSORS:
            continue
        name = recipe.gguf_name(gname)
        if name is None:
            raise ExportError(f"{path}: tensor {gname} has no place in the {recipe.name} recipe (wrong --recipe?)")
        names[name], shapes[name] = gname, info.shape

    def load(name: str, dtype=np.float32) -> np.ndarray:
        gname = names[name]
        if recipe.norm_offset and "norm" in gname:
            w = gguf.read(gname, np.float32) - recipe.norm_offset  # subtract in float32, then round
        else:
            w = gguf.read(gname, dtype)
        if recipe.permute_qk and ".attn_q." in gname:
            w = unpermute_qk(w, config["num_attention_heads"])
        elif recipe.permute_qk and ".attn_k." in gname:
            w = unpermute_qk(w, config["num_key_value_heads"])
        return w

    return Checkpoint(path, "gguf", recipe, config, shapes, load, lambda folder: write_gguf_tokenizer(gguf, folder))
