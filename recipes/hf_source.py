"""A Hugging Face checkpoint folder as a `Checkpoint`: config.json made explicit for mlx-lm, the
safetensors weights (lazy; a multimodal checkpoint's text decoder only, `recipes.multimodal`) and
the tokenizer files copied as they are.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .checkpoint import Checkpoint
from .errors import ExportError, SourceError
from .families import RECIPES, Recipe, detect, get_recipe
from .multimodal import is_multimodal, text_config, text_weights
from .multimodal import refuse as refuse_multimodal

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


def open_hf(path: Path, recipe_name: str | None) -> Checkpoint:
    """The `Checkpoint` of the Hugging Face folder `path` (`recipes.sources.open_source`): its recipe
    named or detected from config.json's `model_type`; the weights are read lazily, one at a time."""
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
