"""`StepPlan`: everything one step of the batch does to the KV caches and the network, as plain data.

The batch (`runtime.batch.BatchGenerator`) decides; the KV layer (`runtime.kv_batch.KVBatch`)
executes. A plan is the whole of one step's decisions, so the same plan executed on the same KV
state gives the same forward passes: that is what lets the other ranks of a distributed model
(`runtime.distributed`) replay rank 0's steps without running its strategies, grammars or samplers.

Fields (row ids `rid` are ints rank 0 gives each row when it is added):

    add     [[rid, prompt ids, reused], ...]  rows added since the last step, in order; `reused`:
            the prompt tokens rank 0 found in its prefix cache (a follower checks it found as many)
    cancel  [rid, ...]                         waiting rows dropped before admission (cancelled)
    trim    [[rid, n], ...]                    active rows whose last n KV entries go (a rejected
                                               draft, a rollback)
    leave   [[rid, keep], ...]                 active rows that end; keep: store the row's KV cache
                                               in the prefix cache (false for a row that failed)
    feed    [[rid, ids, rows], ...]            the forward pass's input of each continuing active
                                               row: its new tokens then its draft; `rows`: logits
                                               rows taken from the end of `ids` (1 + draft length)

What is not in the plan follows from it: rows that join (admission is a pure function of the
waiting rows and the prompt lengths), their first feed (their last prompt token), prefill chunks,
and every position (each row's KV length). On the wire a plan is compact JSON (`encode`/`decode`),
a few hundred bytes per decode step.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class StepPlan:
    """One step's decisions; see the module docstring for each field's meaning."""

    add: list[tuple[int, list[int], int]] = field(default_factory=list)
    cancel: list[int] = field(default_factory=list)
    trim: list[tuple[int, int]] = field(default_factory=list)
    leave: list[tuple[int, bool]] = field(default_factory=list)
    feed: list[tuple[int, list[int], int]] = field(default_factory=list)

    def encode(self) -> dict:
        """The plan as a JSON-ready dict (lists of ints and bools)."""
        return asdict(self)

    @classmethod
    def decode(cls, data: dict) -> StepPlan:
        """The plan `encode` gave (tuples come back as lists, which is all the KV layer needs)."""
        return cls(**data)


def dumps(message: dict) -> bytes:
    """A message (`{"open": ...}`, `{"step": StepPlan.encode()}`, ...) as compact UTF-8 JSON."""
    return json.dumps(message, separators=(",", ":")).encode()


def loads(data: bytes) -> dict:
    """The message `dumps` wrote."""
    return json.loads(data.decode())
