"""Shared fixtures and the two test lanes.

Fast lane (`make test-fast`, `pytest -m "not model"`): the tiny random networks and a small byte-level
BPE tokenizer trained here from tests/data/tiny_corpus.txt, no model export. Tests that load or export
a real model (the `REAL_MODEL_FIXTURES`, `store.ensure`, `coreai.load()` of a registry name) carry the
`model` marker: added automatically for those fixtures, and a test without it that reaches the model
store fails (`_no_real_model_outside_the_model_lane`). Real models are exported once into the user
cache (`$COREAI_HOME` or ~/.cache/coreai, the same one `make demo` uses) and shared by every test."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai import store

# The shared test data (JSON Schema Test Suite, JSONSchemaBench, MaskBench) lives beside the checkout;
# $COREAI_SHARED_DATA points elsewhere. Tests that need it skip with the path in the reason.
SHARED_DATA = Path(os.environ.get("COREAI_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
DATA = Path(__file__).parent / "data"

# Fixtures that export or load a real model: a test using one (directly or through another fixture)
# gets the `model` marker.
REAL_MODEL_FIXTURES = frozenset({"qwen_dir", "gemma_dir", "qwen_model", "qwen_tokenizer", "gemma_tokenizer"})


def pytest_collection_modifyitems(items):
    for item in items:
        if REAL_MODEL_FIXTURES.intersection(item.fixturenames) and item.get_closest_marker("model") is None:
            item.add_marker(pytest.mark.model)


@pytest.fixture(autouse=True)
def _no_real_model_outside_the_model_lane(request, monkeypatch):
    """A test without the `model` marker that reaches the model store (an export, or a cached real
    model) fails naming itself, so the fast lane cannot start exporting 491 MB unnoticed."""
    if request.node.get_closest_marker("model") is not None:
        return

    def refuse(name, *args, **kwargs):
        pytest.fail(
            f"{request.node.nodeid} loads the real model {name!r} but has no `model` marker: "
            "add @pytest.mark.model, or use the tiny model (tiny_model, tiny_model_dir)",
            pytrace=False,
        )

    monkeypatch.setattr(store, "ensure", refuse)
    monkeypatch.setattr(store.GGUFPackage, "part_paths", lambda self: refuse(self.filename))


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


# -- the tiny tokenizer and networks (no model export) -------------------------------------------------

# Qwen2's pre-tokenizer split (tokenizer.json of Qwen2.5), then GPT-2 byte-level BPE.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TINY_MERGES = 4096  # a cap the corpus does not reach: every merge it offers (3,072 entries)
# After them, as in Qwen2.5: control tokens, then <tool_call> / </tool_call> as text-level added tokens.
TINY_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_ADDED = ("<tool_call>", "</tool_call>")


def tiny_logit_width(vocabulary: int) -> int:
    """The tiny networks' logit width: the vocabulary rounded up past the next multiple of 128, as
    Qwen2.5's 151,665 tokens have 151,936 logits; the ids from `vocabulary` up are padding."""
    return (vocabulary // 128 + 1) * 128


def _write_tiny_tokenizer(
    folder: Path, added: tuple[str, ...] = (), chat_template: str | None = None, special: tuple[str, ...] = ()
) -> None:
    """A small Qwen2.5-style tokenizer in `folder` (tokenizer.json, tokenizer_config.json,
    chat_template.jinja, special_tokens_map.json, generation_config.json): byte-level BPE with
    the merges of tests/data/tiny_corpus.txt (trained here, deterministic), Qwen's pre-tokenizer,
    NFC, <|endoftext|> / <|im_start|> / <|im_end|> as control tokens, <tool_call> and
    </tool_call> then `added` as text-level added tokens, then `special` as control tokens (as
    Mistral's [TOOL_CALLS], which the engine counts as special only so), end ids <|endoftext|> and
    <|im_end|>.
    `chat_template`: the template (default tests/data/tiny_chat_template.jinja, Qwen2.5's markup)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_MERGES, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator([(DATA / "tiny_corpus.txt").read_text(encoding="utf-8")], trainer)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TINY_SPECIAL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TINY_ADDED + added])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = chat_template or (DATA / "tiny_chat_template.jinja").read_text(encoding="utf-8")
    hf.save_pretrained(str(folder))
    end_ids = [backend.token_to_id("<|endoftext|>"), backend.token_to_id("<|im_end|>")]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": end_ids}))


def _write_tiny_network(folder: Path, model_type: str, **extra) -> None:
    """A random mlx-lm `model_type` network (2 layers, width 64, seed 0) for the tokenizer already
    written in `folder` (`_write_tiny_tokenizer`): its end ids, `tiny_logit_width` logits. Saved in
    `folder` as model.safetensors + config.json. `extra`: more config fields (or other values).

    The output head is not tied to the embeddings: a random tied network repeats its last token
    (its hidden state stays close to that token's embedding), an untied one writes varied text. Its
    rows for the control tokens (the end ids among them) and the padding ids are zero, so that the
    network, like a trained one, ends or writes a control token only when a grammar or a bias makes
    it: random rows would end free text once every few hundred tokens; zero rows in the scaled-up head
    are rarely sampled (none in 3,600 tokens at temperature 1)."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocabulary = tokenizer.get_vocab_size(with_added_tokens=True)
    config = dict(
        model_type=model_type,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=tiny_logit_width(vocabulary),
        rope_theta=1e6,
        tie_word_embeddings=False,
        max_position_embeddings=512,
        eos_token_id=json.loads((folder / "generation_config.json").read_text())["eos_token_id"],
    )
    config.update(extra)
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(0)
    network = module.Model(module.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(network.parameters()))
    quiet = [i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special] + list(
        range(vocabulary, config["vocab_size"])
    )
    if "lm_head.weight" in weights:  # a tied head (tie_word_embeddings=True) is the embedding as it is
        head = weights["lm_head.weight"] * 6.0  # logits spread over a few units, as a trained model's
        head[mx.array(quiet)] = 0.0
        weights["lm_head.weight"] = head
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random qwen2 network (2 layers, width 64, 3,200 logits) with the tiny
    tokenizer: fast, no export, and real tokenization (byte-level BPE, CJK, emoji, padding ids)."""
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    _write_tiny_tokenizer(folder)
    _write_tiny_network(folder, "qwen2")
    return folder


def _write_ending_network(folder: Path) -> None:
    """A tiny qwen2 network with a 128k-token context that writes <|im_end|> first, always (an agent
    CLI's turn then ends at once, whatever its prompt), with the tiny tokenizer, in `folder`: the
    residual stream's dimension 0 is a positive constant (every embedding's, no layer writes it), the
    final norm keeps only it, and only the <|im_end|> row of the head reads it."""
    import mlx.core as mx
    from tokenizers import Tokenizer

    _write_tiny_tokenizer(folder)
    _write_tiny_network(folder, "qwen2", max_position_embeddings=131072)
    w = dict(mx.load(str(folder / "model.safetensors")))
    end = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id("<|im_end|>")
    w["model.embed_tokens.weight"][:, 0] = 4.0
    for name, value in w.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            value[0, :] = 0.0
    w["model.norm.weight"] = mx.zeros_like(w["model.norm.weight"])
    w["model.norm.weight"][0] = 1.0
    w["lm_head.weight"] = mx.zeros_like(w["lm_head.weight"])
    w["lm_head.weight"][end, 0] = 10.0
    mx.save_safetensors(str(folder / "model.safetensors"), w)


@pytest.fixture(scope="session")
def ending_model_dir(tmp_path_factory) -> Path:
    """`_write_ending_network`'s folder (named `tiny-ending<N>`: the name `coreai serve` serves it under)."""
    folder = tmp_path_factory.mktemp("tiny-ending")
    _write_ending_network(folder)
    return folder


@pytest.fixture(scope="session")
def write_tiny_tokenizer():
    """`write_tiny_tokenizer(folder, added=(), chat_template=None, special=())`: see `_write_tiny_tokenizer`."""
    return _write_tiny_tokenizer


@pytest.fixture(scope="session")
def write_tiny_network():
    """`write_tiny_network(folder, model_type, **extra)`: see `_write_tiny_network`."""
    return _write_tiny_network


@pytest.fixture(scope="session")
def tiny_qwen_model(qwen_dir, tmp_path_factory):
    """A tiny random qwen2 network with the real Qwen tokenizer and logit width (a `model` test: it
    needs the export), for a draft model of the real one."""
    from runtime import load_model

    folder = tmp_path_factory.mktemp("tiny-qwen-vocab")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (qwen_dir / name).exists():
            shutil.copy(qwen_dir / name, folder / name)
    _write_tiny_network(folder, "qwen2", vocab_size=json.loads((qwen_dir / "config.json").read_text())["vocab_size"])
    return load_model(folder)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from runtime import load_model

    return load_model(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model):
    """The tiny model's `runtime.Tokenizer` (see `_write_tiny_tokenizer`)."""
    return tiny_model.tokenizer


class SlowNetwork:
    """A network whose every forward pass takes `delay` seconds longer."""

    def __init__(self, network, delay: float):
        self.network, self.delay = network, delay

    def __call__(self, *args, **kwargs):
        time.sleep(self.delay)
        return self.network(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.network, name)


@pytest.fixture(scope="session")
def slow_tiny_model(tiny_model_dir):
    """The tiny model with each forward pass 5 ms slower: a 450-token generation lasts over 2 s on
    any machine (the tiny network alone may write it in under 1 s), for tests of clients that leave
    while a generation runs."""
    from runtime import load_model

    model = load_model(tiny_model_dir)
    model.network = SlowNetwork(model.network, 0.005)
    return model
