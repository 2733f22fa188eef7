"""The soak at two ranks (`python -m benchmarks.soak --ranks 2`): `coreai serve` on two ranks of one
machine (ring backend), started as `mlx.launch` starts them (MLX_RANK, MLX_HOSTFILE) but without
it, so that rank 0's own exit code is seen (mlx.launch would end the other ranks when one dies, and
reports its own), the same mixed clients for `--minutes`, then rank 1 is SIGSTOPped for
`--stop-seconds` (30) while the clients go on, and SIGKILLed if still there. Reports the soak's
figures for the run before the fault and, for the fault: when rank 0 ended and with which code
(goal: non-zero, `runtime.distributed.EXIT_LOST`), and how the requests running at the SIGSTOP
ended (goal: every one within the rank timeout plus the lost model's grace, with its API's error:
a 503 before a stream began, an error event in one that had)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _free_port_run(n: int) -> int:
    """The first of `n` consecutive free loopback ports (mlx.launch's ring takes start, start + 1, ...)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            start = s.getsockname()[1]
        try:
            with contextlib.ExitStack() as stack:
                for port in range(start, start + n):
                    stack.enter_context(socket.create_server(("127.0.0.1", port)))
            return start
        except OSError:
            continue
    raise RuntimeError("no free ports")


def run(args, model: str, serve_args: list[str], soak) -> dict:
    """The two-rank soak; `soak` is `benchmarks.soak` (its Client, sampling and summary)."""
    port, ring = _free_port_run(1), _free_port_run(2)
    command = [sys.executable, "-m", "coreai", "serve", model, "--port", str(port)]
    command += ["--rank-timeout", str(args.rank_timeout), *serve_args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = args.out.with_suffix(".server.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp, log.open("w") as stderr:
        hosts = Path(tmp) / "hosts.json"
        hosts.write_text(json.dumps([[f"127.0.0.1:{ring}"], [f"127.0.0.1:{ring + 1}"]]))
        ranks = [
            subprocess.Popen(
                command,
                env={**env, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hosts)},
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
            for r in (0, 1)
        ]
        try:
            deadline = time.monotonic() + 600
            while True:
                if any(r.poll() is not None for r in ranks) or time.monotonic() > deadline:
                    raise RuntimeError(f"the ranks did not start (see {log})")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(base + "/health", timeout=2).status_code == 200:
                        break
                time.sleep(0.5)
            report = soak.load(args, base, ranks[0].pid)
            report.update(fault(args, base, ranks, soak))
        finally:
            for r in ranks:
                if r.poll() is None:
                    r.kill()
                    r.wait()
    report["server_log"] = str(log)
    return report


def fault(args, base: str, ranks: list[subprocess.Popen], soak) -> dict:
    """Clients running; rank 1 SIGSTOPped, then SIGKILLed after `--stop-seconds`; until rank 0 ends."""
    clients = [soak.Client(base, 1000 + i, args.max_tokens, args.timeout) for i in range(args.clients)]
    until = time.monotonic() + args.stop_seconds + args.rank_timeout + 60
    threads = [threading.Thread(target=c.run, args=(until,)) for c in clients]
    for t in threads:
        t.start()
    time.sleep(min(10.0, args.rank_timeout))  # requests in flight
    stopped = time.monotonic()
    ranks[1].send_signal(signal.SIGSTOP)
    killed = ended = None  # the SIGKILL's time, rank 0's end
    while (ended is None or killed is None) and time.monotonic() < until:
        if killed is None and time.monotonic() - stopped >= args.stop_seconds:
            ranks[1].kill()
            killed = time.monotonic()
        if ended is None and ranks[0].poll() is not None:
            ended = time.monotonic()
        time.sleep(0.1)
    for c in clients:
        c.stop = True
    for t in threads:
        t.join()
    spanning = [r for c in clients for r in c.records if r["t"] <= stopped <= r["t"] + r["latency"]]
    # A bad input is refused before it reaches the ranks (a 4xx even with a rank stopped): counted
    # apart; a stream its client left after the first text ended by the client's choice.
    left = [r for r in spanning if r["kind"] == "dropped_stream" and r.get("ttft") is not None]
    hit = [r for r in spanning if r["kind"] != "bad_input" and r not in left]
    bad = [r for r in spanning if r["kind"] == "bad_input"]
    ends = Counter(_ending(r) for r in hit)
    return {
        "fault": {
            "rank_timeout_s": args.rank_timeout,
            "rank1_stopped_s": round((killed or time.monotonic()) - stopped, 2),
            "rank0_exit_code": ranks[0].poll(),  # None: still running (a failure)
            "rank0_ended_after_stop_s": round(ended - stopped, 2) if ended is not None else None,
            "running_at_stop": len(hit),
            "how_they_ended": dict(ends),
            "bad_inputs_refused_4xx": f"{sum(r.get('refused', False) for r in bad)}/{len(bad)}",
            "streams_the_client_left": len(left),
            "longest_to_end_after_stop_s": round(max((r["t"] + r["latency"] - stopped for r in hit), default=0), 2),
        }
    }


def _ending(record: dict) -> str:
    """How a request ended: its status, "+ error event", or for a 200 whether it was whole: a whole
    answer spanning the stop is one the ranks finished before it (the step in flight); a 200 stream
    cut without its API's last event or an error event is the failure this run looks for."""
    status = record.get("status")
    if record.get("error_event"):
        return f"{status} + error event"
    if status == 200:
        return "200 cut without an error" if record.get("unended") else "200 whole"
    return json.dumps(status) if not isinstance(status, str) else status
