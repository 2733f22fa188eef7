"""`coreai.load`: one entry point for registry names, local MLX folders and Hugging Face repo ids."""

from __future__ import annotations

import os
from pathlib import Path

from coreai import store
from runtime import Model, ModelNotFound, load_model, make_drafter
from runtime.distributed import Cluster


def resolve(name_or_path: str | os.PathLike, cache_dir=None, progress: bool = True) -> Path:
    """The local folder for a registry name (exported on first use), a local folder, or a Hugging
    Face repo id (downloaded with huggingface_hub).

    Raises ModelNotFound naming what was tried (and the registry's names) when nothing matches.
    """
    name = str(name_or_path)
    if name in store.REGISTRY:
        return store.ensure(name, cache_dir, progress=progress)
    path = Path(name).expanduser()
    if path.exists():
        return path
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(
                snapshot_download(
                    name, allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]
                )
            )
        except Exception as exc:  # noqa: BLE001 - any hub failure is reported as "not found" with its reason
            raise ModelNotFound(
                f"{name}: not a registry model or local folder, and downloading it from the Hugging Face hub failed "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                f"known models: {', '.join(store.REGISTRY)}"
            ) from None
    raise ModelNotFound(
        f"{name}: not a registry model, a local folder or a repo id; known models: {', '.join(store.REGISTRY)}"
    )


def load(
    name_or_path: str | os.PathLike = store.DEFAULT_MODEL,
    dtype: str | None = None,
    cache_dir=None,
    draft: str | os.PathLike | None = None,
    cluster: Cluster | None = None,
) -> Model:
    """Load a model: registry name (default `qwen2.5-coder-0.5b-instruct`), MLX folder or repo id.

    dtype: "float32" | "float16" | "bfloat16" | None (float32 on the CPU backend, the stored
    dtype on Metal). draft: a smaller model with the same tokenizer (any of the same forms), loaded
    as `model.draft` for `speculative="draft"`. Raises ModelNotFound, ExportError, ValueError (also
    when the draft's vocabulary differs from the model's). cluster: the ranks to split the model
    across (`runtime.distributed.join`; the draft, if any, stays whole on every rank).
    """
    name = str(name_or_path)
    model = load_model(
        resolve(name, cache_dir), dtype=dtype, name=name if name in store.REGISTRY else None, cluster=cluster
    )
    if draft is not None:
        draft_model = load(draft, dtype=dtype, cache_dir=cache_dir)
        make_drafter(draft_model, model)  # refuses a draft with another tokenizer now, not mid-request
        model.draft = draft_model
    return model
