"""The one exception hierarchy users see: every class derives from `CoreAIError`.

Each layer defines the errors it raises (the imports between layers go one way, so `recipes`,
`runtime` and `guided` cannot import this module; the base lives in the lowest layer, `runtime`);
this module re-exports them all, and the server maps each to an OpenAI error object and HTTP status.
"""

from __future__ import annotations

from guided import GrammarError, SchemaError, UnsatisfiableSchema, UnsupportedSchemaFeature
from recipes.errors import ExportError, SourceError
from runtime.errors import ClusterLost, CoreAIError, InputError, ModelNotFound, ParameterError

__all__ = [
    "ClusterLost",
    "CoreAIError",
    "ExportError",
    "GrammarError",
    "InputError",
    "ModelNotFound",
    "ParameterError",
    "SchemaError",
    "SourceError",
    "UnsatisfiableSchema",
    "UnsupportedSchemaFeature",
]
