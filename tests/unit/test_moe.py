import pytest
import torch

from tuneforge.models.args import MoEArgs
from tuneforge.models.moe import MoE


def moe_pair(norm_topk_prob: bool):
    args = MoEArgs(num_experts=6, top_k=2, expert_ffn_dim=12, norm_topk_prob=norm_topk_prob)
    grouped, loop = MoE(16, args, "grouped"), MoE(16, args, "loop")
    generator = torch.Generator().manual_seed(0)
    for param in grouped.parameters():
        with torch.no_grad():
            param.normal_(0, 0.3, generator=generator)
    loop.load_state_dict(grouped.state_dict())
    return grouped, loop


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_grouped_gemm_experts_equal_the_per_expert_loop(norm_topk_prob):
    grouped, loop = moe_pair(norm_topk_prob)
    x = torch.randn(37, 16, generator=torch.Generator().manual_seed(1))
    x_grouped, x_loop = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_grouped, out_loop = grouped(x_grouped), loop(x_loop)
    torch.testing.assert_close(out_grouped, out_loop)
    out_grouped.square().sum().backward()
    out_loop.square().sum().backward()
    torch.testing.assert_close(x_grouped.grad, x_loop.grad)
    for (name, a), b in zip(grouped.named_parameters(), loop.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_an_expert_without_tokens_is_fine():
    grouped, loop = moe_pair(True)
    with torch.no_grad():
        grouped.router.weight[0] = -100.0  # expert 0 never chosen
        loop.router.weight[0] = -100.0
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(grouped(x), loop(x))


def test_grouped_experts_route_without_atomic_adds():
    """Dispatch and combine gather rows back instead of index_add (atomic, and rounding after
    every add in bf16) over full-width rows, in forward and backward; only the routing weights'
    gradient (one number per routed copy) is scattered."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            widths = [a.shape[-1] for a in args if isinstance(a, torch.Tensor) and a.dim() == 2]
            self.calls.append((func.overloadpacket.__name__, max(widths, default=1)))
            return func(*args, **(kwargs or {}))

    grouped, _ = moe_pair(True)
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(3), requires_grad=True)
    with Ops() as ops:
        grouped(x).square().sum().backward()
    assert ("index_select", 16) in ops.calls
    atomic = {"index_add", "index_add_", "index_put", "index_put_"}
    assert [call for call in ops.calls if call[0] in atomic and call[1] > 1] == []


def test_expert_offsets_count_the_rows_of_each_expert():
    from tuneforge.models.moe import expert_offsets

    ids = torch.tensor([[4, 1], [1, 0], [4, 1], [0, 4]]).reshape(-1)  # experts 2, 3, 5 unused
    got = expert_offsets(torch.sort(ids).values, 6)
    expected = torch.cumsum(torch.bincount(ids, minlength=6), 0)
    assert got.dtype == torch.int32 and got.tolist() == expected.tolist() == [2, 5, 5, 5, 8, 8]


def test_grouped_experts_compile_to_one_graph():
    """No operator whose output size depends on the data (such as `bincount`) in the routing:
    it would split the compiled block and make the host wait for the device every layer."""
    args = MoEArgs(num_experts=6, top_k=2, expert_ffn_dim=32)  # 16-byte aligned rows
    grouped = MoE(16, args, "grouped").bfloat16()
    for param in grouped.parameters():
        torch.nn.init.normal_(param, std=0.3)
    x = torch.randn(24, 16, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(4))
    explained = torch._dynamo.explain(grouped)(x)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


def test_fp32_experts_compile_on_the_cpu_and_equal_eager():
    """The grouped GEMM's compiled shape check takes bf16 only: fp32 experts compile through the
    per-expert products instead of failing (Mixtral, DeepSeek-V2 and Qwen3-MoE on a CPU)."""
    grouped, _ = moe_pair(norm_topk_prob=True)
    x = torch.randn(24, 16, generator=torch.Generator().manual_seed(4))
    torch._dynamo.reset()
    compiled = torch.compile(grouped)(x)
    torch.testing.assert_close(compiled, grouped(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weighted", [False, True])
def test_gather_sum_adds_each_tokens_rows_with_their_weights(weighted):
    from tuneforge.models.gather_sum import gather_sum

    generator = torch.Generator().manual_seed(5)
    tokens, top_k = 7, 3
    rows = torch.randn(tokens * top_k, 10, generator=generator)
    index = torch.randperm(tokens * top_k, generator=generator)
    weights = torch.rand(tokens, top_k, generator=generator) if weighted else None
    expected = torch.zeros(tokens, 10)
    for token in range(tokens):
        for slot in range(top_k):
            scale = weights[token, slot] if weighted else 1.0
            expected[token] += scale * rows[index[token * top_k + slot]]
    torch.testing.assert_close(gather_sum(rows, index, weights, top_k), expected)
