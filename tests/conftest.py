"""Shared fixtures. Real models are exported once into the user cache (`$COREAI_HOME` or
~/.cache/coreai, the same one `make demo` uses) and shared by every test."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai import store

# The shared test data (JSON Schema Test Suite, JSONSchemaBench, MaskBench) lives beside the checkout;
# $COREAI_SHARED_DATA points elsewhere. Tests that need it skip with the path in the reason.
SHARED_DATA = Path(os.environ.get("COREAI_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    """The exported default model folder (qwen2.5-coder-0.5b-instruct, float16)."""
    return store.ensure("qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="session")
def gemma_dir() -> Path:
    return store.ensure("gemma-3-270m")


@pytest.fixture(scope="session")
def qwen_model(qwen_dir):
    """The real Qwen model loaded in float32 (the fast dtype on the CPU backend)."""
    from runtime import load_model

    return load_model(qwen_dir, name="qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_dir):
    from runtime import Tokenizer

    return Tokenizer(qwen_dir, json.loads((qwen_dir / "config.json").read_text()))


@pytest.fixture(scope="session")
def gemma_tokenizer(gemma_dir):
    from runtime import Tokenizer

    return Tokenizer(gemma_dir, json.loads((gemma_dir / "config.json").read_text()))


@pytest.fixture(scope="session")
def tiny_model_dir(qwen_dir, tmp_path_factory) -> Path:
    """A tiny random qwen2 network (2 layers, width 64) with the real Qwen tokenizer and logit
    width 151,936: fast, and exercises real tokenization (byte-level BPE, CJK, emoji)."""

    folder = tmp_path_factory.mktemp("tiny-qwen2")
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "special_tokens_map.json",
    ):
        if (qwen_dir / name).exists():
            shutil.copy(qwen_dir / name, folder / name)
    _write_tiny_network(folder, qwen_dir, "qwen2")
    return folder


def _write_tiny_network(folder: Path, qwen_dir: Path, model_type: str, **extra) -> None:
    """A random mlx-lm `model_type` network (2 layers, width 64, seed 0) with Qwen's logit width and
    end ids, saved in `folder` as model.safetensors + config.json. `extra`: more (or other) config fields."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    real = json.loads((qwen_dir / "config.json").read_text())
    config = dict(
        model_type=model_type,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=real["vocab_size"],
        rope_theta=1e6,
        tie_word_embeddings=True,
        max_position_embeddings=512,
        eos_token_id=real.get("eos_token_id"),
    )
    config.update(extra)  # may override a field (e.g. a logit width wider than the tokenizer)
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(0)
    network = module.Model(module.ModelArgs.from_dict(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(network.parameters())))
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def write_tiny_network(qwen_dir):
    """`write_tiny_network(folder, model_type, **extra)`: see `_write_tiny_network`."""
    return lambda folder, model_type, **extra: _write_tiny_network(folder, qwen_dir, model_type, **extra)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from runtime import load_model

    return load_model(tiny_model_dir)
