"""YaRN without the rounded correction range, for checkpoints whose config says `truncate: false`.

gpt-oss's config.json (openai/gpt-oss-20b, -120b) sets `rope_scaling.truncate` to false: the
YaRN ramp between the extrapolated and interpolated frequencies starts and ends at the exact
(fractional) correction dimensions. transformers honours the flag; mlx-lm 0.32.2's `YarnRoPE`
always rounds them (floor / ceil), which moves the logits by ~4e-3 from position 1 on. The rest
of its YaRN (the mscale on q and k, the blend of the two frequency sets) equals transformers', so
only the frequencies are recomputed here (transformers `_compute_yarn_parameters`, arXiv
2309.00071) and put into mlx-lm's modules. mlx-lm's own loader (`mlx_lm.load`) still rounds.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import YarnRoPE

from runtime.errors import InputError

YARN_TYPES = ("yarn", "deepseek_yarn")


def yarn_frequencies(
    dims: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> mx.array:
    """YaRN's per-pair wavelength divisors (the `freqs` of `mx.fast.rope`, the reciprocal of the
    inverse frequencies), mx.array [dims // 2] float32. `truncate`: round the correction range to
    whole dimensions (what mlx-lm always does)."""

    def correction_dim(rotations: float) -> float:
        return dims * math.log(original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # as both libraries do: no zero-width ramp
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    extrapolated = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    # inverse frequency: the extrapolated one below the ramp, the interpolated one (/ factor) above.
    inverse = (1 - ramp) / extrapolated + ramp / (factor * extrapolated)
    return 1.0 / inverse


def apply_untruncated_yarn(network: nn.Module, config: dict) -> int:
    """Recompute the frequencies of every mlx-lm `YarnRoPE` in `network` without rounding when
    `config["rope_scaling"]` is YaRN with `truncate: false`; the rope base is `config["rope_theta"]`
    (every YaRN family in mlx-lm builds its rope from it). Returns the number of modules changed
    (0 when the config asks for the rounded range, or has no YaRN). Raises ValueError when the
    config has no rope_theta."""
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("type") or scaling.get("rope_type")
    if kind not in YARN_TYPES or scaling.get("truncate", True) is not False:
        return 0
    base = config.get("rope_theta", scaling.get("rope_theta"))
    if base is None:
        raise InputError("rope_scaling is YaRN with truncate false, but the config has no rope_theta")
    changed = 0
    for _, module in network.named_modules():
        if isinstance(module, YarnRoPE):
            module._freqs = yarn_frequencies(
                module.dims,
                base,
                scaling["factor"],
                scaling.get("original_max_position_embeddings", 4096),
                scaling.get("beta_fast", 32.0),
                scaling.get("beta_slow", 1.0),
                truncate=False,
            )
            changed += 1
    return changed
