"""`export`: a GGUF file or Hugging Face folder -> an mlx-lm model folder, optionally quantized.

Steps: check the arguments, open the source (`recipes.sources`; family detected from its metadata),
build mlx-lm's own model class from the mapped config and load the float weights one tensor at a time
into it (`_build_model`; `load_weights(strict=True)` catches any wrong name or shape), quantize, then
write model.safetensors, config.json, generation_config.json, the tokenizer files and coreai.json
(`recipes.folder`) into a temporary sibling folder that is renamed into place at the end (so a failed
or interrupted export leaves nothing behind).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .checkpoint import Checkpoint
from .errors import ExportError
from .families import EMBEDDINGS
from .folder import provenance_record, replace_folder, verify_folder, write_folder
from .overlap import Prefetch, sha256_in_background
from .quantize import QuantPlan, bits_per_weight, load_plan, quantize_model
from .sources import open_source

if TYPE_CHECKING:
    from .check import VerifyReport

DTYPES = ("float16", "bfloat16", "float32")


@dataclass
class ExportReport:
    """What an export did. `parameters`: count of logical weights (a quantized weight counts its
    unpacked elements); `bytes_written`: bytes of every file in the folder; `seconds`: wall time."""

    out_dir: Path
    recipe: str
    dtype: str
    quantization: str
    parameters: int
    bytes_written: int
    seconds: float
    dry_run: bool = False
    verify: VerifyReport | None = None  # when verify=True
    bits_per_weight: float = 0.0  # stored bits (scales and biases included) per logical weight

    def summary(self) -> str:
        """The one-line summary printed at the end of an export."""
        if self.dry_run:
            return (
                f"dry run: {self.recipe} -> {self.out_dir}: {self.parameters / 1e6:.1f}M "
                f"parameters, {self.dtype}, quantize {self.quantization}, "
                f"{self.bits_per_weight:.2f} bits/weight; nothing written"
            )
        line = (
            f"exported {self.recipe} -> {self.out_dir}: {self.parameters / 1e6:.1f}M parameters, "
            f"{self.bytes_written / 1e6:.1f} MB written, {self.dtype}, "
            f"quantize {self.quantization}, {self.bits_per_weight:.2f} bits/weight, {self.seconds:.1f} s"
        )
        if self.verify is not None:
            line += f"; verify: {self.verify.summary()}"
        return line


def export(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    recipe: str | None = None,
    dtype: str = "float16",
    quantize: str = "none",
    group_size: int = 64,
    config: str | os.PathLike | None = None,
    keep_embedding: bool = False,
    embedding_bits: int | None = None,
    max_context_length: int | None = None,
    preset: str | None = None,
    overwrite: bool = False,
    dry_run: bool = False,
    verify: bool | dict = False,
    progress: bool = True,
) -> ExportReport:
    """Export `source` (a GGUF file or a Hugging Face checkpoint folder) to the mlx-lm folder `out_dir`.

    Args:
        recipe: family name (see `list_recipes()`); detected from the source's metadata when None.
        dtype: "float16" | "bfloat16" | "float32": dtype of the float weights (and of quantization scales).
        quantize: "none" | "4bit" | "8bit" | "mixed" (MLX affine; "mixed" needs `config`), or a
            shipped recipe name (`recipes.quantize.shipped_recipes()`).
        group_size: 32 | 64 | 128, elements per quantization group.
        config: YAML/TOML file of per-module bit rules (see `recipes.quantize`).
        keep_embedding: keep embed_tokens / lm_head in float (needed where they are tied and must stay exact).
        embedding_bits: bits for embed_tokens / lm_head (e.g. 8) when the rest takes other bits.
        max_context_length: tokens recorded as the export's context (coreai.json); at most the
            model's `max_position_embeddings`.
        preset: registry row name recorded in coreai.json (`recipes.presets`).
        overwrite: replace an existing `out_dir`; without it an existing folder is an error.
        dry_run: read and check the source and the weight map, write nothing.
        verify: run `recipes.verify` on the result before it is moved into place (a dict passes
            keyword arguments to it); a failed check is an ExportError and leaves nothing. A
            quantized export without a `reference` is compared with its own float weights (top-1
            agreement and perplexity before quantization).
        progress: show tqdm bars and print the one-line summary.

    Returns:
        ExportReport.

    Raises:
        SourceError: the source is missing, not a GGUF, truncated, or has no tokenizer.
        ExportError: unknown recipe, unsupported architecture or tensor type, weights that do not fit
            mlx-lm's model, existing `out_dir` without `overwrite`, a context above the model's
            maximum, or failed verification.
    """
    start = time.perf_counter()
    out_dir = Path(out_dir)
    if dtype not in DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    plan = load_plan(quantize, group_size, config, keep_embedding, embedding_bits)
    if out_dir.exists() and not overwrite and not dry_run:
        raise ExportError(f"{out_dir}: output folder exists; pass overwrite=True (--overwrite) to replace it")
    ckpt = open_source(source, recipe)
    native = _native_context(ckpt, max_context_length)
    hasher = None if dry_run else sha256_in_background(ckpt.path)
    model, parameters = _build_model(ckpt, dtype, dry_run, progress)
    out_config = dict(ckpt.config)
    verify = _with_float_reference(verify, plan, dry_run, model, ckpt)
    if plan.bits:
        out_config = quantize_model(model, out_config, plan, ckpt.recipe.quantizable, EMBEDDINGS)
    label = quantize if plan.bits else "none"
    bpw = bits_per_weight(model, parameters)
    if dry_run:
        report = ExportReport(
            out_dir,
            ckpt.recipe.name,
            dtype,
            label,
            parameters,
            0,
            time.perf_counter() - start,
            dry_run=True,
            bits_per_weight=bpw,
        )
        if progress:
            print(report.summary())
        return report

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.export-"))
    try:
        write_folder(model, ckpt, out_config, tmp, progress)
        if hasher is not None:
            hasher[0].join()
        context = max_context_length or native
        provenance = provenance_record(ckpt, dtype, label, plan, parameters, hasher, preset, bpw, context)
        (tmp / "coreai.json").write_text(json.dumps(provenance, indent=2))
        del model
        verify_report = verify_folder(tmp, out_dir, verify, provenance) if verify else None
        bytes_written = sum(f.stat().st_size for f in tmp.iterdir())
        replace_folder(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report = ExportReport(
        out_dir,
        ckpt.recipe.name,
        dtype,
        label,
        parameters,
        bytes_written,
        time.perf_counter() - start,
        verify=verify_report,
        bits_per_weight=bpw,
    )
    if progress:
        print(report.summary(), flush=True)
    return report


def _native_context(ckpt: Checkpoint, max_context_length: int | None) -> int | None:
    """The model's own maximum context (`max_position_embeddings`, None when its config has none);
    ExportError when `max_context_length` asks for more."""
    native = ckpt.config.get("max_position_embeddings")
    if max_context_length is not None and native and max_context_length > native:
        raise ExportError(f"{ckpt.path}: context length {max_context_length} exceeds the model's maximum {native}")
    return native


def _build_model(ckpt: Checkpoint, dtype: str, dry_run: bool, progress: bool):
    """mlx-lm's model for `ckpt` with its float weights in `dtype` loaded (`_load_model`, then
    `_fit_weights`), and its count of logical weights. GGUF tensors are dequantized in a background
    thread meanwhile (`Prefetch`, stopped before this returns or raises)."""
    import numpy as np

    names = list(ckpt.shapes)
    # numpy has float16 but no bfloat16: GGUF tensors arrive in float16 or float32.
    np_dtype = np.float16 if dtype == "float16" else np.float32
    # GGUF tensors are dequantized (numpy) in a thread from here on, overlapping the imports of
    # mlx-lm and transformers (~4-9 s on 2 cores) and the model construction.
    prefetch = Prefetch(ckpt.load, names, np_dtype) if ckpt.kind == "gguf" and not dry_run else None

    try:
        model, weights = _load_model(ckpt, names, dtype, np_dtype, prefetch, dry_run, progress)
    finally:
        if prefetch:
            prefetch.stop()
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)  # may drop a tied lm_head (and the module with it)
    return model, _fit_weights(model, weights, ckpt)


def _fit_weights(model, weights: dict, ckpt: Checkpoint) -> int:
    """Load `weights` into `model` (`load_weights(strict=True)`) once every name and shape matches
    its parameters; ExportError naming the first missing, unexpected or mis-shaped ones otherwise.
    Returns the count of logical weights (the model's parameter elements)."""
    from mlx.utils import tree_flatten

    expected = dict(tree_flatten(model.parameters()))
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = [n for n in expected if n in weights and tuple(weights[n].shape) != tuple(expected[n].shape)]
    if missing or unexpected or wrong:
        detail = "; ".join(
            f"{what}: {', '.join(items[:3])}{' ...' if len(items) > 3 else ''}"
            for what, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong))
            if items
        )
        raise ExportError(f"{ckpt.path}: weights do not fit mlx-lm's {ckpt.config['model_type']} model ({detail})")
    model.load_weights(list(weights.items()), strict=True)
    return sum(v.size for v in expected.values())


def _with_float_reference(verify: bool | dict, plan: QuantPlan, dry_run: bool, model, ckpt: Checkpoint) -> bool | dict:
    """`export`'s `verify` option, with the float model's own logits as the reference
    (`recipes.check.float_reference`, computed before quantization) when a quantized export is
    verified without a `reference` of its own; else `verify` unchanged."""
    if verify and plan.bits and not dry_run and not (isinstance(verify, dict) and verify.get("reference")):
        from .check import float_reference

        verify = {
            **(verify if isinstance(verify, dict) else {}),
            **float_reference(model, ckpt.write_tokenizer, ckpt.config),
        }
    return verify


def _load_model(ckpt, names, dtype, np_dtype, prefetch, dry_run, progress):
    """Build mlx-lm's own model class for `ckpt.config` (a wrong config fails here) and convert
    every tensor to `dtype`. Returns (model, {mlx-lm name: mx.array}); in a dry run the arrays are
    lazy zeros of the right shapes, never allocated."""
    import mlx.core as mx
    from mlx_lm.utils import _get_classes
    from tqdm import tqdm

    from runtime.rope import apply_untruncated_yarn

    try:
        model_class, args_class = _get_classes(ckpt.config)
        model = model_class(args_class.from_dict(ckpt.config))
        apply_untruncated_yarn(model, ckpt.config)  # the float reference of --verify computes with it
    except (ValueError, TypeError, KeyError) as exc:
        raise ExportError(
            f"{ckpt.path}: config does not fit mlx-lm's {ckpt.config.get('model_type')} model ({exc})"
        ) from None
    target = getattr(mx, dtype)
    if dry_run:
        return model, {n: mx.zeros(ckpt.shapes[n], dtype=target) for n in names}
    weights = {}
    for name in tqdm(
        names, desc="dequantize" if ckpt.kind == "gguf" else "convert", unit="tensor", disable=not progress
    ):
        w = mx.array(prefetch.get(name) if prefetch else ckpt.load(name, np_dtype))
        # Float weights take the export dtype; evaluating now frees the source copy.
        if mx.issubdtype(w.dtype, mx.floating):
            w = w.astype(target)
        mx.eval(w)
        weights[name] = w
    return model, weights
