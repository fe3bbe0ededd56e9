"""The fast paths against their reference paths on the GPU, in bf16: the fused LoRA linear (q, k
and v over their stacked weights), the loss's fused gradients, and a short training run with
them against one with none."""

import pytest
import torch

from tests.helpers import packed_batch, packed_training_losses
from tuneforge.execution.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.models.api import load_model
from tuneforge.packed import PackedSequences
from tuneforge.peft.apply import apply_lora, lora_modules
from tuneforge.peft.stacked_weights import stack_frozen_weights
from tuneforge.train.loss import chunked_cross_entropy
from tuneforge.train.objectives.sft import NextTokenObjective


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_cross_entropy_matches_the_checkpointed_path_on_the_gpu(compiled):
    """The fused loss (eager in place, or compiled), its rows picked by the host's count of
    supervised labels, against the checkpointed reference counting them on the device."""
    from tuneforge.data.packing import IGNORE_INDEX

    generator = torch.Generator("cuda").manual_seed(0)
    hidden = torch.randn(3000, 256, device="cuda", generator=generator).bfloat16()
    weight = (0.05 * torch.randn(32000, 256, device="cuda", generator=generator)).bfloat16()
    labels = torch.randint(0, 32000, (3000,), device="cuda", generator=generator)
    labels[::7] = IGNORE_INDEX
    count = int((labels != IGNORE_INDEX).sum())
    results = []
    for fused in (True, False):
        x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        known = count if fused else None
        total, _ = chunked_cross_entropy(x, w, labels, 1024, fused, compiled, known)
        (total / count).backward()
        results.append((total, x.grad.float(), w.grad.float()))
    (total, gx, gw), (ref_total, ref_gx, ref_gw) = results
    assert total.item() == pytest.approx(ref_total.item(), rel=1e-4)
    assert ((gx - ref_gx).norm() / ref_gx.norm()).item() < 1e-2
    assert ((gw - ref_gw).norm() / ref_gw.norm()).item() < 1e-2


def losses(fast: bool, compiled: bool, attention: str, steps: int = 30) -> list[float]:
    torch.manual_seed(0)
    model = load_model(
        "llama-3.2-1b", num_layers=2, dtype="bfloat16", device="cuda", seed=0, attention=attention
    )
    lora = {"target_modules": ["all-linear"], "rank": 16, "alpha": 32}
    apply_lora(model, lora, torch.Generator("cuda").manual_seed(1), torch.float32)
    for module in lora_modules(model).values():
        module.fused = fast
    if compiled:
        wrap_blocks(model, BlockWrapping(compile=True))
    if fast:
        assert stack_frozen_weights(model) == 2
    objective = NextTokenObjective(model, compiled_loss=compiled)
    objective.fused_loss = fast
    params = [p for p in model.parameters() if p.requires_grad]
    return packed_training_losses(objective, params, 2e-3, steps)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_short_bf16_run_follows_the_reference_path(compiled):
    """The fast path with the attention `auto` picks (FlashAttention-4 where installed) against
    the reference path with PyTorch's own flash kernels: within 2%, and where the loss falls
    steeply, within half of that step's fall as well (bf16 runs drift by a fraction of a step:
    the reference path alone moved 1.6% at such a step when only its attention kernel changed)."""
    fast, reference = losses(True, compiled, "auto"), losses(False, False, "varlen")
    assert reference[-1] < reference[0] - 1.0  # it learns
    for step, (got, expected) in enumerate(zip(fast, reference, strict=True)):
        fall = reference[step - 1] - expected if step else 0.0
        assert abs(got - expected) <= 0.02 * expected + 0.5 * max(fall, 0.0), step


def checkpointed_step(
    offload: bool, compiled: bool, checkpointing: str = "full", offload_activations: int = 0
) -> tuple[int, dict[str, torch.Tensor]]:
    """Memory held between forward and backward, and the adapters' gradients, of one step of a
    4-layer Llama-3.2-1B-shaped LoRA model with every block checkpointed (by default)."""
    torch.manual_seed(0)
    model = load_model("llama-3.2-1b", num_layers=4, dtype="bfloat16", device="cuda", seed=0)
    lora = {"target_modules": ["all-linear"], "rank": 16, "alpha": 32}
    apply_lora(model, lora, torch.Generator("cuda").manual_seed(1), torch.float32)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.02, generator=torch.Generator("cuda").manual_seed(3))
    wrapping = BlockWrapping(
        checkpointing, compile=compiled, offload=offload, offload_activations=offload_activations
    )
    wrap_blocks(model, wrapping)
    objective = NextTokenObjective(model)
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 2000, (4096,), generator=generator).cuda()
    packed = PackedSequences.from_lengths([1000, 3096], "cuda")
    for _ in range(2):  # the second step's numbers: compilation and the host pool settled
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        loss_sum = objective(packed_batch(tokens, tokens.roll(-1), packed)).loss_sum
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before
        (loss_sum / tokens.numel()).backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    return held, grads


@pytest.mark.parametrize("compiled", [False, True])
def test_offloaded_checkpointing_frees_the_block_inputs(compiled):
    plain_held, expected = checkpointed_step(False, compiled)
    held, got = checkpointed_step(True, compiled)
    inputs = 4 * 4096 * 2048 * 2  # four blocks' [tokens, dim] bf16 inputs
    assert plain_held - held == pytest.approx(inputs, rel=0.05)
    assert set(got) == set(expected) and len(got) == 4 * 7 * 2
    # bf16 gradients four layers down: measured 1.1% apart on the first layer's adapters
    # (flash attention's backward accumulates with atomics, so reruns differ too)
    for name in expected:
        error = (got[name] - expected[name]).norm() / expected[name].norm()
        assert error.item() < 3e-2, name


@pytest.mark.parametrize("compiled", [False, True])
def test_offloaded_activations_leave_the_gpu_and_come_back_equal(compiled):
    """Blocks whose saved activations wait in host memory hold nothing on the GPU between
    forward and backward (like offloaded checkpoints, without the recomputation) and give the
    same gradients."""
    kept_held, expected = checkpointed_step(False, compiled, "none")
    checkpoint_held, _ = checkpointed_step(True, compiled)
    held, got = checkpointed_step(False, compiled, "none", offload_activations=4)
    # what the blocks would keep, less what stays (tensors under 1 MiB: adapter ranks, row norms)
    blocks = kept_held - checkpoint_held
    assert blocks > 4 * 50 * 2**20, blocks
    assert held - checkpoint_held < 0.05 * blocks, (held, checkpoint_held, kept_held)
    assert set(got) == set(expected) and len(got) == 4 * 7 * 2
    for name in expected:
        error = (got[name] - expected[name]).norm() / expected[name].norm()
        assert error.item() < 3e-2, name
