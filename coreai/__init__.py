"""coreai-mlx: an on-device LLM runtime on MLX with export recipes, guided generation and an
OpenAI-compatible server.

The system BLAS is set up by `runtime` before anything imports `mlx.core` (see `runtime.blas`).
"""

from runtime.blas import setup_blas
from coreai.api import load
from coreai.session import ConstrainedSession

__all__ = ["ConstrainedSession", "load", "setup_blas"]
__version__ = "0.1.0"
