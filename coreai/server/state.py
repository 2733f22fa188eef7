"""`ServerState`: what one server instance owns (its settings, the generation service with its
worker, the journal warm-up), its start and its orderly stop. The routes reach
it as `request.app.state.server` (`coreai.server.dispatch.server_state`)."""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from coreai.server.config import ServerConfig, parse_alias
from coreai.service import Service
from coreai.service.worker import Worker
from guided import GrammarCache, GrammarJournal
from runtime import Model
from runtime.distributed import EXIT_LOST
from runtime.errors import ClusterLost, ParameterError

log = logging.getLogger("coreai.server")

JOIN_TIMEOUT = 60.0  # seconds: a cancelled row leaves within one forward pass or prefill chunk
LOST_GRACE = 2.0  # seconds a server whose distributed model is lost answers 503 before it exits


class GrammarWarmup:
    """Records `cache`'s compiles in `journal`, and on `start` compiles the grammars recorded by
    earlier runs on a background thread (a request for one of them meanwhile compiles it itself)."""

    def __init__(self, cache: GrammarCache, journal: GrammarJournal):
        self.cache, self.journal = cache, journal
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grammar-journal", daemon=True)

    def start(self) -> None:
        self.cache.persist(self.journal)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """End the warm-up after the compile under way and wait for it (at most `timeout` seconds);
        compiles are no longer recorded. Returns whether the thread has ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.cache.persist(None)
        return not self._thread.is_alive()

    def _run(self) -> None:
        t0 = time.perf_counter()
        n = self.cache.warm(self.journal, stop=self._stop)
        seconds = time.perf_counter() - t0
        log.info("grammar journal: %d grammars compiled again in %.1f s (%s)", n, seconds, self.journal.dir)


@dataclass
class ServerState:
    """One server instance. name: the model id clients send. created: when it started (Unix
    seconds, the model card's). service: the generation service (`coreai.service.Service`: settings,
    grammars, the worker with its batch engine)."""

    model: Model
    config: ServerConfig
    name: str
    created: int
    service: Service
    warmup: GrammarWarmup | None
    stopped: bool = field(default=False, init=False)
    lost: str | None = field(default=None, init=False)  # why the distributed model is lost, once it is

    @classmethod
    def build(cls, model: Model, config: ServerConfig, grammar_cache: GrammarCache | None = None) -> ServerState:
        """The state of a server for `model` (builds the grammar engine's view of the tokenizer: a few
        seconds, once per tokenizer per process); nothing runs until `start`."""
        leader = model.leader
        heartbeat = (leader.heartbeat_seconds, leader.heartbeat) if leader is not None else None
        service = Service(
            model,
            config.settings(),
            grammar_cache or GrammarCache(),
            max_batch=config.max_batch,
            max_queue=config.max_queue,
            prompt_cache_bytes=config.prompt_cache_bytes,
            prompt_cache_dir=config.prompt_cache_dir,
            heartbeat=heartbeat,
            max_kv_bytes=config.max_kv_bytes,
        )
        warmup = None
        if service.tokenizer_info is not None and config.grammar_journal:
            warmup = GrammarWarmup(service.cache, GrammarJournal(config.grammar_journal, service.tokenizer_info))
        name = config.model_name or model.name
        for pattern, target in map(parse_alias, config.aliases):
            if target is not None and target != name:
                raise ParameterError(
                    f"alias {pattern}={target}: this server serves {name!r}, not {target!r}", "aliases"
                )
        state = cls(
            model=model,
            config=config,
            name=name,
            created=int(time.time()),
            service=service,
            warmup=warmup,
        )
        if leader is not None:
            leader.on_lost = state.lose
        return state

    def serves(self, requested: str) -> bool:
        """Whether `requested` (a request's `model`) names the served model: its name, or one of
        the configured aliases (globs, fnmatch's, case-sensitive)."""
        if requested == self.name:
            return True
        return any(fnmatch.fnmatchcase(requested, parse_alias(a)[0]) for a in self.config.aliases)

    @property
    def aliases(self) -> list[str]:
        """The configured alias names (globs as given)."""
        return [parse_alias(a)[0] for a in self.config.aliases]

    @property
    def worker(self) -> Worker:
        return self.service.worker

    @property
    def grammar_cache(self) -> GrammarCache:
        return self.service.cache

    @property
    def distributed(self) -> dict | None:
        """{"ranks": N, "mode": "tensor" | "pipeline"} on a distributed model, else None."""
        cluster = self.model.cluster
        return None if cluster is None else {"ranks": cluster.size, "mode": cluster.mode}

    def lose(self, reason: str) -> None:
        """The distributed model is lost (a rank died or hung, `runtime.distributed`): new requests get
        503 at once, and after `LOST_GRACE` seconds (for the answers under way) the process ends with
        `EXIT_LOST`: the worker may be stuck in a collective that never returns, so no orderly stop."""
        if self.lost is not None:
            return
        self.lost = reason
        log.error("the distributed model is lost (%s); exiting in %.0f s", reason, LOST_GRACE)
        self.worker.fail(ClusterLost(f"the distributed model is lost: {reason}"))
        threading.Timer(LOST_GRACE, os._exit, (EXIT_LOST,)).start()

    def start(self) -> None:
        self.service.start()
        if self.warmup is not None:
            self.warmup.start()

    def stop(self) -> None:
        """Stop in order before the interpreter may exit, so MLX and llguidance are never torn down
        under a running thread: the journal warm-up ends after its current compile, the worker stops
        admitting, cancels its rows and is joined. Once: later calls do nothing."""
        if self.stopped:
            return
        self.stopped = True
        threads = [("generation", self.worker.close)]
        if self.warmup is not None:
            threads.insert(0, ("grammar-journal", self.warmup.stop))
        for name, stop in threads:
            if stop(JOIN_TIMEOUT):
                log.info("the %s thread stopped", name)
            else:
                log.warning("the %s thread did not end within %.0f s", name, JOIN_TIMEOUT)
