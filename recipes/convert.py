"""`export`: a GGUF file or Hugging Face folder -> an mlx-lm model folder, optionally quantized.

Steps: open the source (family detected from its metadata), build mlx-lm's own model class from
the mapped config, load the float weights one tensor at a time into it (`load_weights(strict=True)`
catches any wrong name or shape), quantize, then write model.safetensors, config.json,
generation_config.json, the tokenizer files and coreai.json into a temporary sibling folder that is
renamed into place at the end (so a failed or interrupted export leaves nothing behind).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ExportError
from .families import EMBEDDINGS
from .overlap import Prefetch, sha256_in_background
from .quantize import bits_per_weight, load_plan, quantize_model
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


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("coreai-mlx", "mlx", "mlx-lm", "gguf", "transformers", "tokenizers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


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
    import numpy as np

    start = time.perf_counter()
    out_dir = Path(out_dir)
    if dtype not in DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    plan = load_plan(quantize, group_size, config, keep_embedding, embedding_bits)
    if out_dir.exists() and not overwrite and not dry_run:
        raise ExportError(f"{out_dir}: output folder exists; pass overwrite=True (--overwrite) to replace it")
    ckpt = open_source(source, recipe)
    native = ckpt.config.get("max_position_embeddings")
    if max_context_length is not None and native and max_context_length > native:
        raise ExportError(f"{ckpt.path}: context length {max_context_length} exceeds the model's maximum {native}")
    hasher = None if dry_run else sha256_in_background(ckpt.path)
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
    from mlx.utils import tree_flatten

    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)  # may drop a tied lm_head (and the module with it)
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
    del weights
    parameters = sum(v.size for v in expected.values())
    out_config = dict(ckpt.config)
    if verify and plan.bits and not dry_run and not (isinstance(verify, dict) and verify.get("reference")):
        from .check import float_reference

        verify = {
            **(verify if isinstance(verify, dict) else {}),
            **float_reference(model, ckpt.write_tokenizer, ckpt.config),
        }
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
        _write(model, tmp, progress)
        eos_ids = ckpt.write_tokenizer(tmp)
        if eos_ids:
            out_config["eos_token_id"] = eos_ids
            gen = tmp / "generation_config.json"
            data = json.loads(gen.read_text()) if gen.is_file() else {}
            data["eos_token_id"] = eos_ids
            gen.write_text(json.dumps(data, indent=2))
        from mlx_lm.utils import save_config

        save_config(out_config, tmp / "config.json")
        if hasher is not None:
            hasher[0].join()
        provenance = {
            "source": str(Path(ckpt.path).resolve()),
            "source_kind": ckpt.kind,
            "source_sha256": hasher[1].get("sha256") if hasher else None,
            "recipe": ckpt.recipe.name,
            "model_type": ckpt.config["model_type"],
            "dtype": dtype,
            "quantization": {
                "preset": label,
                "group_size": plan.group_size,
                "bits": plan.bits,
                "rules": plan.rules,
                "keep_embedding": plan.keep_embedding,
            }
            if plan.bits
            else None,
            "parameters": parameters,
            "versions": _versions(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        provenance.update(
            preset=preset,
            bits_per_weight=round(bpw, 3),
            max_context_length=max_context_length or native,
            embedding_bits=plan.embedding_bits if plan.bits else None,
        )
        (tmp / "coreai.json").write_text(json.dumps(provenance, indent=2))
        del model
        verify_report = None
        if verify:
            from .check import verify as run_verify

            verify_report = run_verify(tmp, **(verify if isinstance(verify, dict) else {}))
            if not verify_report.passed:  # named after the destination, not the temporary folder
                raise ExportError(
                    f"{out_dir}: verification failed, nothing written: {'; '.join(verify_report.failures)}"
                )
            provenance["verification"] = verify_report.record()
            (tmp / "coreai.json").write_text(json.dumps(provenance, indent=2))
        bytes_written = sum(f.stat().st_size for f in tmp.iterdir())
        _replace(tmp, out_dir)
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


def _write(model, folder: Path, progress: bool) -> None:
    """Evaluate (this is where lazy quantization runs) and save the weights as mlx-lm does:
    model.safetensors, or model-0000k-of-0000n.safetensors shards over 5 GB, with an index."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import make_shards
    from tqdm import tqdm

    weights = dict(tree_flatten(model.parameters()))
    for name in tqdm(list(weights), desc="write", unit="tensor", disable=not progress):
        mx.eval(weights[name])
    shards = make_shards(weights)
    pattern = "model-{:05d}-of-{:05d}.safetensors" if len(shards) > 1 else "model.safetensors"
    index = {"metadata": {"total_size": sum(v.nbytes for v in weights.values())}, "weight_map": {}}
    for i, shard in enumerate(shards):
        name = pattern.format(i + 1, len(shards))
        mx.save_safetensors(str(folder / name), shard, metadata={"format": "mlx"})
        index["weight_map"].update({k: name for k in shard})
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _replace(tmp: Path, out_dir: Path) -> None:
    """Move the finished `tmp` folder to `out_dir`, replacing an old one only after the new one is complete."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
