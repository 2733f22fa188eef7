"""Quantization presets: MLX affine quantization (`mlx.nn.quantize`) chosen per module.

A mixed recipe is a YAML or TOML file of rules matched in order against module paths (fnmatch
globs on mlx-lm paths such as `model.layers.3.mlp.down_proj`); the first match decides:

    bits = 4            # default for quantizable modules
    group_size = 64
    keep_embedding = false
    [[rules]]
    pattern = "model.layers.[0-3].*"   # the first layers at 8 bits, like Apple's mixed Qwen3 recipes
    bits = 8
    [[rules]]
    pattern = "*.down_proj"
    bits = 6
    [[rules]]
    pattern = "lm_head"
    bits = 0             # 0: keep in float

`embedding_bits = 8` quantizes embed_tokens / lm_head at 8 bits while the rest takes `bits` (the
reference's int8 embedding); `keep_embedding` keeps them in float.

Shipped recipes (`recipes/data/<name>.yaml`, listed by `shipped_recipes()`) are taken by name:
the per-layer mixed 4/8-bit Qwen3 0.6B and 4B recipes and the Phi embedding-excluded one.

Never quantized: norms and RoPE (not Linear/Embedding modules), biases (they stay in float inside
`QuantizedLinear`), attention sinks (a parameter, not a module), and MoE routers (`mlp.gate`,
`block_sparse_moe.gate`, `mlp.router`: their leaf names are not in the quantizable list). MoE
experts (`SwitchLinear`, weight [experts, out, in]) are quantized per expert: every group of
`group_size` input elements lies inside one expert's row.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

from .errors import ExportError

PRESETS = {"none": None, "4bit": 4, "8bit": 8, "mixed": 4}


def shipped_recipes() -> list[str]:
    """Names of the shipped mixed recipes (the YAML files in `recipes/data/`)."""
    files = resources.files("recipes").joinpath("data").iterdir()
    return sorted(f.name[: -len(".yaml")] for f in files if f.name.endswith(".yaml"))


def quantization_names() -> list[str]:
    """Everything `quantize=` accepts: the presets and the shipped recipes."""
    return [*PRESETS, *shipped_recipes()]


VALID_BITS = (0, 2, 3, 4, 5, 6, 8)


@dataclass
class QuantPlan:
    """How to quantize: default `bits` (None: no quantization), `group_size`, `rules`
    [(glob, bits)], and whether embeddings/lm_head stay in float."""

    bits: int | None
    group_size: int = 64
    keep_embedding: bool = False
    rules: list[tuple[str, int]] = field(default_factory=list)
    embedding_bits: int | None = None  # None: embeddings take `bits`

    def bits_for(self, path: str, quantizable: tuple[str, ...], embeddings: tuple[str, ...]) -> int:
        """Bits for the module at `path` (0: keep in float)."""
        leaf = path.rsplit(".", 1)[-1]
        if leaf not in quantizable:
            return 0
        for pattern, bits in self.rules:
            if fnmatch.fnmatchcase(path, pattern):
                return bits
        if leaf in embeddings and (self.keep_embedding or self.embedding_bits is not None):
            return 0 if self.keep_embedding else self.embedding_bits or 0
        return self.bits or 0


def load_plan(
    quantize: str,
    group_size: int,
    config: str | os.PathLike | None,
    keep_embedding: bool,
    embedding_bits: int | None = None,
) -> QuantPlan:
    """The QuantPlan for `--quantize` (a preset or a shipped recipe name), `--group-size`,
    `--config FILE`, `--keep-embedding`, `--embedding-bits`.

    Raises ExportError for an unknown preset, a bad group size, `mixed` without a config file,
    both keep_embedding and embedding_bits, or an unreadable/invalid config file (naming the file).
    """
    if quantize in shipped_recipes():
        if config is not None:
            raise ExportError(f"--quantize {quantize} is a shipped recipe; it takes no --config")
        config = str(resources.files("recipes").joinpath(f"data/{quantize}.yaml"))
        quantize = "mixed"
    elif quantize not in PRESETS:
        raise ExportError(f"unknown quantization {quantize!r}; choose one of {', '.join(quantization_names())}")
    if group_size not in (32, 64, 128):
        raise ExportError(f"group size {group_size} is not supported; choose 32, 64 or 128")
    if keep_embedding and embedding_bits is not None:
        raise ExportError("--keep-embedding and --embedding-bits exclude each other")
    plan = QuantPlan(PRESETS[quantize], group_size, keep_embedding, embedding_bits=embedding_bits)
    if config is None:
        if quantize == "mixed":
            raise ExportError("--quantize mixed needs --config FILE (YAML or TOML) with per-module rules")
        return plan
    if quantize == "none":
        raise ExportError(f"{config}: a quantization config needs --quantize 4bit, 8bit or mixed")
    data = _read(Path(config))
    assert plan.bits is not None  # "none" was refused above
    try:
        plan.bits = int(data.get("bits", plan.bits))
        plan.group_size = int(data.get("group_size", plan.group_size))
        plan.keep_embedding = bool(data.get("keep_embedding", plan.keep_embedding))
        plan.rules = [(str(r["pattern"]), int(r["bits"] or 0)) for r in data.get("rules", [])]
        if data.get("embedding_bits") is not None:
            plan.embedding_bits = int(data["embedding_bits"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ExportError(
            f"{config}: invalid quantization config ({exc!r}); expected bits, group_size, rules[pattern, bits]"
        ) from None
    if plan.keep_embedding and plan.embedding_bits is not None:
        raise ExportError(f"{config}: keep_embedding and embedding_bits exclude each other")
    bad = sorted(({b for _, b in plan.rules} | {plan.bits, plan.embedding_bits or 0}) - set(VALID_BITS))
    if bad:
        raise ExportError(f"{config}: unsupported bits {bad}; choose from {VALID_BITS}")
    if plan.group_size not in (32, 64, 128):
        raise ExportError(f"{config}: group size {plan.group_size} is not supported; choose 32, 64 or 128")
    return plan


def _read(path) -> dict:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ExportError(f"{path}: cannot read quantization config ({exc.strerror})") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # each parser has its own error type; all mean "not valid"
        raise ExportError(
            f"{path}: cannot parse quantization config ({type(exc).__name__}: {exc})".splitlines()[0]
        ) from None
    if not isinstance(data, dict):
        raise ExportError(f"{path}: quantization config must be a mapping")
    return data


def quantize_model(
    model, config: dict, plan: QuantPlan, quantizable: tuple[str, ...], embeddings: tuple[str, ...]
) -> dict:
    """Quantize `model` in place (lazily) with mlx-lm's `quantize_model` and return the config
    with the `quantization` entry mlx-lm's loader expects (per-module entries where bits differ)."""
    from mlx_lm.utils import quantize_model as mlx_quantize

    def predicate(path, module):
        bits = plan.bits_for(path, quantizable, embeddings)
        if not bits:
            return False
        return True if bits == plan.bits else {"group_size": plan.group_size, "bits": bits, "mode": "affine"}

    with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints bits-per-weight; the summary has it
        _, config = mlx_quantize(model, config, plan.group_size, plan.bits, quant_predicate=predicate)
    return config


def bits_per_weight(model, parameters: int) -> float:
    """Stored bits per logical weight of `model` (its parameters may be lazy): every array's bytes,
    quantization scales and biases included, times 8, over `parameters` (the unquantized count)."""
    from mlx.utils import tree_flatten

    flat = cast(list[tuple[str, Any]], tree_flatten(model.parameters()))  # mlx types it as a list or a dict
    return sum(v.nbytes for _, v in flat) * 8 / max(parameters, 1)
