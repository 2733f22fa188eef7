"""`Checkpoint`: a source as every reader gives it (`recipes.gguf_source`, `recipes.hf_source`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .families import Recipe


@dataclass
class Checkpoint:
    """A readable source. `shapes` maps mlx-lm tensor names to shapes; `load(name)` returns that
    tensor as a float numpy array (GGUF) or mx.array (safetensors); `write_tokenizer(folder)` writes
    the tokenizer files and returns the EOS ids (list[int])."""

    path: Path
    kind: str  # "gguf" or "hf"
    recipe: Recipe
    config: dict
    shapes: dict[str, tuple[int, ...]]
    load: Callable[..., object]  # (name, numpy dtype=float32)
    write_tokenizer: Callable[[Path], list[int]]
