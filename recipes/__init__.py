"""Export recipes: turn a GGUF file or a Hugging Face checkpoint folder into a verified mlx-lm folder.

    import coreai  # first: loads the system BLAS before mlx (see coreai.platform)
    from recipes import export, verify, list_recipes
    report = export("model.gguf", "out/", dtype="float16", quantize="4bit", verify=True)

Submodules load lazily, so `import recipes.errors` does not import mlx or transformers.
"""

from .errors import ExportError, SourceError
from .families import list_recipes

__all__ = ["ExportError", "ExportReport", "SourceError", "VerifyReport", "export", "list_recipes", "verify"]

# The modules are named differently from the functions: a submodule called `export` would replace
# the `recipes.export` function with itself once imported.
_LAZY = {"export": "convert", "ExportReport": "convert", "verify": "check", "VerifyReport": "check"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'recipes' has no attribute {name!r}")
