"""Causal attention over packed documents: no token attends across a document boundary.

Backends, all taking q [T, H, D] and k, v [T, H_kv, D]:
- `flash4`: FlashAttention-4's kernels for Hopper and Blackwell (`flash-attn-4`, optional), GQA native;
- `varlen`: flash kernels through `torch.nn.attention.varlen.varlen_attn` (CUDA), GQA native;
- `sdpa`: `scaled_dot_product_attention` once per document;
- `sdpa_padded`: the same over documents padded into one batch per length class, a few calls per
  layer instead of one per document (on a GPU, for fp32 and the head sizes flash refuses);
- `cudnn`: `sdpa` through cuDNN's fused attention kernels (CUDA);
- `eager`: the explicit softmax(q kᵀ / √d) v per document, the reference.
"""

import inspect
import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tuneforge.models import flash4
from tuneforge.models.errors import ModelError
from tuneforge.packed import PackedSequences

log = logging.getLogger(__name__)

AttentionFn = Callable[..., torch.Tensor]
"""(q, k, v, packed, window=None, scale=None) -> out [T, H, D_v]: `window`, attend to the last
W positions; `scale`, the softmax's (1/√D by default); v may be narrower than q and k."""


def visible(length: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[L, L] bool: query i sees key j when j ≤ i (and i - j < `window`)."""
    positions = torch.arange(length, device=device)
    distance = positions[:, None] - positions[None, :]
    mask = distance >= 0
    return mask if window is None else mask & (distance < window)


def padded_sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: PackedSequences,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Documents of similar length (the same power of two) padded into one batch per length
    class, each batch one `scaled_dot_product_attention` call with a causal mask that also
    hides the padding: a handful of calls per layer instead of one per document."""
    lengths = packed.lengths()
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # the masked kernels of every dtype take K/V at the queries' head count
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    starts = [0, *itertools.accumulate(lengths)][:-1]
    classes: dict[int, list[int]] = {}
    for document, length in enumerate(lengths):
        if length:
            classes.setdefault(1 << (length - 1).bit_length(), []).append(document)
    for width, documents in classes.items():
        start = torch.tensor([starts[d] for d in documents], device=q.device)
        ends = torch.tensor([lengths[d] for d in documents], device=q.device)[:, None]
        position = torch.arange(width, device=q.device)
        # padding repeats a document's last token: its rows are dropped, its keys hidden
        index = start[:, None] + torch.minimum(position[None, :], ends - 1)
        real = position[None, :] < ends
        mask = visible(width, window, q.device)[None] & real[:, None, :]
        qd, kd, vd = (t[index].transpose(1, 2) for t in (q, k, v))  # [B, H, W, D]
        od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask[:, None], scale=scale)
        out[index[real]] = od.transpose(1, 2)[real]
    return out


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: PackedSequences,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    lengths = packed.lengths()
    outputs = []
    for qd, kd, vd in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True):
        # [T, H, D] -> [1, H, T, D]
        qd, kd, vd = (t.transpose(0, 1).unsqueeze(0) for t in (qd, kd, vd))
        gqa = kd.shape[1] != qd.shape[1]
        length = qd.shape[2]
        if window is None or window >= length:
            od = F.scaled_dot_product_attention(
                qd, kd, vd, is_causal=True, enable_gqa=gqa, scale=scale
            )
        else:
            mask = visible(length, window, q.device)
            od = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=mask, enable_gqa=gqa, scale=scale
            )
        outputs.append(od.squeeze(0).transpose(0, 1))
    return torch.cat(outputs)


def cudnn_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: PackedSequences,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # cuDNN first, SDPA's other kernels where it refuses (it takes no one-token document)
    preferred = [
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    ]
    with sdpa_kernel(preferred, set_priority=True):  # cuDNN takes causal masks, not others
        return sdpa_attention(q, k, v, packed, window, scale)


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: PackedSequences,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    outputs = []
    lengths = packed.lengths()
    for qd, kd, vd in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True):
        qd = qd.transpose(0, 1)
        kd = kd.transpose(0, 1).repeat_interleave(groups, dim=0)
        vd = vd.transpose(0, 1).repeat_interleave(groups, dim=0)
        factor = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
        scores = qd.float() @ kd.float().transpose(-1, -2) * factor
        scores = scores.masked_fill(~visible(len(qd[0]), window, q.device), float("-inf"))
        outputs.append((scores.softmax(-1) @ vd.float()).to(q.dtype).transpose(0, 1))
    return torch.cat(outputs)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: PackedSequences,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    # flash's window counts the keys left of the query: W - 1 of them and itself
    kwargs: dict[str, Any] = {"window_size": (-1 if window is None else window - 1, 0)}
    if k.shape[1] != q.shape[1] and "enable_gqa" in _varlen_parameters():
        kwargs["enable_gqa"] = True
    if scale is not None and "scale" in _varlen_parameters():
        kwargs["scale"] = scale
    elif scale is not None:  # an older torch: the queries carry the scale instead
        q = q * (scale * math.sqrt(q.shape[-1]))
    width = v.shape[-1]
    if width != q.shape[-1]:  # the flash kernels take one head width: v padded with zeros
        v = F.pad(v, (0, q.shape[-1] - width))
    cu = packed.cu_seqlens
    out = varlen_attn(q, k, v, cu, cu, packed.max_seqlen, packed.max_seqlen, **kwargs)
    assert isinstance(out, torch.Tensor)  # no auxiliary outputs were asked for
    return out[..., :width]


def _varlen_parameters() -> set[str]:
    from torch.nn.attention.varlen import varlen_attn

    return set(inspect.signature(varlen_attn).parameters)


def flash4_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: PackedSequences,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    assert window is None and scale is None, "resolve_backend keeps these models off flash4"
    return flash4.flash4_forward(q, k, v, packed.cu_seqlens, packed.max_seqlen)[0]


BACKENDS: dict[str, AttentionFn] = {
    "flash4": flash4_attention,
    "varlen": varlen_attention,
    "sdpa": sdpa_attention,
    "sdpa_padded": padded_sdpa_attention,
    "cudnn": cudnn_attention,
    "eager": eager_attention,
}


def varlen_available(device: torch.device) -> bool:
    """True when flash varlen attention runs here (a CUDA build with the op; ROCm may lack it)."""
    if device.type != "cuda":
        return False
    try:
        q = torch.zeros(4, 1, 64, device=device, dtype=torch.bfloat16)
        packed = PackedSequences.from_lengths([4], device)
        varlen_attention(q, q, q, packed)
    except Exception as error:  # any failure means: do not use it
        log.debug("varlen attention unavailable: %s", error)
        return False
    return True


FLASH_DTYPES = (torch.bfloat16, torch.float16)
FLASH_MAX_HEAD_DIM = 256


def resolve_backend(
    name: str,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    head_dim: int = 128,
    plain: bool = True,
) -> str:
    """The backend that will run: `auto` becomes `flash4` where its package is installed and the
    GPU, dtype and head size are ones it takes (and the model's attention is `plain`: no
    sliding window, no latent attention), else `varlen` where that works, else `sdpa_padded`
    on a GPU (fp32, head sizes flash refuses) and `sdpa` on the CPU. `flash4`
    asked for where it cannot run is an error, not a silent fallback."""
    flash_ok = dtype in FLASH_DTYPES and head_dim <= FLASH_MAX_HEAD_DIM
    if name == "flash4" and not plain:
        raise ModelError(
            "attention 'flash4' runs plain causal attention here, not sliding-window or latent "
            "attention: set model.attention to auto (flash varlen attention takes them)"
        )
    if name == "flash4" and not (flash4.available(device) and flash_ok):
        raise ModelError(
            "attention 'flash4' needs the flash-attn-4 package, a CUDA GPU of compute "
            "capability 9.x or 10.x (Hopper, Blackwell) and bfloat16 or float16 weights; install "
            "it (pip install flash-attn-4) or set model.attention to auto"
        )
    if name == "cudnn" and (device.type != "cuda" or not plain):
        raise ModelError(
            "attention 'cudnn' runs plain causal attention through cuDNN's fused kernels on a "
            "CUDA GPU (no sliding window, no latent attention); set model.attention to auto"
        )
    if name != "auto":
        return name
    if not flash_ok:  # one call per document would leave a GPU waiting on the host
        return "sdpa_padded" if device.type == "cuda" else "sdpa"
    if flash4.available(device) and flash4.supports(head_dim, device) and plain:
        return "flash4"
    return "varlen" if varlen_available(device) else "sdpa"
