"""Source readers: a GGUF file or a Hugging Face checkpoint folder, seen as a `Checkpoint`.

A `Checkpoint` gives the mlx-lm config.json, the mlx-lm tensor names and shapes, a loader for one
float tensor at a time (so peak memory stays near one tensor plus the output), and a writer for the
tokenizer files.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ExportError, SourceError
from .families import CONFIG_MAP, RECIPES, Recipe, detect, get_recipe
from .multimodal import is_multimodal, text_config, text_weights
from .multimodal import refuse as refuse_multimodal

# Tokens that end a turn in the chat templates of these families; every one present in the
# vocabulary as a control token is written as an EOS id so generation stops on any of them.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "</s>", "<eos>")

# llama.cpp token types (gguf-py `TokenType`).
CONTROL, UNUSED = 3, 5

# Tokenizer files copied from a Hugging Face folder.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


@dataclass
class Checkpoint:
    """A readable source. `shapes` maps mlx-lm tensor names to shapes; `load(name)` returns that
    tensor as a float numpy array (GGUF) or mx.array (safetensors); `write_tokenizer(folder)` writes
    the tokenizer files and returns the EOS ids (list[int])."""

    path: Path
    kind: str  # "gguf" or "hf"
    recipe: Recipe
    config: dict
    shapes: dict[str, tuple[int, ...]]
    load: Callable[..., object]  # (name, numpy dtype=float32)
    write_tokenizer: Callable[[Path], list[int]]


def open_source(source: str | os.PathLike, recipe: str | None = None) -> Checkpoint:
    """A `Checkpoint` for a GGUF file or a Hugging Face folder; the family is detected from the
    metadata unless `recipe` names one. Raises SourceError for an unreadable source, ExportError for
    an unknown recipe or unsupported architecture."""
    if recipe is not None:
        get_recipe(recipe)  # an unknown name fails before the source is read
    path = Path(source)
    if path.is_dir():
        return _open_hf(path, recipe)
    if not path.is_file():
        raise SourceError(f"{path}: no such file or folder")
    return _open_gguf(path, recipe)


# ---------------------------------------------------------------------------------------------
# GGUF


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (inverse of `LlamaModel.permute` in llama.cpp's
    convert_hf_to_gguf.py, which interleaves the two rotary halves of each head).

    w: [n_head * head_dim, ...] (a weight or a bias). Returns the same shape in the HF layout.
    """
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _py(value):
    """A metadata value as plain JSON-able Python."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value


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
            config[key] = _py(value)
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


def _open_gguf(path: Path, recipe_name: str | None) -> Checkpoint:
    from .gguf_file import GGUFFile

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

    return Checkpoint(path, "gguf", recipe, config, shapes, load, lambda folder: _write_gguf_tokenizer(gguf, folder))


def _write_gguf_tokenizer(gguf, folder: Path) -> list[int]:
    """Rebuild the fast tokenizer from GGUF metadata (transformers' converter, no torch) and save
    tokenizer.json + tokenizer_config.json in `folder`. Returns the EOS ids."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    md = gguf.metadata
    spec = {
        name: _py(md[f"tokenizer.{key}"])
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in md
    }
    if "tokens" not in spec:
        raise SourceError(f"{gguf.path}: GGUF has no tokenizer (tokenizer.ggml.tokens missing)")
    try:
        backend, _ = convert_gguf_tokenizer(md["general.architecture"], spec)
    except (ValueError, KeyError) as exc:
        raise SourceError(f"{gguf.path}: cannot rebuild the tokenizer ({exc})") from None
    tokens, types = spec["tokens"], spec.get("token_type") or [0] * len(spec["tokens"])

    # llama.cpp's padding entries ([PAD151665]...) are UNUSED tokens: make them special so that no
    # tokenizer or grammar engine ever treats them as text. Only ones already in the vocabulary
    # at their own id, so the vocabulary (and the logit width) does not grow.
    unused = [
        t for i, (t, k) in enumerate(zip(tokens, types, strict=False)) if k == UNUSED and backend.token_to_id(t) == i
    ]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in unused])

    def token(key: str) -> str | None:
        idx = md.get(f"tokenizer.ggml.{key}")
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    eos_ids = [
        md[f"tokenizer.ggml.{k}"]
        for k in ("eos_token_id", "eot_token_id", "eom_token_id")
        if f"tokenizer.ggml.{k}" in md
    ]
    eos_ids += [i for i, (t, k) in enumerate(zip(tokens, types, strict=False)) if k == CONTROL and t in END_OF_TURN]
    eos_ids = sorted(set(int(i) for i in eos_ids))
    # llama.cpp adds BOS to SentencePiece ("llama") vocabularies unless the file says otherwise.
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", spec.get("tokenizer_type") == "llama"))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        add_bos_token=add_bos,
        add_eos_token=bool(md.get("tokenizer.ggml.add_eos_token", False)),
    )
    if md.get("tokenizer.chat_template"):
        tokenizer.chat_template = md["tokenizer.chat_template"]
    tokenizer.save_pretrained(str(folder))
    _merge_json(folder / "tokenizer_config.json", {"add_bos_token": add_bos, "eos_token_ids": eos_ids})
    return eos_ids


def _merge_json(path: Path, entries: dict) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(entries)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# Hugging Face folder


def _open_hf(path: Path, recipe_name: str | None) -> Checkpoint:
    import mlx.core as mx

    config_path = path / "config.json"
    if not config_path.is_file():
        raise SourceError(f"{path}: not a checkpoint folder (no config.json)")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise SourceError(f"{config_path}: invalid JSON ({exc})") from None
    if "quantization" in config or "quantization_config" in config:
        method = (config.get("quantization_config") or {}).get("quant_method", "")
        raise ExportError(
            f"{path}: the checkpoint is already quantized{f' ({method})' if method else ''}; "
            "export from a float (e.g. BF16) copy of it"
        )
    model_type = config.get("model_type", "")
    multimodal = is_multimodal(config)
    if multimodal:  # only a recipe that unwraps this model_type may read it (else its config is nested)
        supported = [t for r in RECIPES.values() for t in r.hf_multimodal_types]
        if model_type not in (get_recipe(recipe_name).hf_multimodal_types if recipe_name else supported):
            raise refuse_multimodal(path, config, supported, recipe_name)
    recipe = get_recipe(recipe_name) if recipe_name else detect(str(path), model_type, hf=True)
    if multimodal:
        config = text_config(config, path, recipe.model_type)
    config["model_type"] = recipe.model_type
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise SourceError(f"{path}: no *.safetensors weight files")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise SourceError(f"{path}: missing tokenizer (no tokenizer.json or tokenizer.model)")
    weights: dict[str, Any] = {}
    for f in files:
        try:
            weights.update(mx.load(str(f)))  # type: ignore[arg-type]  # mlx's stub: any return form; a dict here. Lazy: nothing is read until a tensor is evaluated
        except (RuntimeError, ValueError) as exc:
            raise SourceError(f"{f}: cannot read safetensors ({exc})") from None
    if multimodal:
        weights = text_weights(weights, path)  # vision tensors dropped before any is read
    # gpt-oss float experts: [experts, in, out] named without `.weight` -> the release's layout.
    for name in [n for n in weights if weights[n].ndim == 3 and n.endswith(recipe.hf_transpose)]:
        weights[f"{name}.weight"] = weights.pop(name).swapaxes(-1, -2)
    shapes = {k: tuple(v.shape) for k, v in weights.items()}
    config = _hf_config(config, recipe, path, "lm_head.weight" in weights)

    def write_tokenizer(folder: Path) -> list[int]:
        for name in TOKENIZER_FILES:
            if (path / name).is_file():
                shutil.copy(path / name, folder / name)
        eos = config.get("eos_token_id")
        gen = folder / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id", eos)
        return sorted(set(eos if isinstance(eos, list) else [eos] if eos is not None else []))

    # pop: once converted, the source tensor is not kept alive by this dict (peak memory ~1x, not 2x).
    return Checkpoint(path, "hf", recipe, config, shapes, lambda name, dtype=None: weights.pop(name), write_tokenizer)


def _hf_config(config: dict, recipe: Recipe, path: Path, has_lm_head: bool) -> dict:
    """A Hugging Face config.json made explicit for mlx-lm's ModelArgs.

    transformers >= 5 nests rope_theta (and rope scaling) under `rope_parameters` (per layer type
    for Gemma 3), while mlx-lm reads the top-level keys and falls back to its own defaults, which
    differ from transformers' (qwen2: 1e6 vs 1e4). Keys set to null are dropped for the same reason.
    """
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        full = rope.get("full_attention", rope)
        if config.get("rope_theta") is None and "rope_theta" in full:
            config["rope_theta"] = full["rope_theta"]
        if "sliding_attention" in rope and config.get("rope_local_base_freq") is None:
            config["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
        if full.get("rope_type", "default") != "default" and not config.get("rope_scaling"):
            config["rope_scaling"] = {**full, "type": full["rope_type"]}
        if config.get("partial_rotary_factor") is None and "partial_rotary_factor" in full:
            config["partial_rotary_factor"] = full["partial_rotary_factor"]
    if recipe.name == "gemma3" and config.get("layer_types"):
        # mlx-lm places a full-attention layer every `sliding_window_pattern` layers.
        types = config["layer_types"]
        pattern = types.index("full_attention") + 1 if "full_attention" in types else len(types) + 1
        expected = ["full_attention" if i % pattern == pattern - 1 else "sliding_attention" for i in range(len(types))]
        if types != expected:
            raise ExportError(f"{path}: Gemma 3 layer_types are not periodic; mlx-lm cannot express them")
        config["sliding_window_pattern"] = pattern
    # transformers >= 5 writes every expert count as num_local_experts; Qwen3 MoE's own key is num_experts.
    if recipe.moe and config.get(recipe.experts_key) is None and "num_local_experts" in config:
        config[recipe.experts_key] = config["num_local_experts"]
    # mlx-lm's default for a missing tie_word_embeddings differs per family; the weights decide.
    config.setdefault("tie_word_embeddings", not has_lm_head)
    return {k: v for k, v in config.items() if v is not None}
