"""MLX text generation: model loading, tokenizer, sampling, the generation loop and the
`DecodingStrategy` protocol. Knows nothing of grammars."""

from runtime.errors import ModelNotFound
from runtime.generate import Delta, GenerationResult, Timings, Usage, stream_tokens
from runtime.model import Model, load_model
from runtime.prompt_cache import PromptCache
from runtime.sampling import SamplingParams, SamplingStrategy, TokenHistory, TokenSampler
from runtime.speculative import DraftModel, PromptLookup, make_drafter
from runtime.strategy import DecodingStrategy, Drafter, Step
from runtime.tokenizer import Tokenizer

__all__ = [
    "DecodingStrategy", "Delta", "DraftModel", "Drafter", "GenerationResult", "Model", "ModelNotFound",
    "PromptCache", "PromptLookup", "SamplingParams", "SamplingStrategy", "Step", "Timings", "Tokenizer",
    "TokenHistory", "TokenSampler", "Usage", "load_model", "make_drafter", "stream_tokens",
]
