"""`python -m coreai.server.bench --concurrency 1,2,4,8 [--requests 16] [--repeats 3]`: the server
benchmark (`benchmarks.server`: continuous batching against `mlx_lm.server`, or without
`--concurrency` decode tok/s and prefix-cache TTFT), under the name the batching work gave it."""

import sys

from benchmarks.server import main

if __name__ == "__main__":
    sys.exit(main())
