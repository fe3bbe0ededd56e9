"""Rotary position embeddings, with Llama 3.1 and YaRN frequency scaling; rotate-half pairs
(Llama, Qwen, ...) or adjacent ones (DeepSeek-V2)."""

import math

import torch
from torch import nn

from tuneforge.models.args import LinearScaling, RopeScaling, YarnScaling


def inverse_frequencies(
    head_dim: int,
    theta: float,
    scaling: RopeScaling | YarnScaling | LinearScaling | None,
    device=None,
) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if isinstance(scaling, YarnScaling):
        return _yarn(inv_freq, head_dim, theta, scaling)
    if isinstance(scaling, LinearScaling):
        return inv_freq / scaling.factor
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(inv_freq: torch.Tensor, dim: int, theta: float, yarn: YarnScaling) -> torch.Tensor:
    """YaRN (Peng et al. 2023) as transformers computes it: extrapolated (unscaled) frequencies
    above the fast boundary, interpolated (divided by the factor) below the slow one, a linear
    ramp between, the boundaries rounded outwards."""

    def boundary(rotations: float) -> float:
        wavelengths = yarn.original_max_position_embeddings / (rotations * 2 * math.pi)
        return dim * math.log(wavelengths) / (2 * math.log(theta))

    low = max(math.floor(boundary(yarn.beta_fast)), 0)
    high = float(min(math.ceil(boundary(yarn.beta_slow)), dim - 1))
    if low == high:
        high += 0.001
    # built on the frequencies' device: a host-to-device copy each step cannot be captured
    positions = torch.arange(dim // 2, dtype=torch.float32, device=inv_freq.device)
    extrapolated = 1 - ((positions - low) / (high - low)).clamp(0, 1)
    return inv_freq / yarn.factor * (1 - extrapolated) + inv_freq * extrapolated


class RotaryEmbedding(nn.Module):
    """Rotary angles; frequencies are recomputed in fp32 each call (no buffer to lose precision
    when the model is cast, nothing to re-fill after meta-device init)."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        scaling: RopeScaling | YarnScaling | LinearScaling | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.scaling = scaling

    def forward(
        self, position_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = inverse_frequencies(self.head_dim, self.theta, self.scaling, position_ids.device)
        freqs = position_ids.float()[:, None] * inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        if isinstance(self.scaling, YarnScaling):
            cos, sin = cos * self.scaling.attention_factor, sin * self.scaling.attention_factor
        return cos.to(dtype), sin.to(dtype)


def apply_rotary(x_THD: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor) -> torch.Tensor:
    half = x_THD.shape[-1] // 2
    rotated = torch.cat([-x_THD[..., half:], x_THD[..., :half]], dim=-1)
    return x_THD * cos_TD[:, None, :] + rotated * sin_TD[:, None, :]


def apply_rotary_interleaved(
    x_THD: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor
) -> torch.Tensor:
    """Rotary over adjacent pairs (2i, 2i + 1) by frequency i, as DeepSeek-V2 turns its
    rotary part (`cos_TD`, `sin_TD` as `RotaryEmbedding` gives them: each frequency twice)."""
    half = x_THD.shape[-1] // 2
    cos, sin = cos_TD[:, None, :half], sin_TD[:, None, :half]
    even, odd = x_THD[..., 0::2], x_THD[..., 1::2]
    turned = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return turned.flatten(-2)
