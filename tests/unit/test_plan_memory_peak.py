"""The planner's peak of allocated memory against the live tensors of a real training step."""

import pytest
import torch

from tests.helpers import packed_batch
from tests.live_memory import LiveMemory
from tuneforge.execution.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.models.args import ModelArgs, MoEArgs
from tuneforge.models.cost import LoraShape
from tuneforge.models.decoder import Decoder
from tuneforge.packed import PackedSequences
from tuneforge.peft.apply import apply_lora
from tuneforge.plan.memory import Setup, predict_memory
from tuneforge.train.objectives.sft import NextTokenObjective

DENSE = ModelArgs(vocab_size=4096, dim=256, num_layers=4, num_heads=8, num_kv_heads=4, ffn_dim=768)
MOE = ModelArgs(
    vocab_size=4096, dim=256, num_layers=4, num_heads=8, num_kv_heads=4, ffn_dim=768,
    qk_norm=True, moe=MoEArgs(8, 2, 128), family="qwen3_moe",
)  # fmt: skip
TOKENS = 1024
CASES = {
    "full": (DENSE, None, "none", 1),
    "full-checkpointed": (DENSE, None, "full", 1),
    "full-accumulating": (DENSE, None, "none", 2),
    "lora": (DENSE, LoraShape(16), "none", 1),
    "lora-checkpointed": (DENSE, LoraShape(16), "full", 1),
    "moe-lora-experts-checkpointed": (
        MOE,
        LoraShape(16, ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_up_proj", "down_proj")),
        "full",
        1,
    ),
}


def measured_peak(args, lora, checkpointing, micro_batches) -> int:
    torch.manual_seed(0)
    model = Decoder(args, "sdpa")  # fp32: bf16 matmuls are slow on CPUs
    model.init_weights(0.02, torch.Generator().manual_seed(0))
    if lora is not None:
        targets = [*lora.targets, *(f"experts.{name}" for name in lora.experts)]
        apply_lora(model, {"target_modules": targets, "rank": lora.rank}, None, torch.float32)
    wrap_blocks(model, BlockWrapping(checkpointing))
    objective = NextTokenObjective(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, foreach=False)
    tokens = torch.randint(
        0, args.vocab_size, (TOKENS,), generator=torch.Generator().manual_seed(1)
    )
    packed = PackedSequences.from_lengths([TOKENS // 2, TOKENS // 2])

    def step():
        for _ in range(micro_batches):
            loss_sum, aux, *_ = objective(packed_batch(tokens, tokens, packed))
            (loss_sum / TOKENS + 0.001 * aux).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # creates the optimizer states
    state = [t for s in optimizer.state.values() for t in s.values() if t.numel() > 1]
    with LiveMemory(*model.parameters(), *state) as memory:
        step()
    return memory.peak


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_planned_peak_matches_a_real_step(case):
    args, lora, checkpointing, micro_batches = CASES[case]
    setup = Setup(
        args, 4, TOKENS, lora, checkpointing, mean_doc_len=TOKENS / 2,
        grad_accum_steps=micro_batches,
    )  # fmt: skip
    predicted = predict_memory(setup).allocated
    assert predicted == pytest.approx(
        measured_peak(args, lora, checkpointing, micro_batches), rel=0.1
    )
