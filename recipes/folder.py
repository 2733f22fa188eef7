"""The folder an export writes (`recipes.convert.export`): the weights as mlx-lm saves them, the
tokenizer files and EOS ids, config.json, coreai.json (the provenance, with the verification's
record), and the move of the finished folder into place.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from .checkpoint import Checkpoint
from .errors import ExportError
from .quantize import QuantPlan

if TYPE_CHECKING:
    from .check import VerifyReport


def write_folder(model, ckpt: Checkpoint, out_config: dict, folder: Path, progress: bool) -> None:
    """Write the model into `folder`: the weights (`write_weights`), the tokenizer files, the EOS ids the
    tokenizer writer returns (into generation_config.json and `out_config`), and config.json."""
    write_weights(model, folder, progress)
    eos_ids = ckpt.write_tokenizer(folder)
    if eos_ids:
        out_config["eos_token_id"] = eos_ids
        gen = folder / "generation_config.json"
        data = json.loads(gen.read_text()) if gen.is_file() else {}
        data["eos_token_id"] = eos_ids
        gen.write_text(json.dumps(data, indent=2))
    from mlx_lm.utils import save_config

    save_config(out_config, folder / "config.json")


def write_weights(model, folder: Path, progress: bool) -> None:
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


def provenance_record(
    ckpt: Checkpoint,
    dtype: str,
    label: str,
    plan: QuantPlan,
    parameters: int,
    hasher,
    preset: str | None,
    bpw: float,
    context: int | None,
) -> dict:
    """coreai.json's record of where the export came from and how it was made: the source (path,
    kind, SHA-256 from the finished `hasher`), the recipe, dtype, quantization (`label`: its preset
    name), parameter count, library versions and date, then the registry `preset`, the stored bits
    per weight `bpw` and the recorded `context` length."""
    record = {
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
        "versions": versions(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    record.update(
        preset=preset,
        bits_per_weight=round(bpw, 3),
        max_context_length=context,
        embedding_bits=plan.embedding_bits if plan.bits else None,
    )
    return record


def versions() -> dict:
    """The installed versions of the packages an export depends on (coreai.json's `versions`)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("coreai-mlx", "mlx", "mlx-lm", "gguf", "transformers", "tokenizers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def verify_folder(folder: Path, out_dir: Path, verify: bool | dict, provenance: dict) -> VerifyReport:
    """Run `recipes.verify` on the finished `folder` (a dict `verify` gives its keyword arguments);
    ExportError, named after the destination `out_dir`, when it fails, else its record is added to
    `provenance` and coreai.json is written again."""
    from .check import verify as run_verify

    verify_report = run_verify(folder, **(verify if isinstance(verify, dict) else {}))
    if not verify_report.passed:  # named after the destination, not the temporary folder
        raise ExportError(f"{out_dir}: verification failed, nothing written: {'; '.join(verify_report.failures)}")
    provenance["verification"] = verify_report.record()
    (folder / "coreai.json").write_text(json.dumps(provenance, indent=2))
    return verify_report


def replace_folder(tmp: Path, out_dir: Path) -> None:
    """Move the finished `tmp` folder to `out_dir`, replacing an old one only after the new one is complete."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
