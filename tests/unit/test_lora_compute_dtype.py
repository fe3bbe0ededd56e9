"""Adapters computing in the model's dtype (bf16) against the fp32 reference path."""

import pytest
import torch

from tests.helpers import packed_batch
from tuneforge.models.args import ModelArgs, MoEArgs
from tuneforge.models.decoder import Decoder
from tuneforge.packed import PackedSequences
from tuneforge.peft.apply import apply_lora
from tuneforge.train.objectives.sft import NextTokenObjective

DENSE = ModelArgs(vocab_size=96, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=128)
MOE = ModelArgs(
    vocab_size=96, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=128,
    qk_norm=True, moe=MoEArgs(4, 2, 32), family="qwen3_moe",
)  # fmt: skip
# (shape, targets). Attention and expert adapters are checked apart: together in this tiny
# model, bf16 rounding flips near-tied routing decisions, which changes which experts learn.
CASES = {
    "dense": (DENSE, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "moe-attention": (MOE, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    "moe-experts": (MOE, ["experts.gate_up_proj", "experts.down_proj"]),
}


def loss_and_adapter_gradients(args, targets, compute_dtype):
    torch.manual_seed(0)
    model = Decoder(args, "sdpa")
    model.init_weights(0.05, torch.Generator().manual_seed(0))
    model.to(torch.bfloat16)
    lora = {"target_modules": targets, "rank": 8, "compute_dtype": compute_dtype}
    apply_lora(model, lora, torch.Generator().manual_seed(1), torch.float32)
    for name, param in model.named_parameters():  # B starts at zero: give the update a value
        if name.endswith("lora_B"):
            param.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(2))
    tokens = torch.randint(0, args.vocab_size, (48,), generator=torch.Generator().manual_seed(3))
    batch = packed_batch(tokens, tokens, PackedSequences.from_lengths([20, 28]))
    loss_sum = NextTokenObjective(model)(batch).loss_sum
    loss_sum.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g.dtype == torch.float32 for g in grads.values())  # fp32 master adapters
    return loss_sum.item(), grads


@pytest.mark.parametrize("case", sorted(CASES))
def test_bf16_compute_matches_the_fp32_reference(case):
    args, targets = CASES[case]
    reference_loss, reference = loss_and_adapter_gradients(args, targets, "float32")
    loss, grads = loss_and_adapter_gradients(args, targets, "model")
    assert loss == pytest.approx(reference_loss, rel=1e-2)
    for name, expected in reference.items():
        relative = (grads[name] - expected).norm() / expected.norm()
        assert relative < 0.03, name
