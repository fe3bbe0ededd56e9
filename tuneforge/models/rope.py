"""Rotary position embeddings, with Llama 3.1 frequency scaling."""

import math

import torch
from torch import nn

from tuneforge.models.args import RopeScaling


def inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None, device=None
) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
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


class RotaryEmbedding(nn.Module):
    """Rotary angles; frequencies are recomputed in fp32 each call (no buffer to lose precision
    when the model is cast, nothing to re-fill after meta-device init)."""

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None = None) -> None:
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
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x_THD: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor) -> torch.Tensor:
    half = x_THD.shape[-1] // 2
    rotated = torch.cat([-x_THD[..., half:], x_THD[..., :half]], dim=-1)
    return x_THD * cos_TD[:, None, :] + rotated * sin_TD[:, None, :]
