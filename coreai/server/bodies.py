"""What every dialect's request bodies share, as pydantic models: `Request` (unknown fields
forbidden, strict JSON types: a field this server cannot honour is named, never silently dropped,
unless the dialect's field policy lists it), `Body` (a whole body, its strings checked for lone
surrogates once), `field_error` (a validator's error located at a field) and the function-name
pattern of tools."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from guided.tools import TOOL_NAME

FUNCTION_NAME = f"^{TOOL_NAME}$"


def lone_surrogate(value) -> tuple | None:
    """The path (keys and indexes) of the first string in `value` (JSON data) holding a lone UTF-16
    surrogate, which JSON can escape (`"\\ud800"`) but which is no Unicode text, so no tokenizer
    takes it; None when there is none. Iterative: a schema may nest deeper than Python recurses."""
    stack: list[tuple[tuple, Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and not _encodes(item):
                return path
        elif isinstance(item, dict):
            stack += [((*path, k), v) for k, v in reversed(item.items())]
            stack += [((*path, k), k) for k in item if isinstance(k, str) and not k.isascii()]
        elif isinstance(item, list):
            stack += [((*path, i), v) for i, v in reversed(list(enumerate(item)))]
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Body(Request):
    """A whole request body (the endpoints' request models derive from it): its strings are checked
    for lone surrogates once, here, before any nested model is validated."""

    @model_validator(mode="before")
    @classmethod
    def _unicode_text(cls, data):
        if (path := lone_surrogate(data)) is not None:
            raise field_error(path, "a lone UTF-16 surrogate escape (\\ud800-\\udfff) is not Unicode text", data)
        return data


def field_error(field: str | tuple, message: str, value: Any) -> ValidationError:
    """An error of a model validator located at `field` (a name, or a path of keys and indexes): a
    ValueError raised there has no location, so the 400 would name no field (pydantic-core keeps the
    location of a ValidationError raised in a validator)."""
    error = PydanticCustomError("value_error", "{message}", {"message": message})
    loc = field if isinstance(field, tuple) else (field,)
    return ValidationError.from_exception_data("request", [InitErrorDetails(type=error, loc=loc, input=value)])
