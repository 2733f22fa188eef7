"""The text decoder of a multimodal (vision-language) Hugging Face checkpoint, as a text-only one.

Gemma 3 4B/12B/27B ship as `Gemma3ForConditionalGeneration`: config.json has `model_type`
`gemma3` with the decoder's settings under `text_config` (and the vision tower's under
`vision_config`), and the weights hold the decoder, a vision tower and a projector, under one of
two sets of names (transformers' `conversion_mapping.py`, "llava"):

    the release files, and what save_pretrained    language_model.model.*, language_model.lm_head.*,
    writes (it maps back to the legacy names):     vision_tower.*, multi_modal_projector.*
    transformers' in-memory names since 4.52,      model.language_model.*, lm_head.*,
    in checkpoints saved without that mapping:     model.vision_tower.*, model.multi_modal_projector.*

Both become the text model's `model.*` / `lm_head.*`; the vision weights are dropped unread.
"""

from __future__ import annotations

from pathlib import Path

from .errors import ExportError, SourceError

# Decoder prefix -> text-only prefix, first match wins.
TEXT_PREFIXES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
    ("lm_head.", "lm_head."),
)
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")

# Token ids the top level states for the whole model (Gemma 3: eos [1, 106], i.e. <eos> and
# <end_of_turn>), where the text config carries only its class defaults.
TOP_LEVEL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def is_multimodal(config: dict) -> bool:
    """True for a config.json with a nested `text_config` (a vision-language checkpoint)."""
    return isinstance(config.get("text_config"), dict)


def text_config(config: dict, path: Path, default_type: str) -> dict:
    """The decoder's config.json with every setting explicit.

    The release files state only what differs from transformers' defaults (Gemma 3 4B's
    text_config omits the head counts, head_dim and vocab_size), and mlx-lm's `gemma3_text`
    defaults differ from transformers' (4 heads and 1 KV head against 8 and 4), so the text config
    is rebuilt with transformers' own config class and written out in full. Rope settings (per
    layer type), `layer_types` (the sliding window pattern) and `tie_word_embeddings` come with it.

    default_type: the text `model_type` when `text_config` names none (e.g. "gemma3_text").
    Raises SourceError when transformers cannot read the text config.
    """
    from transformers import AutoConfig, PreTrainedConfig

    text = dict(config["text_config"])
    model_type = text.pop("model_type", None) or default_type
    try:
        full = AutoConfig.for_model(model_type, **text).to_dict()
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{path}: text_config cannot be read as {model_type!r} ({exc})") from None
    # Keep the model's own keys; drop the generic ones every transformers config has (output_*,
    # id2label, ...) unless the checkpoint stated them.
    generic = PreTrainedConfig().to_dict()
    out = {k: v for k, v in full.items() if (k in text or k not in generic) and not k.startswith("_")}
    out.update({k: config[k] for k in TOP_LEVEL_IDS if config.get(k) is not None})
    out["model_type"] = model_type
    return out


def text_weights(weights: dict, path: Path) -> dict:
    """`weights` ({name: lazy mx.array}) renamed to the text model's names, vision tensors dropped.

    Raises ExportError naming a tensor that belongs to neither the decoder nor the vision side,
    or when no decoder tensor is found.
    """
    out = {}
    for name, value in weights.items():
        if name.startswith(VISION_PREFIXES):
            continue
        for prefix, target in TEXT_PREFIXES:
            if name.startswith(prefix):
                out[target + name[len(prefix) :]] = value
                break
        else:
            raise ExportError(f"{path}: tensor {name} is neither the text decoder's nor the vision tower's")
    if not any(name.startswith("model.") for name in out):
        raise ExportError(f"{path}: multimodal checkpoint without text decoder weights (no language_model tensors)")
    return out


def refuse(path: Path, config: dict, supported: list[str], recipe: str | None = None) -> ExportError:
    """The error for a multimodal checkpoint whose family has no unwrap (e.g. llava, mistral3), or
    that the `recipe` asked for does not unwrap."""
    decoder = config["text_config"].get("model_type", "?")
    what = f"the {recipe} recipe does not export its text decoder" if recipe else "no recipe exports its text decoder"
    return ExportError(
        f"{path}: multimodal checkpoint (model_type {config.get('model_type')!r}, text decoder {decoder!r}): "
        f"{what} (multimodal types supported: {', '.join(supported)}); "
        "export a text-only checkpoint of its language model"
    )
