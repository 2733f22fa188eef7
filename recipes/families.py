"""The per-family recipes: small declarative tables turning a source into an mlx-lm model folder.

A recipe says which source architectures it handles, the mlx-lm `model_type` it writes, how GGUF
tensor names map to mlx-lm's, how GGUF metadata maps to config.json, and the per-family fixes:

- llama/mistral GGUFs store Q/K rows permuted for llama.cpp's rotary layout (`permute_qk`);
- gemma3 GGUFs store every RMSNorm weight as 1 + w, while mlx-lm's gemma3_text adds the 1 itself
  (`norm_offset`);
- MoE families: llama.cpp stacks each layer's experts into one `ffn_{gate,up,down}_exps` tensor
  [experts, out, in], the layout of mlx-lm's `SwitchLinear`; Mixtral GGUFs say `llama` and carry
  `llama.expert_count` (`gguf_experts`);
- Gemma 3 4B/12B/27B are multimodal checkpoints (`model_type` `gemma3`): the recipe exports
  their text decoder (`hf_multimodal_types`, `recipes.multimodal`);
- gpt-oss checkpoints in float (the BF16 copies of the MXFP4 release) store the experts as
  transformers computes them, `x @ W` ([experts, in, out]); mlx-lm's sanitize expects the release's
  [experts, out, in], so those tensors are transposed first (`hf_transpose`).

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

# MoE blocks: router (never quantized) and stacked experts (quantized per expert).
QWEN3_MOE_BLOCK = {
    **LLAMA_BLOCK,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
}
MIXTRAL_BLOCK = {
    **LLAMA_BLOCK,
    "ffn_gate_inp": "block_sparse_moe.gate",
    "ffn_gate_exps": "block_sparse_moe.switch_mlp.gate_proj",
    "ffn_up_exps": "block_sparse_moe.switch_mlp.up_proj",
    "ffn_down_exps": "block_sparse_moe.switch_mlp.down_proj",
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
    "moe_intermediate_size": "expert_feed_forward_length",
    "num_experts_per_tok": "expert_used_count",
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
    # GGUF: None reads any file of the architecture; True/False only ones with/without experts.
    gguf_experts: bool | None = None
    experts_key: str = "num_local_experts"  # config.json key of `<arch>.expert_count`
    hf_transpose: tuple[str, ...] = ()  # 3-D HF tensors (name suffixes) stored [experts, in, out]
    moe: bool = False
    # config.json `model_type`s of multimodal checkpoints whose text decoder this recipe exports
    # (`recipes.multimodal`: text_config unwrapped, vision weights dropped).
    hf_multimodal_types: tuple[str, ...] = ()

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
            gguf_experts=False,
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
            hf_multimodal_types=("gemma3",),  # Gemma3ForConditionalGeneration (4B, 12B, 27B)
        ),
        Recipe(
            "phi3", "phi3", ("phi3",), ("phi3",), PHI3_BLOCK, "Phi-3 / Phi-3.5 / Phi-4 mini (fused QKV and gate/up)"
        ),
        Recipe(
            "qwen3_moe",
            "qwen3_moe",
            ("qwen3moe",),
            ("qwen3_moe",),
            QWEN3_MOE_BLOCK,
            "Qwen3 MoE (Q/K norms, top-k routed experts)",
            # llama.cpp's qwen3moe graph always renormalises the top-k weights (norm_w = true).
            config_defaults={"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True},
            experts_key="num_experts",
            moe=True,
        ),
        Recipe(
            "mixtral",
            "mixtral",
            ("llama",),
            ("mixtral",),
            MIXTRAL_BLOCK,
            "Mixtral sparse MoE (llama layout; GGUFs say llama with experts)",
            permute_qk=True,
            gguf_experts=True,
            moe=True,
        ),
        Recipe(
            "gpt_oss",
            "gpt_oss",
            (),
            ("gpt_oss",),
            {},
            "gpt-oss MoE (attention sinks, sliding/full layers, Harmony tokens; float checkpoints)",
            hf_transpose=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
            moe=True,
        ),
    )
}


# GGUF architectures of families whose recipe reads Hugging Face folders only, and what to do instead.
GGUF_REFUSED = {
    "gpt-oss": (
        "gpt-oss GGUFs (llama.cpp's gpt-oss layout: MXFP4 experts with split gate/up and biases, "
        "attention sinks) are not supported; export the Hugging Face folder of the model instead "
        "(a BF16 copy of openai/gpt-oss-20b)"
    ),
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


def detect(source: str, architecture: str, hf: bool, experts: bool = False) -> Recipe:
    """The recipe for a source whose metadata names `architecture` (GGUF `general.architecture`,
    or config.json `model_type` when `hf`); `experts`: the GGUF has `<arch>.expert_count` > 0.
    Raises ExportError naming the source."""
    for recipe in RECIPES.values():
        if hf and architecture in recipe.hf_model_types + recipe.hf_multimodal_types:
            return recipe
        if not hf and architecture in recipe.gguf_architectures and recipe.gguf_experts in (None, experts):
            return recipe
    if not hf and architecture in GGUF_REFUSED:
        raise ExportError(f"{source}: {GGUF_REFUSED[architecture]}")
    kind = "model_type" if hf else "architecture"
    raise ExportError(f"{source}: unsupported {kind} {architecture!r}; supported recipes: {', '.join(RECIPES)}")
