"""The fast lane's guard (tests/conftest.py): a test without the `model` marker cannot reach a real
model, whether by a registry name or by the GGUF part packages."""

from __future__ import annotations

import pytest

import coreai
from coreai import store


@pytest.mark.parametrize(
    "reach",
    [
        lambda: coreai.load("qwen2.5-coder-0.5b-instruct"),
        lambda: store.assemble_gguf(store.get("gemma-3-270m"), "/nonexistent-cache"),
    ],
    ids=["coreai.load", "assemble_gguf"],
)
def test_an_unmarked_test_cannot_reach_a_real_model(reach):
    with pytest.raises(pytest.fail.Exception, match="has no `model` marker"):
        reach()
