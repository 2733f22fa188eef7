"""The per-family recipes: small declarative tables turning a source into an mlx-lm model folder.

A recipe says which source architectures it handles, the mlx-lm `model_type` it writes, how GGUF
tensor names map to mlx-lm's, how GGUF metadata maps to config.json, and the per-family fixes:

- llama/mistral GGUFs store Q/K rows permuted for llama.cpp's rotary layout (`permute_qk`);
- gemma3 GGUFs store every RMSNorm weight as 1 + w, while mlx-lm's gemma3_text adds the 1 itself
  (`norm_offset`).

Tensor names: GGUF uses `blk.N.<suffix>.weight|bias` and a few top-level names (llama.cpp
`gguf-py/gguf/constants.py`, `TENSOR_NAMES`); mlx-lm uses the Hugging Face names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ExportError

# GGUF top-level tensor prefix -> mlx-lm name prefix (shared by every family here).
TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# GGUF per-block tensor prefix -> mlx-lm name inside `model.layers.N.` (the llama layout).
LLAMA_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# Gemma 3 has four norms per block; llama.cpp calls the pre-MLP one `ffn_norm`.
GEMMA3_BLOCK = {
    **LLAMA_BLOCK,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}

# Phi-3 fuses QKV and gate/up; llama.cpp's `ffn_up` holds the fused gate_up projection.
PHI3_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}

# config.json key -> GGUF metadata key (prefixed with `<architecture>.`).
CONFIG_MAP = {
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
    "max_position_embeddings": "context_length",
    "head_dim": "attention.key_length",
    "sliding_window": "attention.sliding_window",
}

# Modules (Linear/Embedding leaves, by path suffix) that may be quantized. Norms are RMSNorm
# modules (never quantizable); biases stay in float inside QuantizedLinear.
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj", "gate_up_proj")
EMBEDDINGS = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class Recipe:
    """One family. `name` is what `--recipe` takes."""

    name: str
    model_type: str  # written to config.json; mlx-lm picks its model class from it
    gguf_architectures: tuple[str, ...]  # `general.architecture` values this recipe reads
    hf_model_types: tuple[str, ...]  # config.json `model_type` values this recipe reads
    block_map: dict[str, str]
    description: str
    permute_qk: bool = False
    norm_offset: float = 0.0
    config_defaults: dict = field(default_factory=dict)  # keys the GGUF does not carry
    quantizable: tuple[str, ...] = LINEARS + EMBEDDINGS

    def gguf_name(self, name: str) -> str | None:
        """The mlx-lm name of GGUF tensor `name` (e.g. `blk.3.attn_q.weight` ->
        `model.layers.3.self_attn.q_proj.weight`), or None when this recipe does not map it."""
        stem, _, kind = name.rpartition(".")
        if stem.startswith("blk."):
            _, layer, part = stem.split(".", 2)
            target = self.block_map.get(part)
            return f"model.layers.{layer}.{target}.{kind}" if target else None
        target = TOP_LEVEL.get(stem)
        return f"{target}.{kind}" if target else None


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("qwen2", "qwen2", ("qwen2",), ("qwen2",), LLAMA_BLOCK, "Qwen2 / Qwen2.5 (QKV biases)"),
        Recipe("qwen3", "qwen3", ("qwen3",), ("qwen3",), LLAMA_BLOCK, "Qwen3 dense (Q/K norms)"),
        Recipe(
            "llama",
            "llama",
            ("llama",),
            ("llama",),
            LLAMA_BLOCK,
            "Llama 3.x (GGUF Q/K permutation undone)",
            permute_qk=True,
        ),
        Recipe(
            "mistral",
            "mistral",
            ("mistral",),
            ("mistral",),
            LLAMA_BLOCK,
            "Mistral 7B-style (llama layout, Q/K permutation undone)",
            permute_qk=True,
        ),
        Recipe(
            "gemma3",
            "gemma3_text",
            ("gemma3",),
            ("gemma3_text",),
            GEMMA3_BLOCK,
            "Gemma 3 text (GGUF norms stored as 1 + w)",
            norm_offset=1.0,
            # Not in the GGUF: llama.cpp hard-codes them for gemma3 (src/llama-model.cpp).
            config_defaults={"sliding_window_pattern": 6, "rope_local_base_freq": 10000.0},
        ),
        Recipe("phi3", "phi3", ("phi3",), ("phi3",), PHI3_BLOCK, "Phi-3 / Phi-3.5 mini (fused QKV and gate/up)"),
    )
}


def list_recipes() -> list[str]:
    """The known recipe names, e.g. `["qwen2", "qwen3", "llama", "mistral", "gemma3", "phi3"]`."""
    return list(RECIPES)


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`. Raises ExportError listing the known ones."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ExportError(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}") from None


def detect(source: str, architecture: str, hf: bool) -> Recipe:
    """The recipe for a source whose metadata names `architecture` (GGUF `general.architecture`,
    or config.json `model_type` when `hf`). Raises ExportError naming the source."""
    for recipe in RECIPES.values():
        if architecture in (recipe.hf_model_types if hf else recipe.gguf_architectures):
            return recipe
    kind = "model_type" if hf else "architecture"
    raise ExportError(f"{source}: unsupported {kind} {architecture!r}; supported recipes: {', '.join(RECIPES)}")
