"""MLX text generation: model loading, tokenizer, sampling, the generation loop and the
`DecodingStrategy` protocol. Knows nothing of grammars."""

from runtime.errors import ModelNotFound
from runtime.generate import Delta, GenerationResult, Timings, Usage, stream_tokens
from runtime.model import Model, load_model
from runtime.prompt_cache import PromptCache
from runtime.sampling import SamplingParams, SamplingStrategy, TokenHistory, process_logits
from runtime.strategy import DecodingStrategy, Step
from runtime.tokenizer import Tokenizer

__all__ = [
    "DecodingStrategy", "Delta", "GenerationResult", "Model", "ModelNotFound", "PromptCache",
    "SamplingParams", "SamplingStrategy", "Step", "Timings", "Tokenizer", "TokenHistory", "Usage",
    "load_model", "process_logits", "stream_tokens",
]
