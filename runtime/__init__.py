"""MLX text generation: model loading, tokenizer, sampling, the generation loop and the
`DecodingStrategy` protocol. Knows nothing of grammars.

`setup_blas()` runs first, before anything imports `mlx.core` (see `runtime.blas`)."""

from runtime.blas import setup_blas

setup_blas()

from runtime.errors import ModelNotFound  # noqa: E402
from runtime.generate import stream_tokens  # noqa: E402
from runtime.sequence import Delta, GenerationResult, Timings, Usage  # noqa: E402
from runtime.model import Model, load_model  # noqa: E402
from runtime.prompt_cache import PromptCache  # noqa: E402
from runtime.sampling import SamplingParams, SamplingStrategy, TokenHistory, TokenSampler  # noqa: E402
from runtime.drafters import make_drafter  # noqa: E402
from runtime.speculative import DraftModel, PromptLookup  # noqa: E402
from runtime.strategy import DecodingStrategy, Drafter, Step  # noqa: E402
from runtime.tokenizer import Tokenizer  # noqa: E402
from runtime.value_lookup import ValueLookup  # noqa: E402

__all__ = [
    "DecodingStrategy",
    "Delta",
    "DraftModel",
    "Drafter",
    "GenerationResult",
    "Model",
    "ModelNotFound",
    "PromptCache",
    "PromptLookup",
    "SamplingParams",
    "SamplingStrategy",
    "Step",
    "Timings",
    "Tokenizer",
    "TokenHistory",
    "TokenSampler",
    "Usage",
    "ValueLookup",
    "load_model",
    "make_drafter",
    "stream_tokens",
]
