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
