"""Generation whose decode steps replay a CUDA graph against the same decoding step by step
(`EagerDecode`): the same tokens, greedy and sampled, for prompts of several lengths answered
several times each, with LoRA adapters on every linear; compiled blocks are captured too."""

import pytest
import torch

import tuneforge.models.generate as generate_module
from tuneforge.execution.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.models.api import load_model
from tuneforge.models.captured_decode import CapturedDecode, EagerDecode, decode_step
from tuneforge.models.generate import generate
from tuneforge.peft.apply import apply_lora

PROMPTS = [[5, 17, 99, 3], [42] * 11, [7, 8, 9, 10, 11, 12, 13]]


def adapted_model(compiled: bool):
    torch._dynamo.reset()
    model = load_model("llama-3.2-1b", num_layers=2, dtype="bfloat16", device="cuda", seed=0)
    lora = {"target_modules": ["all-linear"], "rank": 8, "alpha": 16}
    apply_lora(model, lora, torch.Generator("cuda").manual_seed(1), torch.float32)
    for name, param in model.named_parameters():  # adapters that move the logits
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    wrap_blocks(model, BlockWrapping(compile=compiled))
    return model.eval()


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_replayed_steps_give_the_eager_steps_tokens(monkeypatch, compiled, temperature):
    model = adapted_model(compiled)
    cache = model.new_cache(4, 32)
    assert isinstance(decode_step(model, cache), CapturedDecode)  # not a silent fall-back

    def answers(step) -> list[list[int]]:
        monkeypatch.setattr(generate_module, "decode_step", step)
        generator = torch.Generator("cuda").manual_seed(3)
        return generate(model, PROMPTS, 24, {2}, temperature, generator, copies=4)

    # compiled blocks first meet each shape here: Dynamo recompiles the second shape it sees
    # with dynamic sizes, whose kernels round differently from the first, static ones
    answers(EagerDecode)
    captured = answers(decode_step)
    eager = answers(EagerDecode)
    differing = [
        (row, first_difference(a, b))
        for row, (a, b) in enumerate(zip(captured, eager, strict=True))
    ]
    assert captured == eager, [d for d in differing if d[1] is not None]
    assert all(len(reply) > 0 for reply in captured)


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
        None if a == b else min(len(a), len(b)),
    )
