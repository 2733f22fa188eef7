"""Errors raised by the runtime layer, and `CoreAIError`, the base of every error the product raises
on bad input (`coreai.errors` re-exports them all)."""


class CoreAIError(Exception):
    """The common base: `except CoreAIError` catches every error of this product's own kinds
    (each also derives from the builtin it refines: ValueError, LookupError, RuntimeError)."""


class ModelNotFound(CoreAIError, LookupError):
    """A model name, folder or repo id that does not resolve to a loadable model.

    The message names what was asked for and, for registry names, the known names.
    """
