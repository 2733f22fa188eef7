"""Run under `mlx.launch` with 2 ranks by tests/test_distributed.py: for each model folder given, in
tensor and in pipeline mode, the split network's logits against the whole network's. Prints one line
per check: `HEAD <rank> <mode> <folder name> <start> <stop> <held> <max abs difference>`, where start,
stop are the vocabulary rows this rank's output head computes (-1 -1: the head was not split) and
held the rows of the head's weight the rank keeps."""

from __future__ import annotations

import sys
from pathlib import Path

from runtime.distributed import Cluster, head_split
from runtime.model import load_model


def main(folders: list[str]) -> int:
    import mlx.core as mx  # after runtime (above): its fast BLAS loads before mlx.core

    group = mx.distributed.init()
    ids = mx.array([[5, 17, 42, 99, 7, 3, 250, 11]])
    for folder in folders:
        whole = load_model(folder).network(ids)
        for mode in ("tensor", "pipeline"):
            network = load_model(folder, cluster=Cluster(group, mode)).network
            split = head_split(network)
            start, stop = split.rows if split is not None else (-1, -1)
            held = split.head["weight"].shape[0] if split is not None else -1
            diff = mx.abs(network(ids) - whole).max().item()
            print(f"HEAD {group.rank()} {mode} {Path(folder).name} {start} {stop} {held} {diff:.3e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
