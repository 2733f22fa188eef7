"""Errors raised by the runtime layer."""


class ModelNotFound(LookupError):
    """A model name, folder or repo id that does not resolve to a loadable model.

    The message names what was asked for and, for registry names, the known names.
    """
