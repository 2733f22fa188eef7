"""coreai-mlx: an on-device LLM runtime on MLX with export recipes, guided generation and an
OpenAI-compatible server.

`setup_blas()` runs before anything imports `mlx.core` (see `coreai.platform`).
"""

from coreai.platform import setup_blas

setup_blas()

from coreai.api import load  # noqa: E402
from guided import ConstrainedSession  # noqa: E402

__all__ = ["ConstrainedSession", "load", "setup_blas"]
__version__ = "0.1.0"
