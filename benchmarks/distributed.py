"""The scaling benchmark (issues 38, 49): one model on 1 rank pinned to one core, then on 2 ranks
pinned to a core each (tensor and pipeline parallel), at batch 1 and with 4 concurrent requests;
coreai (rank 0 leads the others with step plans, `runtime.distributed`) beside mlx-lm's own
distributed generation (`mlx_lm.utils.sharded_load`, every rank generating) on the same pinning.

    python -m benchmarks.distributed [--tokens 32] [--repeats 3] [--delays 0 50 200] [--batches 1 4]
                                     [--engines coreai mlx-lm] [--modes tensor pipeline]

Pinning: every rank runs under `taskset -c <core>` with one BLAS thread (OPENBLAS/MKL/OMP_NUM_THREADS
=1), so 1 rank on one core is the baseline and 2 ranks on two cores is what a second machine adds.
The link: each rank of 2 runs in its own network namespace (`ip netns exec`), the two joined by a veth
pair on which `tc netem` delays every packet by 0, 50 or 200 us each way (a Thunderbolt-like and an
Ethernet-like hop); where the kernel has no netem, `link_delay.c` (built with gcc) preloaded into
every rank of every run delays each send() instead (`Link`). The ranks are started as `mlx.launch`
starts them for the ring backend (`MLX_RANK`, `MLX_HOSTFILE`). Namespaces need root (CAP_NET_ADMIN):
without it, or without gcc where the shim is needed, the 2-rank runs go over loopback and only delay
0 runs. Per batch and setting the engines run back to back, so a drift in load hits both.

Per setting, rank 0's figures over the decode steps (every row has its first token):
    decode tok/s   tokens of all rows after that point / the time they took
    step           median wall time of one decode step (ms)
    pass           median forward pass, evaluated, collectives included (coreai only; mlx-lm's
                   step is not split: its pass is the step)
    plan           median broadcast of the step's plan to the other ranks (coreai, 2 ranks)
    host           step - pass - plan per step, its median: sampling, detokenizing, building the
                   plan (coreai); the medians of the parts need not add up to the step's
    collectives    the same collectives as one decode step alone, timed apart in the same processes
                   after the run: 2 all-reduces per layer (tensor); the stage hand-off and the final
                   all_gather (pipeline); and coreai's gather of the split output head's logits;
                   median of 20
    compute        pass - collectives (mlx-lm: step - collectives); in a pipeline it includes
                   each rank's wait for the other stage
and per rank its share of the weights as loaded and its peak resident memory (MiB). Prints the table;
writes JSON with the load average before and after to benchmarks/results/distributed.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import runtime  # noqa: F401 - first: the fast BLAS before mlx.core loads (runtime.blas), in every rank

RESULTS = Path(__file__).parent / "results" / "distributed.json"
ROOT = Path(__file__).resolve().parent.parent
SUBJECTS = (
    "a lighthouse keeper and a storm",
    "a clockmaker and a stolen key",
    "a cartographer lost at sea",
    "a baker who speaks to birds",
)
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
ADDRESSES = ("10.231.0.1", "10.231.0.2")


def prompts(batch: int) -> list[str]:
    return [f"Write a long, detailed story about {s}." for s in SUBJECTS[:batch]]


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def median_ms(values: list[float]) -> float:
    return round(1000 * statistics.median(values), 2) if values else 0.0


# ---- inside one rank -------------------------------------------------------------------------------


def collectives_ms(
    group, mode: str, rows: int, hidden: int, layers: int, head_width: int = 0, repeats: int = 20
) -> float:
    """Median time (ms) of one decode step's collectives alone, on rows x 1 x hidden float32 activations:
    tensor, the 2 all-reduces of each layer (attention and MLP outputs, mlx-lm's `shard`); pipeline,
    the hand-off from each stage to the next and the final all_gather (mlx-lm's `pipeline`); then,
    with `head_width` (a split output head's rows per rank, `runtime.distributed.split_head`), the
    all_gather of rows x head_width logits. Every rank must call it with the same arguments."""
    import mlx.core as mx

    rank, size = group.rank(), group.size()
    x = mx.zeros((rows, 1, hidden), mx.float32)
    mx.eval(mx.distributed.all_sum(x, group=group))  # line the ranks up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        h = x
        if mode == "tensor":
            for _ in range(2 * layers):
                h = mx.distributed.all_sum(h, group=group)
        else:
            if rank < size - 1:
                h = mx.distributed.recv_like(h, rank + 1, group=group)
            if rank != 0:
                h = mx.distributed.send(h, rank - 1, group=group)
            h = mx.distributed.all_gather(h, group=group)
        if head_width:
            h = mx.distributed.all_gather(mx.zeros((rows, head_width)) + h.sum(), group=group)
        mx.eval(h)
        times.append(time.perf_counter() - start)
    return median_ms(times)


def _decode_window(events: list[tuple[float, list[int]]], rows: int) -> tuple[float, int, int]:
    """(start time, first event index, tokens) of the decode window: from the event at which every row
    has its first token to the last event. events: (time, tokens per row emitted at that time)."""
    seen = [0] * rows
    for i, (t, counts) in enumerate(events):
        seen = [a + b for a, b in zip(seen, counts, strict=True)]
        if all(seen):
            tokens = sum(sum(c) for _, c in events[i + 1 :])
            return t, i, tokens
    raise RuntimeError("a row produced no token")


def _figures(runs: list[tuple[list, list | None]], rows: int) -> dict:
    """Rank 0's figures over repeated runs. runs: (events, splits) per run; events as `_decode_window`
    takes them; splits: per event (step, pass, plan) in seconds, or None where only the step is known
    (mlx-lm). Returns tokens (per run), decode_tps (the median run's) and decode_tps_runs, and the
    step split in ms, medians over the decode steps of every run."""
    rates, steps, passes = [], [], []
    for events, splits in runs:
        start, i, n = _decode_window(events, rows)
        rates.append(n / (events[-1][0] - start))
        if splits is None:
            steps += [b[0] - a[0] for a, b in zip(events[i:], events[i + 1 :], strict=False)]
        else:
            decode = splits[i + 1 : -1]  # the last step runs no pass (every row has ended)
            steps += [s for s, _, _ in decode]
            passes += [(p - q, q, s - p) for s, p, q in decode]
    out = dict(
        tokens=n,
        decode_tps=round(statistics.median(rates), 3),
        decode_tps_runs=[round(r, 3) for r in rates],
        step_ms=median_ms(steps),
    )
    if passes:
        out.update({k: median_ms([p[j] for p in passes]) for j, k in enumerate(("pass_ms", "plan_ms", "host_ms"))})
    return out


def coreai_rank(
    model_name: str, batch: int, tokens: int, mode: str | None, repeats: int = 1, split: bool = True
) -> dict:
    """One rank of coreai: load this rank's shard; rank 0 runs `batch` requests through the batch
    (`runtime.batch.BatchGenerator`, the server's engine), the others follow its plans. split: False
    leaves the output head whole on every rank (`runtime.distributed.split_head` off)."""
    from types import SimpleNamespace

    import mlx.core as mx

    import coreai
    import runtime.distributed
    from runtime.batch import BatchGenerator
    from runtime.distributed import follow, head_split, join
    from runtime.sampling import SamplingStrategy

    if not split:  # mlx-lm's whole output head on every rank, for the side-by-side with the split
        runtime.distributed.split_head = lambda network, group: None
    cluster = join(mode == "pipeline")
    t0 = time.perf_counter()
    model = coreai.load(model_name, cluster=cluster)
    row: dict = {"rank": 0 if cluster is None else cluster.rank, "load_s": round(time.perf_counter() - t0, 2)}
    row["weights_mib"] = _weights_mib(model.network)
    if cluster is not None and cluster.rank != 0:
        follow(model.network, cluster)
    else:
        leader = model.leader
        clock = {"plan": 0.0, "pass": 0.0}
        if leader is not None:
            send = leader._channel.send

            def timed_send(message: dict) -> None:
                start = time.perf_counter()
                send(message)
                clock["plan"] += time.perf_counter() - start

            leader._channel.send = timed_send  # type: ignore[method-assign]

        def execute(kv, plan):
            start = time.perf_counter()
            if leader is not None:
                logits = leader.execute(kv, plan)  # broadcast, pass, evaluated
            else:  # evaluated here too, so the pass is timed alike on 1 rank
                logits = kv.run(plan)
                mx.eval(list(logits.values()))
            clock["pass"] += time.perf_counter() - start
            return logits

        # no EOS: every row decodes exactly `tokens` tokens, as in mlx-lm's run
        tokenizer = SimpleNamespace(eos_ids=set(), detokenizer=model.tokenizer.detokenizer, hf=model.tokenizer.hf)
        ids = [model.prompt_ids(p) for p in prompts(batch)]

        def run(max_tokens: int) -> tuple[list, list]:
            gen = BatchGenerator(model.network, tokenizer, max_batch=batch, execute=execute)
            handles = [gen.add(p, SamplingStrategy(), max_tokens=max_tokens) for p in ids]
            events, splits = [], []
            while len(gen):
                before, start = dict(clock), time.perf_counter()
                out = gen.step()
                now = time.perf_counter()
                counts = [0] * batch
                for r, delta in out:
                    counts[handles.index(r)] += len(delta.token_ids)
                events.append((now, counts))
                splits.append((now - start, clock["pass"] - before["pass"], clock["plan"] - before["plan"]))
            return events, splits

        run(4)  # warm-up: first-call costs out of the figures
        row.update(_figures([run(tokens) for _ in range(repeats)], batch))
        if leader is not None:
            leader.close()
    if cluster is not None:
        head = head_split(model.network)
        width = head.rows[1] - head.rows[0] if head is not None else 0
        row["collectives_ms"] = collectives_ms(cluster.group, cluster.mode, batch, *_shape(model.config), width)
    row["peak_rss_mib"] = round(peak_rss_mib())
    return row


def mlx_lm_rank(model_name: str, batch: int, tokens: int, mode: str | None, repeats: int = 1) -> dict:
    """One rank of mlx-lm's own distributed generation: `sharded_load` (tensor or pipeline group),
    then every rank runs the same generation (`stream_generate` at batch 1, its `BatchGenerator`
    otherwise), greedy, no EOS."""
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.utils import sharded_load

    from coreai.api import resolve
    from runtime.model import default_dtype

    path = str(resolve(model_name))
    group = mx.distributed.init() if mode else None
    t0 = time.perf_counter()
    if group is None:
        loaded = load(path)
    else:
        loaded = sharded_load(
            path,
            pipeline_group=group if mode == "pipeline" else None,
            tensor_group=group if mode == "tensor" else None,
        )
    network, tokenizer = loaded[0], loaded[1]
    if default_dtype() == "float32":  # as coreai loads it on the CPU: MLX's float16 matmuls skip BLAS
        network.set_dtype(mx.float32, lambda d: mx.issubdtype(d, mx.floating))
        mx.eval(network.parameters())
    row: dict = {"rank": 0 if group is None else group.rank(), "load_s": round(time.perf_counter() - t0, 2)}
    row["weights_mib"] = _weights_mib(network)
    tokenizer.eos_token_ids = set()
    ids = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
        for p in prompts(batch)
    ]

    def run(max_tokens: int) -> list:
        events = []
        if batch == 1:
            for _ in stream_generate(network, tokenizer, ids[0], max_tokens=max_tokens):
                events.append((time.perf_counter(), [1]))
            return events
        gen = BatchGenerator(network, max_tokens=max_tokens)
        uids = gen.insert(ids)
        live = set(uids)
        while live:
            out = gen.next_generated()
            counts = [0] * batch
            for r in out:
                counts[uids.index(r.uid)] += 1
                if r.finish_reason is not None:
                    live.discard(r.uid)
            events.append((time.perf_counter(), counts))
        gen.close()
        return events

    run(4)
    row.update(_figures([(run(tokens), None) for _ in range(repeats)], batch))
    if group is not None:
        row["collectives_ms"] = collectives_ms(group, mode or "tensor", batch, *_shape(_config(path)))
    row["peak_rss_mib"] = round(peak_rss_mib())
    return row


def _weights_mib(network) -> int:
    """This rank's share of the weights as loaded (float32 on a CPU), MiB."""
    from mlx.utils import tree_flatten

    leaves: Any = tree_flatten(network.parameters())
    return round(sum(v.nbytes for _, v in leaves) / 2**20)


def _config(path: str) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def _shape(config: dict) -> tuple[int, int]:
    text = config.get("text_config", config)
    return text["hidden_size"], text["num_hidden_layers"]


# ---- the harness -----------------------------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class Link:
    """Two network namespaces joined by a veth pair, named after this process (so two runs do not
    share them), ranks at `ADDRESSES`. The delay is set per run: `tc netem` on both ends where the
    kernel has it (`method` "tc netem"), else `link_delay.c` preloaded into every rank of every run,
    0 us included, so that the runs differ only in the delay (this project's Linux machines lack
    sch_netem). Raises CalledProcessError when the namespaces cannot be made (no CAP_NET_ADMIN) or
    the shim does not compile (no gcc). `close()` deletes the namespaces (and the pair)."""

    def __init__(self):
        pid = os.getpid()
        self.netns = (f"coreai-bench-{pid}-0", f"coreai-bench-{pid}-1")
        self.veth = (f"cb{pid}a", f"cb{pid}b")  # interface names: 15 characters at most
        self._workdir = tempfile.TemporaryDirectory(prefix="coreai-link-")
        try:
            _ip("link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
            for ns, dev, address in zip(self.netns, self.veth, ADDRESSES, strict=True):
                _ip("netns", "add", ns)
                _ip("link", "set", dev, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
            self.method = "tc netem" if self._tc("replace", "netem", "delay", "1us") else "send() delay shim"
            self._tc("del")
            self.shim = Path(self._workdir.name) / "link_delay.so"
            if self.method != "tc netem":
                source = Path(__file__).with_name("link_delay.c")
                subprocess.run(
                    ["gcc", "-O2", "-shared", "-fPIC", "-o", str(self.shim), str(source), "-ldl"], check=True
                )
        except BaseException:
            self.close()
            raise

    def _tc(self, verb: str, *qdisc: str) -> bool:
        """`tc qdisc <verb>` on both ends; whether both succeeded."""
        done = [
            subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", verb, "dev", dev, "root", *qdisc], capture_output=True
            )
            for ns, dev in zip(self.netns, self.veth, strict=True)
        ]
        return all(d.returncode == 0 for d in done)

    def delay(self, us: int) -> dict[str, str]:
        """Delay each packet (each send) by `us` microseconds one way; returns the environment every
        rank of the run needs for it (1-rank runs too, with 0)."""
        if self.method == "tc netem":
            self._tc("del")
            if us and not self._tc("replace", "netem", "delay", f"{us}us"):
                raise RuntimeError(f"tc netem could not set a {us} us delay")
            return {}
        return {"LD_PRELOAD": str(self.shim), "COREAI_LINK_DELAY_US": str(us)}

    def close(self) -> None:
        for ns in self.netns:
            _ip("netns", "del", ns, check=False)
        self._workdir.cleanup()


def make_link() -> Link | None:
    """The link between the 2 ranks, or None (loopback, no added delay) when this user cannot make
    network namespaces or the delay shim cannot be built, saying why on stderr."""
    if shutil.which("ip") is None or shutil.which("tc") is None or os.geteuid() != 0:
        print("not root (or no ip / tc): the 2-rank runs go over loopback, with no added delay", file=sys.stderr)
        return None
    try:
        return Link()
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        print(f"no link between namespaces ({exc}): loopback, no added delay", file=sys.stderr)
        return None


def run_setting(
    engine: str,
    model: str,
    batch: int,
    tokens: int,
    mode: str | None,
    link: Link | None,
    delay: dict | None = None,
    repeats: int = 1,
) -> list[dict]:
    """The RESULT rows of one setting by rank: 1 rank on core 0 (mode None), or 2 ranks on cores 0
    and 1, in the link's namespaces when there is one (else loopback). delay: the environment
    `Link.delay` asked for."""
    flags = ["--rank-run", engine, "--model", model, "--batch", str(batch), "--tokens", str(tokens)]
    flags += ["--repeats", str(repeats)]
    if mode:
        flags += ["--mode", mode]
    base = [sys.executable, "-m", "benchmarks.distributed", *flags]
    env = {**os.environ, **ONE_THREAD, **(delay or {})}
    env.pop("MLX_HOSTFILE", None)
    env.pop("MLX_RANK", None)
    ranks = 2 if mode else 1
    with contextlib.ExitStack() as stack:
        if mode:
            port = random.randint(20000, 40000)
            hosts = [f"{ADDRESSES[r] if link else '127.0.0.1'}:{port + r}" for r in range(ranks)]
            hostfile = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".json"))
            json.dump([[h] for h in hosts], hostfile)
            hostfile.flush()
            env["MLX_HOSTFILE"] = hostfile.name
        procs = []
        for r in range(ranks):
            cmd = ["taskset", "-c", str(r), *base]
            if mode and link is not None:
                cmd = ["ip", "netns", "exec", link.netns[r], *cmd]
            popen = dict(cwd=ROOT, env={**env, "MLX_RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            procs.append(subprocess.Popen(cmd, text=True, **popen))  # type: ignore[call-overload]
        try:  # every rank's pipes read at once: a rank blocked on a full pipe would stall the others
            with ThreadPoolExecutor(len(procs)) as pool:
                outputs = list(pool.map(lambda p: p.communicate(timeout=1800), procs))
        finally:
            for p in procs:
                p.kill()
    rows = [json.loads(m) for out, _ in outputs for m in re.findall(r"^RESULT (.*)$", out, re.M)]
    if len(rows) != ranks:
        raise RuntimeError(f"{len(rows)} of {ranks} ranks reported:\n" + "\n".join(err[-2000:] for _, err in outputs))
    return sorted(rows, key=lambda r: r["rank"])


def table_line(engine, setting, delay, batch, rows, baseline) -> str:
    r0 = rows[0]
    ratio = r0["decode_tps"] / baseline if baseline else 0.0
    coll = r0.get("collectives_ms", 0.0)
    compute = r0.get("pass_ms", r0["step_ms"]) - coll
    rss = "/".join(str(r["peak_rss_mib"]) for r in rows)
    return (
        f"{engine:7s} {setting:9s} {delay:>6s} {batch:5d} {r0['decode_tps']:9.2f} {ratio:6.2f}x "
        f"{r0['step_ms']:8.1f} {r0.get('pass_ms', 0):8.1f} {compute:8.1f} {coll:6.1f} {r0.get('plan_ms', 0):6.2f} "
        f"{r0.get('host_ms', 0):6.2f}  {rss}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--tokens", type=int, default=32, help="tokens each request decodes")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting, in the same processes")
    parser.add_argument("--delays", type=int, nargs="+", default=[0, 50, 200], help="one-way link delays, us")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4], choices=[1, 2, 3, 4])
    engines = ["coreai", "mlx-lm", "coreai-whole-head"]
    parser.add_argument("--engines", nargs="+", default=engines[:2], choices=engines, help="coreai-whole-head: "
                        "coreai with mlx-lm's whole output head on every rank")  # fmt: skip
    parser.add_argument("--modes", nargs="+", default=["tensor", "pipeline"], choices=["tensor", "pipeline"])
    parser.add_argument("--rank-run", choices=engines, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["tensor", "pipeline"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.rank_run:
        run_args = (args.model, args.batch, args.tokens, args.mode, args.repeats)
        if args.rank_run == "mlx-lm":
            row = mlx_lm_rank(*run_args)
        else:
            row = coreai_rank(*run_args, split=args.rank_run == "coreai")
        print("RESULT " + json.dumps(row), flush=True)
        return 0
    from coreai.api import resolve

    resolve(args.model)  # a registry model is exported once, before any timed process
    link = make_link()
    delays = args.delays if link is not None else [0]
    report: dict = {
        "model": args.model,
        "tokens_per_request": args.tokens,
        "pinning": "taskset: rank r on core r; OPENBLAS/MKL/OMP_NUM_THREADS=1",
        "link": f"veth between two network namespaces, delay by {link.method}" if link else "loopback",
        "order": "per batch and setting, the engines back to back",
        "load_average": os.getloadavg(),
        "runs": [],
    }
    print(
        "engine  setting   delay  batch  decode/s  vs 1r   step ms  pass ms  compute  coll  plan   host   peak RSS MiB"
    )
    settings = [(None, 0)] + [(mode, us) for mode in args.modes for us in delays]
    baseline: dict = {}
    with contextlib.closing(link) if link is not None else contextlib.nullcontext():
        for batch in args.batches:
            for mode, us in settings:
                for engine in args.engines:  # back to back, so a drift in the machine's load hits both
                    delay = link.delay(us) if link is not None else {}
                    rows = run_setting(engine, args.model, batch, args.tokens, mode, link, delay, args.repeats)
                    baseline.setdefault((engine, batch), rows[0]["decode_tps"])
                    run = {"engine": engine, "setting": mode or "1 rank", "delay_us": us, "batch": batch, "ranks": rows}
                    if mode:
                        run["delay_by"] = link.method if link is not None else "loopback"
                    report["runs"].append(run)
                    shown = f"{us}us" if mode else "-"
                    print(table_line(engine, mode or "1 rank", shown, batch, rows, baseline[engine, batch]), flush=True)
    report["load_average_after"] = os.getloadavg()
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"load average (1, 5, 15 min) before {report['load_average']}, after {report['load_average_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
