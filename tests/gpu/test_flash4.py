"""FlashAttention-4's kernels (optional `flash-attn-4`) against the fp32 reference attention,
eager and inside a compiled graph (skipped where the package or a supported GPU is missing)."""

import pytest
import torch

from tuneforge.models import flash4
from tuneforge.models.attention import eager_attention, flash4_attention
from tuneforge.packed import PackedSequences

CUDA = torch.device("cuda")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not flash4.available(CUDA),
    reason="needs flash-attn-4 and a Hopper or Blackwell GPU",
)
LENGTHS = [100, 1, 300, 57, 512, 1000]


def inputs(kv_heads: int, head_dim: int):
    generator = torch.Generator(device=CUDA).manual_seed(0)
    total = sum(LENGTHS)

    def leaf(heads: int) -> torch.Tensor:
        shape = (total, heads, head_dim)
        t = torch.randn(shape, device=CUDA, dtype=torch.bfloat16, generator=generator)
        return t.requires_grad_()

    grad_out = torch.randn(total, 8, head_dim, device=CUDA, dtype=torch.bfloat16)
    return leaf(8), leaf(kv_heads), leaf(kv_heads), grad_out


def output_and_grads(attention, q, k, v, grad_out, packed):
    out = attention(q, k, v, packed)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_out))


@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_flash4_equals_the_reference_attention(kv_heads, head_dim):
    q, k, v, grad_out = inputs(kv_heads, head_dim)
    packed = PackedSequences.from_lengths(LENGTHS, CUDA)
    got = output_and_grads(flash4_attention, q, k, v, grad_out, packed)
    expected = output_and_grads(eager_attention, q, k, v, grad_out, packed)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        error = ((a.float() - b.float()).norm() / b.float().norm()).item()
        assert error < 1e-2, (name, error)


def test_flash4_inside_a_compiled_graph_gives_the_eager_result():
    q, k, v, grad_out = inputs(2, 128)
    packed = PackedSequences.from_lengths(LENGTHS, CUDA)

    def block(q, k, v, packed):
        return flash4_attention(q * 1.0, k, v, packed).relu()

    compiled = torch.compile(block, fullgraph=True)
    got = output_and_grads(compiled, q, k, v, grad_out, packed)
    expected = output_and_grads(block, q, k, v, grad_out, packed)
    torch.testing.assert_close(got[0], expected[0], atol=0, rtol=0)
    for a, b in zip(got[1:], expected[1:], strict=True):  # the backward adds up dq in any order
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)
