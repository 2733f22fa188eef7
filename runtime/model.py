"""`Model`: an MLX network (mlx-lm's model classes), its tokenizer and config, with `generate`
and `stream`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.utils import load_model as mlx_lm_load_model

from runtime import attention
from runtime.batch import stream_batched
from runtime.distributed import Cluster, Leader, shard
from runtime.drafters import make_drafter
from runtime.errors import InputError, ModelNotFound
from runtime.generate import stream_tokens
from runtime.prompt_cache import PromptCache
from runtime.rope import apply_untruncated_yarn
from runtime.sampling import SamplingParams, SamplingStrategy
from runtime.sequence import Delta, GenerationResult
from runtime.strategy import DecodingStrategy
from runtime.tokenizer import Tokenizer

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def default_dtype() -> str | None:
    """float32 on the CPU backend (MLX's CPU matmuls are fastest in f32 with BLAS); None (keep the
    stored dtype) on Metal."""
    return None if mx.metal.is_available() else "float32"


class Model:
    """A loaded model.

    Attributes:
        network: the mlx-lm `nn.Module`; `network(ids [1, seq] int, cache=...) -> logits [1, seq, vocab]`.
        tokenizer: `runtime.tokenizer.Tokenizer`.
        config: config.json as a dict.
        path: the model folder.
        vocab_size: the logit width (config `vocab_size`), which may exceed the tokenizer's vocabulary.
        context_length: maximum positions (config `max_position_embeddings`), or None.
        draft: a smaller `Model` with the same tokenizer for `speculative="draft"`, or None.
        cluster: the ranks this model is split across (`runtime.distributed`), or None (one process).
        leader: on rank 0 of a cluster, what broadcasts each step's plan to the other ranks; else None.
    """

    def __init__(self, network: nn.Module, tokenizer: Tokenizer, config: dict, path: Path, name: str | None = None):
        self.network = network
        self.tokenizer = tokenizer
        self.config = config
        self.path = Path(path)
        self.name = name or self.path.name
        text_config = config.get("text_config", config)
        self.vocab_size = int(text_config.get("vocab_size") or cast(int, config.get("vocab_size")))
        self.context_length = text_config.get("max_position_embeddings") or config.get("max_position_embeddings")
        self.draft: Model | None = None
        self.cluster: Cluster | None = None
        self.leader: Leader | None = None

    @cached_property
    def padding_mask(self) -> mx.array | None:
        """An additive logits mask, mx.array [vocab_size] float32: -inf at the ids that are no real
        token (`Tokenizer.padding_ids`: llama.cpp's `[PAD<id>]` entries, ids past the tokenizer's
        vocabulary), 0 elsewhere; None when every id is a token. Free decoding adds it to the logits
        (`SamplingStrategy(padding_mask=...)`); a grammar's bitmask never allows those ids anyway."""
        ids = self.tokenizer.padding_ids(self.vocab_size)
        if not ids:
            return None
        mask = np.zeros(self.vocab_size, np.float32)
        mask[sorted(ids)] = -np.inf
        return mx.array(mask)

    def prompt_ids(
        self,
        prompt,
        *,
        chat_template: bool = True,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[int]:
        """Token ids of a prompt: a list of chat messages (rendered with the chat template), a
        string (wrapped as one user message when the model has a chat template and `chat_template`
        is true; else encoded as plain text), or a list of token ids (used as is).
        `chat_template_kwargs`: template variables, e.g. {"enable_thinking": False}."""
        kwargs = chat_template_kwargs or {}
        if isinstance(prompt, str):
            if chat_template and self.tokenizer.has_chat_template:
                return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tools=tools, **kwargs)
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            return self.tokenizer.apply_chat_template(list(prompt), tools=tools, **kwargs)
        raise InputError("prompt must be a string, a non-empty list of chat messages, or a list of token ids")

    def stream(
        self,
        prompt,
        *,
        strategy: DecodingStrategy | None = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = 256,
        stop: list[str] | None = None,
        cancel: threading.Event | None = None,
        chat_template: bool = True,
        tools: list[dict] | None = None,
        prompt_cache: PromptCache | None = None,
        logprobs: bool = False,
        speculative=None,
        chat_template_kwargs: dict | None = None,
        **sampling_fields,
    ) -> Iterator[Delta]:
        """Stream a generation as `Delta`s (see `runtime.generate.stream_tokens`).

        Sampling is `sampling`, or built from keyword fields of `SamplingParams` (`temperature=`,
        `top_p=`, `top_k=`, `min_p=`, `repetition_penalty=`, `seed=`, ...). `strategy` defaults to
        `SamplingStrategy(sampling)` with this model's `padding_mask`. `speculative`: None (off),
        "prompt_lookup", "draft" (this model's `draft`) or a `Model` sharing this tokenizer (see
        `runtime.speculative`); the output is the same as without it (token for token at
        temperature 0, in distribution otherwise).
        `chat_template_kwargs`: template variables (e.g. {"enable_thinking": False}). Raises
        ValueError for bad parameters before any work starts, TypeError for an unknown keyword.
        """
        if sampling is not None and sampling_fields:
            raise InputError(f"give either sampling= or sampling fields ({', '.join(sampling_fields)}), not both")
        sampling = sampling or SamplingParams(**sampling_fields)
        sampling.check_token_ids(self.vocab_size)
        drafter = make_drafter(speculative, self)
        ids = self.prompt_ids(
            prompt, chat_template=chat_template, tools=tools, chat_template_kwargs=chat_template_kwargs
        )
        strategy = strategy or SamplingStrategy(sampling, want_logprobs=logprobs, padding_mask=self.padding_mask)
        if self.leader is not None:  # the other ranks replay the batch's plans
            if prompt_cache is not None:
                raise InputError("prompt_cache= is not available on a distributed model")
            return stream_batched(
                self.network,
                self.tokenizer,
                ids,
                strategy,
                execute=self.leader.execute,
                max_tokens=max_tokens,
                context_length=self.context_length,
                stop=stop,
                cancel=cancel,
                drafter=drafter,
            )
        return stream_tokens(
            self.network,
            self.tokenizer,
            ids,
            strategy,
            max_tokens=max_tokens,
            stop=stop,
            cancel=cancel,
            prompt_cache=prompt_cache,
            context_length=self.context_length,
            drafter=drafter,
        )

    def generate(self, prompt, **kwargs) -> GenerationResult:
        """Run a generation to the end; same arguments as `stream`. Returns the `GenerationResult`."""
        for delta in self.stream(prompt, **kwargs):
            if delta.result is not None:
                return delta.result
        raise AssertionError("stream ended without a result")


def load_model(
    path: str | Path, dtype: str | None = None, name: str | None = None, cluster: Cluster | None = None
) -> Model:
    """Load an mlx-lm compatible folder (config.json, *.safetensors, tokenizer files).

    cluster: load this rank's shard only (`runtime.distributed.shard`, before any weight is read);
    rank 0's model gets a `leader`. Raises InputError for a model that cannot be split so.

    dtype: "float32" | "float16" | "bfloat16" | None (see `default_dtype`); quantized weights stay
    quantized, their float parameters are cast.
    Raises ModelNotFound if the folder or its config/weights are missing; ValueError for an
    unknown dtype or an architecture mlx-lm does not know.
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{path}: not a model folder (no config.json)")
    if not any(path.glob("*.safetensors")):
        raise ModelNotFound(f"{path}: no *.safetensors weights")
    dtype = dtype or default_dtype()
    if dtype is not None and dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    network, config = mlx_lm_load_model(path, lazy=True)  # config: config.json as mlx-lm read it
    apply_untruncated_yarn(network, config)  # gpt-oss: mlx-lm rounds YaRN's range against the config
    attention.install()  # long-context prefill on the CPU: the softmax vectorised (runtime.attention)
    if cluster is not None:  # while the weights are still lazy: each rank reads only its share
        shard(network, config, cluster)
    if dtype is not None:
        target = DTYPES[dtype]
        network.set_dtype(target, lambda d: mx.issubdtype(d, mx.floating))
    # Reading and casting the weights (~2 s for the 0.5B model to float32 on 2 CPU cores) runs on
    # MLX's own thread while the tokenizer loads here (~1.5 s), instead of one after the other.
    mx.async_eval(network.parameters())
    tokenizer = Tokenizer(path, config)
    mx.eval(network.parameters())
    model = Model(network, tokenizer, config, path, name)
    if cluster is not None:
        model.cluster = cluster
        model.leader = Leader(cluster) if cluster.rank == 0 else None
    return model
