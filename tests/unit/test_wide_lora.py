"""Adapters over widened frozen weights ([W | B], `WideLoRA`) against each adapter's plain
expression, which autograd differentiates."""

import copy

import pytest
import torch
from torch import nn

from tests.helpers import save_tiny_llama
from tests.unit.test_shared_input_lora import TOLERANCE, assert_close, forward_backward
from tuneforge.models.api import load_model, save_model
from tuneforge.models.decoder import project_each
from tuneforge.peft.apply import apply_lora, lora_modules, merge_lora
from tuneforge.peft.lora import LoRALinear
from tuneforge.peft.stacked_weights import stack_frozen_weights
from tuneforge.peft.wide_weights import widen_frozen_weights

SHAPES = {"q_proj": 64, "k_proj": 16, "v_proj": 16, "o_proj": 48, "gate_proj": 80, "up_proj": 80}


class Block(nn.Module):
    """The adapters of an attention and an MLP reading one input, as the decoder calls them."""

    def __init__(self, dtype, bias: bool, alphas: dict[str, float] | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        for index, (name, out) in enumerate(SHAPES.items()):
            base = nn.Linear(48, out, bias=bias and name != "o_proj").to(dtype)
            rank = 8 if index % 2 else 4
            alpha = (alphas or {}).get(name, 2 * rank)
            layer = LoRALinear(base.requires_grad_(False), rank, alpha, dtype=torch.float32)
            nn.init.normal_(layer.lora_B, std=0.1)
            setattr(self, name, layer)

    def forward(self, x):
        q, k, v = project_each(x, self.q_proj, self.k_proj, self.v_proj)
        gate, up = project_each(x, self.gate_proj, self.up_proj)
        return [q, k, v, self.o_proj(x), gate, up, self.up_proj(x)]


def run(block: Block, x: torch.Tensor, fused: bool):
    adapters = [m for m in block.modules() if isinstance(m, LoRALinear)]
    return forward_backward(adapters, x, fused, call=block)


def widened(block: Block, stack: bool, in_place: bool = False) -> Block:
    block = block if in_place else copy.deepcopy(block)
    if stack:
        assert stack_frozen_weights(block) == 1
    assert widen_frozen_weights(nn.ModuleList([block])) == 6
    assert widen_frozen_weights(nn.ModuleList([block])) == 0  # once only
    return block


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("stack", [False, True])
def test_widened_adapters_equal_each_adapter_alone(dtype, bias, stack):
    block = Block(dtype, bias, alphas={"k_proj": 3.0, "up_proj": 5.0})
    wide = widened(block, stack)
    assert wide.q_proj.wide_weight.shape == (96 if stack else 64, 48 + 4 + 8 + 4)
    x = torch.randn(2, 30, 48, dtype=dtype)
    assert_close(run(wide, x, fused=True), run(block, x, fused=False), TOLERANCE[dtype])


def test_an_input_without_gradient_still_trains_the_adapters():
    block = Block(torch.float32, bias=False)
    wide = widened(block, stack=True)
    x = torch.randn(7, 48)  # as the first block's input, from a frozen embedding
    grads = []
    for module, fused in ((wide, True), (block, False)):
        adapters = lora_modules(module).values()
        for layer in adapters:
            layer.fused = fused
        sum(y.sum() * (i + 1) for i, y in enumerate(module(x))).backward()
        grads.append([g for layer in adapters for g in (layer.lora_A.grad, layer.lora_B.grad)])
    assert_close(grads[0], grads[1], TOLERANCE[torch.float32])


def test_the_tails_follow_b_after_an_update():
    block = Block(torch.float32, bias=False)
    wide = widened(block, stack=True)
    x = torch.randn(7, 48)
    for module in (block, wide):
        with torch.no_grad():
            for layer in lora_modules(module).values():
                layer.lora_B.add_(0.5)  # as an optimizer step would
    assert_close(run(wide, x, fused=True), run(block, x, fused=False), TOLERANCE[torch.float32])


def test_a_compiled_widened_block_matches_eager_without_breaks():
    """Compiled as the trainer does: the block's forward compiled first, the tails written by
    the wrapper around it (outside the graph)."""
    block = Block(torch.float32, bias=True)
    x = torch.randn(30, 48)
    eager = run(widened(block, stack=True), x, fused=True)
    explained = widened(block, stack=True)
    inner = type(explained).forward.__get__(explained)
    explanation = torch._dynamo.explain(inner)(x.clone().requires_grad_())
    assert explanation.graph_break_count == 0
    torch._dynamo.reset()
    compiled = copy.deepcopy(block)
    compiled.forward = torch.compile(compiled.forward, fullgraph=True)
    got = run(widened(compiled, stack=True, in_place=True), x, fused=True)
    for a, b in zip(got, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_widened_model_trains_as_the_plain_one_then_merges_and_saves(tmp_path):
    save_tiny_llama(tmp_path / "base")
    lora = {"target_modules": ["all-linear"], "rank": 4, "alpha": 8}
    models, losses = [], []
    for widen in (False, True):
        model = load_model(tmp_path / "base", dtype="float32")
        apply_lora(model, lora, torch.Generator().manual_seed(0), torch.float32)
        if widen:
            stack_frozen_weights(model)
            assert widen_frozen_weights(model.layers) == 7 * model.args.num_layers
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-2)
        tokens = torch.randint(
            0, model.args.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1)
        )
        run_losses = []
        for _ in range(3):
            logits = model(tokens)
            loss = nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()
            )
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run_losses.append(loss.item())
        models.append(model)
        losses.append(run_losses)
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    plain, wide = models
    expected = plain(tokens)
    torch.testing.assert_close(wide(tokens), expected, rtol=1e-4, atol=1e-5)
    save_model(merge_lora(wide), tmp_path / "merged")
    reloaded = load_model(tmp_path / "merged", dtype="float32")
    torch.testing.assert_close(reloaded(tokens), expected, rtol=1e-4, atol=1e-4)
