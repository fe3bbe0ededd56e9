"""Each token's k rows gathered back into token order, optionally weighted, and summed:
out[t] = Σₖ w[t, k] · rows[index[t·K + k]] for K = top_k — how a MoE layer combines its experts'
outputs, and the transpose of sending each token to its K experts.

On CUDA one Triton kernel reads each token's k rows once, sums in fp32 and writes once;
elsewhere (or without Triton) `index_select` and a sum. It is an opaque operator: Inductor's own
fused gather-and-sum is slower than the gather alone (`bench/moe_probe.py` measures both)."""

import functools

import torch

OPERATORS = torch.library.Library("tuneforge", "FRAGMENT")
OPERATORS.define("gather_sum(Tensor rows, Tensor index, Tensor? weights, int top_k) -> Tensor")


def _gather_sum(
    rows: torch.Tensor, index: torch.Tensor, weights: torch.Tensor | None, top_k: int
) -> torch.Tensor:
    gathered = rows.index_select(0, index).view(-1, top_k, rows.shape[-1])
    if weights is not None:
        gathered = gathered * weights.reshape(-1, top_k, 1).to(rows.dtype)
    return gathered.sum(1)


@functools.cache
def _triton_kernel():
    """The kernel, or None where Triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def gather_sum_kernel(
        rows,
        index,
        weights,
        out,
        dim,
        top_k: tl.constexpr,
        weighted: tl.constexpr,
        block: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * block + tl.arange(0, block)
        mask = cols < dim
        total = tl.zeros([block], dtype=tl.float32)
        for slot in tl.static_range(top_k):
            row = tl.load(index + token * top_k + slot).to(tl.int64)
            value = tl.load(rows + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
            if weighted:
                value = value * tl.load(weights + token * top_k + slot).to(tl.float32)
            total += value
        tl.store(out + token * dim + cols, total.to(out.dtype.element_ty), mask=mask)

    return gather_sum_kernel


def _gather_sum_cuda(
    rows: torch.Tensor, index: torch.Tensor, weights: torch.Tensor | None, top_k: int
) -> torch.Tensor:
    kernel = _triton_kernel()
    if kernel is None:
        return _gather_sum(rows, index, weights, top_k)
    rows, index = rows.contiguous(), index.contiguous()
    tokens, dim = index.numel() // top_k, rows.shape[1]
    out = rows.new_empty(tokens, dim)
    if tokens == 0:
        return out
    block = min(1024, 1 << (dim - 1).bit_length())
    grid = (tokens, -(-dim // block))
    scale = rows if weights is None else weights.contiguous()
    kernel[grid](rows, index, scale, out, dim, top_k, weights is not None, block)
    return out


OPERATORS.impl("gather_sum", _gather_sum, "CompositeExplicitAutograd")
OPERATORS.impl("gather_sum", _gather_sum_cuda, "CUDA")


@torch.library.register_fake("tuneforge::gather_sum")
def _(rows, index, weights, top_k):
    return rows.new_empty(index.shape[0] // top_k, rows.shape[1])


gather_sum = torch.ops.tuneforge.gather_sum.default
