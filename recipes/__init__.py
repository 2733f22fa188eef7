"""Export recipes: turn a GGUF file or a Hugging Face checkpoint folder into a verified mlx-lm folder.

    from recipes import export, verify, list_recipes
    report = export("model.gguf", "out/", dtype="float16", quantize="4bit", verify=True)

The conversion modules load lazily. `runtime.blas` (the one `runtime` module recipes uses) sets up
the system BLAS first, before anything imports `mlx.core`.
"""

from runtime.blas import setup_blas

setup_blas()

from .errors import ExportError, SourceError  # noqa: E402
from .families import list_recipes  # noqa: E402

__all__ = ["ExportError", "ExportReport", "SourceError", "VerifyReport", "export", "list_recipes", "verify"]

# The modules are named differently from the functions: a submodule called `export` would replace
# the `recipes.export` function with itself once imported.
_LAZY = {"export": "convert", "ExportReport": "convert", "verify": "check", "VerifyReport": "check"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'recipes' has no attribute {name!r}")
