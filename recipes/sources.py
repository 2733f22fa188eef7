"""Source readers: a GGUF file or a Hugging Face checkpoint folder, seen as a `Checkpoint`.

A `Checkpoint` (`recipes.checkpoint`) gives the mlx-lm config.json, the mlx-lm tensor names and
shapes, a loader for one float tensor at a time (so peak memory stays near one tensor plus the
output), and a writer for the tokenizer files. One module per source kind: `recipes.gguf_source`
(its tokenizer rebuilt by `recipes.gguf_tokenizer`) and `recipes.hf_source`, each imported only when
a source of its kind is opened.
"""

from __future__ import annotations

import os
from pathlib import Path

from .checkpoint import Checkpoint
from .errors import SourceError
from .families import get_recipe


def open_source(source: str | os.PathLike, recipe: str | None = None) -> Checkpoint:
    """A `Checkpoint` for a GGUF file or a Hugging Face folder; the family is detected from the
    metadata unless `recipe` names one. Raises SourceError for an unreadable source, ExportError for
    an unknown recipe or unsupported architecture."""
    if recipe is not None:
        get_recipe(recipe)  # an unknown name fails before the source is read
    path = Path(source)
    if path.is_dir():
        from .hf_source import open_hf

        return open_hf(path, recipe)
    if not path.is_file():
        raise SourceError(f"{path}: no such file or folder")
    from .gguf_source import open_gguf

    return open_gguf(path, recipe)
