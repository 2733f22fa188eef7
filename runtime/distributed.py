"""One model across several ranks on MLX distributed (`mlx.launch`): sharding at load (mlx-lm's
`shard` or `pipeline`, plus the output head split by vocabulary rows, `split_head`), and rank 0
leading the others through the batch's step plans.

Rank 0 owns everything but its shard of the network: requests, scheduling, the prefix cache's
decisions, grammars, sampling. Per batch step it broadcasts the step's `runtime.step_plan.StepPlan`
(`Leader.execute`) and every other rank executes the same plan on its own `KVBatch` (`follow`), so
all ranks run the same forward passes, whose collectives (tensor parallel: the all-reduces of the
sharded layers; pipeline: send / recv / all_gather) meet in the same order. One plan, then its
passes, each evaluated as one graph: two independent distributed graphs in one `mx.eval` deadlock.

Messages (`runtime.step_plan.dumps`; one broadcast each):
    {"open": {"max_batch", "prefill", "prefix_entries", "prefix_bytes"}}  a new batch (KV layer)
    {"step": StepPlan.encode()}   one step              {"idle": 1}   rank 0 is alive, nothing to do
    {"end": 1}                    rank 0 is done: the other ranks return

Faults: a collective that fails (a peer's socket closed) or an exchange that takes longer than
`Cluster.timeout` seconds (a peer hung or unreachable; rank 0 sends "idle" every timeout / 4 while
it has no rows, so a silent rank 0 counts too) is a lost cluster: `on_lost(reason)` runs, by default
ending the process with exit code `EXIT_LOST`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import LRUPromptCache

from runtime.errors import ClusterLost, InputError
from runtime.kv_batch import KVBatch
from runtime.step_plan import StepPlan, dumps, loads

log = logging.getLogger("coreai.distributed")

EXIT_LOST = 3  # the process's exit code when the cluster is lost
DEFAULT_TIMEOUT = 60.0  # seconds; longer than any one step (a prefill chunk is under a second on a CPU)
_HEADER = 1024  # bytes broadcast first; a decode step's plan fits, a longer message takes a second all_sum


@dataclass(frozen=True)
class Cluster:
    """The ranks serving one model. mode: "tensor" (every layer split across the ranks, the
    architecture's `shard`) or "pipeline" (consecutive layers per rank, `pipeline`). timeout: seconds
    one exchange (a broadcast and its passes) may take before the cluster counts as lost."""

    group: mx.distributed.Group
    mode: str
    timeout: float = DEFAULT_TIMEOUT

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()


def join(pipeline: bool = False, timeout: float = DEFAULT_TIMEOUT) -> Cluster | None:
    """The cluster this process is a rank of under `mlx.launch` (2 ranks or more), else None: without
    `mlx.launch` nothing changes. Raises InputError for `pipeline` without a cluster or timeout <= 0."""
    if timeout <= 0:
        raise InputError(f"the rank timeout must be > 0 seconds, got {timeout}")
    group = mx.distributed.init() if mx.distributed.is_available() else None
    if group is None or group.size() < 2:
        if pipeline:
            raise InputError("--pipeline needs 2 or more ranks: run under mlx.launch (see README, Distributed)")
        return None
    return Cluster(group, "pipeline" if pipeline else "tensor", timeout)


def shard(network, config: dict, cluster: Cluster) -> None:
    """Split a lazily loaded `network` for this rank, before anything evaluates its weights, so each
    rank reads only its share. Raises InputError when the architecture cannot be split so (no `shard`
    / `pipeline` in its mlx-lm class, heads or widths not divisible by the ranks, fewer layers than
    ranks), naming what to change."""
    text = config.get("text_config", config)
    kind, n = text.get("model_type", config.get("model_type", "this model")), cluster.size
    if cluster.mode == "pipeline":
        inner: Any = getattr(network, "model", None)
        if not hasattr(inner, "pipeline"):
            raise InputError(f"{kind}: mlx-lm cannot split this architecture into a pipeline; drop --pipeline")
        layers = len(inner.layers)
        if layers < n:
            raise InputError(f"{kind}: {layers} layers cannot make a pipeline of {n} ranks")
        inner.pipeline(cluster.group)
        split_head(network, cluster.group)
        return
    if not hasattr(network, "shard"):
        raise InputError(f"{kind}: mlx-lm cannot split this architecture for tensor parallel; try --pipeline")
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = text.get(key)
        if isinstance(value, int) and value % n:
            raise InputError(
                f"{kind}: {key} = {value} is not divisible by {n} ranks, so tensor parallel cannot split it "
                "evenly; use a rank count that divides it, or --pipeline"
            )
    network.shard(cluster.group)
    split_head(network, cluster.group)


_ROW_PARAMETERS = ("weight", "scales", "biases", "bias")  # a (quantized) projection's, all by output row


class VocabSplit(nn.Module):
    """This rank's rows of an output projection (`head`, called as its `method`): the logits of
    vocabulary rows `rows` = [start, stop), then one all_gather joins every rank's into [..., vocab].
    An untied head (`method` "__call__") holds only those rows: `split_head` slices its parameters
    while they are still lazy, so the rank never keeps the rest once the load's cast has copied
    them (`runtime.model.load_model`). A tied one is the whole input embedding: its rows are sliced
    at each call, views of its current parameters. Quantized heads split alike, weight, scales and
    biases all by row (not tested here: the CPU runs float32)."""

    def __init__(self, head: nn.Module, method: str, rows: tuple[int, int], group: mx.distributed.Group):
        super().__init__()
        self.head = head
        self.method, self.rows, self.group = method, rows, group

    def __call__(self, x: mx.array) -> mx.array:
        part = self.head
        if self.method != "__call__":  # the whole embedding: a shallow copy with this rank's rows
            start, stop = self.rows
            part = copy.copy(self.head)
            for key in _ROW_PARAMETERS:
                if key in self.head:
                    part[key] = self.head[key][start:stop]
        logits = getattr(type(part), self.method)(part, x)  # [..., stop - start]
        *lead, width = logits.shape
        ranks = self.group.size()
        gathered = mx.distributed.all_gather(logits.reshape(-1, width), group=self.group)  # [ranks * n, width]
        return gathered.reshape(ranks, -1, width).transpose(1, 0, 2).reshape(*lead, ranks * width)


def split_head(network, group: mx.distributed.Group) -> VocabSplit | None:
    """Split the output projection across the ranks by vocabulary rows (vLLM's ParallelLMHead): each
    rank computes vocab / N logits, an all_gather joins them. mlx-lm's `shard` and `pipeline` leave it
    whole on every rank, where it is 27 % of the weights the 0.5B model reads per token, read by
    every rank. An untied `lm_head` keeps only this rank's rows (call it before the weights are
    evaluated to save their memory too: `runtime.model.load_model` does); the input embedding stays
    whole (a lookup may want any row), so a tied head splits only its use as the output projection
    (`as_linear`), saving reads, not memory. Returns the split (installed in `network`), or
    None, leaving the head as it is, when the vocabulary does not divide by the ranks, the
    architecture's head is not `lm_head` or a tied `model.embed_tokens`, or its `shard` already
    split the head (mlx-lm's qwen3_5)."""
    head, method = network.get("lm_head"), "__call__"
    if not isinstance(head, nn.Module):
        inner = network.get("model")
        head = inner.get("embed_tokens") if isinstance(inner, nn.Module) else None
        method = "as_linear"
        if not isinstance(head, nn.Module) or not hasattr(head, "as_linear"):
            return None
    if type(head).__module__ == "mlx.nn.layers.distributed":  # the architecture's own shard split it
        return None
    vocab, ranks = head["weight"].shape[0], group.size()
    if vocab % ranks:
        return None
    size = vocab // ranks
    start, stop = group.rank() * size, (group.rank() + 1) * size
    split = VocabSplit(head, method, (start, stop), group)
    if method == "__call__":
        for key in _ROW_PARAMETERS:
            if key in head:
                head[key] = head[key][start:stop]
        network["lm_head"] = split
    else:  # the instance attribute shadows the class's as_linear; outside the parameter tree
        object.__setattr__(head, "as_linear", split)
    return split


def head_split(network) -> VocabSplit | None:
    """The output head's split that `split_head` installed in `network`, or None (a whole head)."""
    head = network.get("lm_head")
    if isinstance(head, VocabSplit):
        return head
    inner = network.get("model")
    embedding = inner.get("embed_tokens") if isinstance(inner, nn.Module) else None
    split = vars(embedding).get("as_linear") if isinstance(embedding, nn.Module) else None
    return split if isinstance(split, VocabSplit) else None


def prefix_cache_agrees(cluster: Cluster, config: dict) -> bool:
    """Whether every rank's KV cache of a row has the same size, so that the prefix caches (bounded
    in bytes, each rank's own) keep and drop the same entries: always in tensor parallel; in a
    pipeline when the layers split evenly."""
    layers = config.get("text_config", config).get("num_hidden_layers", 0)
    return cluster.mode == "tensor" or layers % cluster.size == 0


def _exit_lost(reason: str) -> None:
    print(f"coreai: the distributed model is lost: {reason}", file=sys.stderr, flush=True)
    os._exit(EXIT_LOST)  # a rank stuck in a collective cannot be unwound: end the process


class _Watchdog:
    """Calls `on_lost` (once, from its own thread) when one exchange runs longer than `timeout` s."""

    def __init__(self, timeout: float, on_lost: Callable[[str], None]):
        self.timeout, self.on_lost = timeout, on_lost
        self._since: float | None = None
        self._what = ""
        threading.Thread(target=self._watch, name="coreai-rank-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        self._since, self._what = time.monotonic(), what
        try:
            yield
        finally:
            self._since = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(0.25, self.timeout / 4))
            since = self._since
            if since is not None and time.monotonic() - since > self.timeout:
                self.on_lost(f"{self._what} took longer than {self.timeout:g} s (a rank hung or unreachable)")
                return


class _Channel:
    """Broadcasts a message from rank 0 to every rank: an all_sum of a fixed header (length and the
    first bytes; the other ranks add zeros), then, for a longer message, one of the rest."""

    def __init__(self, group: mx.distributed.Group):
        self.group = group

    def _sum(self, data: bytes) -> bytes:
        out = mx.distributed.all_sum(mx.array(np.frombuffer(data, np.uint8)), group=self.group, stream=mx.cpu)
        return np.array(out).tobytes()

    def send(self, message: dict) -> None:
        data = dumps(message)
        header = bytearray(_HEADER)
        header[:4] = len(data).to_bytes(4, "little")
        head = data[: _HEADER - 4]
        header[4 : 4 + len(head)] = head
        self._sum(bytes(header))
        if len(data) > len(head):
            self._sum(data[len(head) :])

    def receive(self) -> dict:
        header = self._sum(bytes(_HEADER))
        size = int.from_bytes(header[:4], "little")
        data = header[4 : 4 + size]
        if size > len(data):
            data += self._sum(bytes(size - len(data)))
        return loads(data)


class Leader:
    """Rank 0's side: broadcasts each step's plan before executing it (`execute`, the batch's
    executor), keeps the other ranks waiting on it alive (`heartbeat`) and releases them (`close`).
    on_lost(reason): what a lost cluster does (default: end the process, `EXIT_LOST`)."""

    def __init__(self, cluster: Cluster, on_lost: Callable[[str], None] | None = None):
        self.cluster = cluster
        self.on_lost = on_lost or _exit_lost
        self._channel = _Channel(cluster.group)
        self._watchdog = _Watchdog(cluster.timeout, lambda reason: self.on_lost(reason))  # the one set then
        self._kv: KVBatch | None = None  # the batch the other ranks mirror

    @property
    def heartbeat_seconds(self) -> float:
        """How often an idle rank 0 should call `heartbeat`."""
        return self.cluster.timeout / 4

    def execute(self, kv: KVBatch, plan: StepPlan) -> dict:
        """Broadcast `plan` (after an "open" for a batch the other ranks do not mirror yet), then run it
        on `kv` and evaluate its logits. Raises ClusterLost (after `on_lost`) when a collective fails:
        the ranks may differ."""
        with self._exchange("a batch step"):
            if kv is not self._kv:
                prefix = kv.prompt_cache
                config = dict(max_batch=kv.max_batch, prefill=kv.prefill_step_size, prefix_entries=0, prefix_bytes=0)
                if prefix is not None:
                    config.update(prefix_entries=prefix.max_size, prefix_bytes=prefix.max_bytes)
                self._channel.send({"open": config})
                self._kv = kv
            self._channel.send({"step": plan.encode()})
            logits = kv.run(plan)
            # Evaluated here, not later by the strategies: the pass's collectives wait on the other
            # ranks, and a wait on a dead rank must be under the watchdog (no overlap of the pass with
            # the CPU's mask work on a distributed model).
            mx.eval(list(logits.values()))
            return logits

    def stopping(self, timeout: float) -> None:
        """Rank 0 is stopping: from now on an exchange longer than `timeout` s (or the rank timeout,
        if shorter) means the cluster is lost. mlx.launch ends every rank once one dies, so a stop
        may come while a step waits on a dead rank, which the ring backend never reports."""
        self._watchdog.timeout = min(self._watchdog.timeout, timeout)

    def heartbeat(self) -> None:
        """Tell the other ranks rank 0 is alive (and learn whether they are)."""
        with self._exchange("a heartbeat"):
            self._channel.send({"idle": 1})

    def close(self) -> None:
        """Release the other ranks (they return from `follow`)."""
        with self._exchange("the final message"):
            self._channel.send({"end": 1})

    @contextlib.contextmanager
    def _exchange(self, what: str) -> Iterator[None]:
        with self._watchdog.busy(what):
            try:
                yield
            except RuntimeError as exc:  # MLX's collectives raise RuntimeError (e.g. "[ring] ... lost")
                reason = f"{what} failed: {exc}"
                self.on_lost(reason)
                raise ClusterLost(reason) from exc


def follow(network, cluster: Cluster) -> int:
    """A rank other than 0: execute rank 0's plans on this rank's shard of `network` until rank 0
    says "end" (returns 0). A lost cluster ends the process (`EXIT_LOST`); so does a plan this rank
    cannot follow (a prefix cache that found another prefix than rank 0's)."""
    channel = _Channel(cluster.group)
    watchdog = _Watchdog(cluster.timeout, _exit_lost)
    kv: KVBatch | None = None
    while True:
        # Until rank 0 opens a batch it may be busy for long (tokenizer, grammars); from then on it
        # sends something at least every timeout / 4.
        with watchdog.busy("waiting for rank 0") if kv is not None else contextlib.nullcontext():
            try:
                message = channel.receive()
            except RuntimeError as exc:
                _exit_lost(f"rank {cluster.rank}: {exc}")
            if "open" in message:
                c = message["open"]
                prefix = LRUPromptCache(c["prefix_entries"], c["prefix_bytes"]) if c["prefix_bytes"] else None
                kv = KVBatch(network, c["max_batch"], prefix, c["prefill"])
            elif "step" in message:
                assert kv is not None  # rank 0 opens a batch before its first step
                _replay(kv, StepPlan.decode(message["step"]))
            elif "end" in message:
                return 0


def _replay(kv: KVBatch, plan: StepPlan) -> None:
    """Execute rank 0's plan, its adds first; the logits are computed (the same graph as rank 0's,
    so the same collectives) and dropped."""
    for rid, ids, reused in plan.add:
        slot = kv.add(rid, ids)
        if slot.reused != reused:
            _exit_lost(f"the prefix caches differ: rank 0 reused {reused} prompt tokens, this rank {slot.reused}")
    try:
        kv.run(plan)
    except RuntimeError as exc:
        _exit_lost(str(exc))
