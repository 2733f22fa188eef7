"""The one exception hierarchy: every error kind the product raises derives from `CoreAIError`."""

import pytest

import coreai
from coreai import errors


def test_every_error_kind_has_the_common_base():
    kinds = [getattr(errors, name) for name in errors.__all__]
    assert all(issubclass(kind, errors.CoreAIError) for kind in kinds)
    # each still refines the builtin that callers already catch
    assert issubclass(errors.SchemaError, ValueError) and issubclass(errors.ModelNotFound, LookupError)
    assert issubclass(errors.ExportError, RuntimeError)


def test_a_missing_model_is_caught_by_the_base(tmp_path):
    with pytest.raises(errors.CoreAIError, match="not a model folder"):
        coreai.load(str(tmp_path))
