"""Errors raised by export recipes. Each message is one line naming the file and the problem."""

from runtime.errors import CoreAIError


class ExportError(CoreAIError, RuntimeError):
    """An export that cannot be done: unknown recipe, unsupported architecture or tensor type,
    existing output folder without overwrite, failed verification."""


class SourceError(ExportError):
    """A source that cannot be read: not a GGUF file, truncated, hash mismatch, missing tokenizer."""
