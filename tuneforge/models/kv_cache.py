"""Key/value cache for generation: one slab per layer, a row per sequence.

New tokens of each sequence (a packed batch: a whole prompt at prefill, one token per sequence
when decoding) are written after the sequence's cached ones and attend to everything before them.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tuneforge.packed import PackedSequences


@dataclass
class LayerCache:
    keys: torch.Tensor
    """[batch, kv_heads, capacity, head_dim]"""
    values: torch.Tensor
    lengths: torch.Tensor
    """[batch] tokens cached before this forward (shared with the other layers)."""

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        packed: PackedSequences,
        window: int | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Store k/v of the new tokens and attend the new queries [T, H, D] to their sequence
        (its last `window` positions only, where given; `scale`: the softmax's)."""
        if packed.max_seqlen == 1 and q.shape[0] == self.keys.shape[0]:
            # one new token for every row: decided on the host's shapes, no wait for the device
            return self._decode_step(q, k, v, window, scale)
        new = packed.lengths()
        out = []
        starts = packed.cu_seqlens.tolist()
        for row, (start, count) in enumerate(zip(starts[:-1], new, strict=True)):
            cached = int(self.lengths[row])
            self.keys[row, :, cached : cached + count] = k[start : start + count].transpose(0, 1)
            self.values[row, :, cached : cached + count] = v[start : start + count].transpose(0, 1)
            total = cached + count
            query_positions = torch.arange(cached, total, device=q.device)
            distance = query_positions[:, None] - torch.arange(total, device=q.device)[None, :]
            mask = (distance >= 0) if window is None else (distance >= 0) & (distance < window)
            attended = F.scaled_dot_product_attention(
                q[start : start + count].transpose(0, 1)[None],
                self.keys[row : row + 1, :, :total],
                self.values[row : row + 1, :, :total],
                attn_mask=mask,
                enable_gqa=q.shape[1] != k.shape[1],
                scale=scale,
            )
            out.append(attended[0].transpose(0, 1))
        return torch.cat(out)

    def _decode_step(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        window: int | None,
        scale: float | None,
    ) -> torch.Tensor:
        rows = torch.arange(q.shape[0], device=q.device)
        self.keys[rows, :, self.lengths] = k
        self.values[rows, :, self.lengths] = v
        distance = self.lengths[:, None] - torch.arange(self.keys.shape[2], device=q.device)
        visible = distance >= 0
        if window is not None:
            visible &= distance < window
        attended = F.scaled_dot_product_attention(
            q[:, :, None, :],  # [B, H, 1, D]
            self.keys,
            self.values,
            attn_mask=visible[:, None, None, :],
            enable_gqa=q.shape[1] != k.shape[1],
            scale=scale,
        )
        return attended[:, :, 0, :]


class KVCache:
    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype,
        device,
        value_dim: int | None = None,
    ) -> None:
        """`value_dim`: the values' width where it is not the keys' (latent attention)."""
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        shape = (batch, kv_heads, capacity, head_dim)
        values = (batch, kv_heads, capacity, value_dim or head_dim)
        self.layers = [
            LayerCache(
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(values, dtype=dtype, device=device),
                self.lengths,
            )
            for _ in range(num_layers)
        ]

    def repeat_rows(self, copies: int) -> "KVCache":
        """A cache whose rows are each of these rows `copies` times, one after another (a
        prompt's cache shared by the completions sampled from it)."""
        repeated = KVCache.__new__(KVCache)
        repeated.lengths = self.lengths.repeat_interleave(copies)
        repeated.layers = [
            LayerCache(
                layer.keys.repeat_interleave(copies, dim=0),
                layer.values.repeat_interleave(copies, dim=0),
                repeated.lengths,
            )
            for layer in self.layers
        ]
        return repeated

    def advance(self, packed: PackedSequences) -> None:
        """After a forward: every sequence holds its new tokens too."""
        self.lengths += packed.cu_seqlens[1:].long() - packed.cu_seqlens[:-1].long()
