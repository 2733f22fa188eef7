"""Errors raised by the runtime layer, and `CoreAIError`, the base of every error the product raises
on bad input (`coreai.errors` re-exports them all)."""


class CoreAIError(Exception):
    """The common base: `except CoreAIError` catches every error of this product's own kinds
    (each also derives from the builtin it refines: ValueError, LookupError, RuntimeError)."""


class ModelNotFound(CoreAIError, LookupError):
    """A model name, folder or repo id that does not resolve to a loadable model.

    The message names what was asked for and, for registry names, the known names.
    """


class InputError(CoreAIError, ValueError):
    """Input this product refuses: an option, a prompt, a tool definition, a model setting it cannot
    use. The message names what and why; it is a ValueError too, as it was before it had a type.
    `param`: the neutral name of the request field at fault ("tools", "tool_choice", "messages", ...,
    the fields of `coreai.service.Names`), which each front end spells its own way; None when the
    error is about no one field. `code`: an OpenAI-style error code ("unsupported_parameter", ...) or None."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


class ParameterError(InputError):
    """A setting out of its range. `param`: its name ("temperature", "max_tokens", ...), which the
    message starts with, so the server can name the request field and the CLI its flag."""

    def __init__(self, message: str, param: str):
        super().__init__(message, param)
        self.param: str = param


class ClusterLost(CoreAIError, RuntimeError):
    """A rank of a distributed model (`runtime.distributed`) failed or did not answer in time; the
    message says which exchange and why. The process ends soon after: the ranks may differ now."""
