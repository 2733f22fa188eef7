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


def test_every_user_facing_error_is_a_coreai_error():
    """No library module raises a bare ValueError at the user: bad input is an `InputError` (a
    `CoreAIError` and a ValueError), a setting out of range a `ParameterError` (an `InputError`)."""
    import ast
    from pathlib import Path

    from coreai.errors import CoreAIError, InputError, ParameterError

    assert issubclass(ParameterError, InputError) and issubclass(InputError, (CoreAIError, ValueError))
    root = Path(__file__).resolve().parents[1]
    bare = []
    for package in ("coreai", "guided", "runtime", "recipes"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    name = getattr(node.exc.func, "id", None)
                    if name in ("ValueError", "Exception"):  # RuntimeError stays for broken invariants (bugs)
                        bare.append(f"{path.relative_to(root)}:{node.lineno} raises {name}")
    assert not bare, bare
