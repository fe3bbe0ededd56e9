"""Where does a QLoRA product's time go on one GPU? One Llama-3-8B layer's seven projections at
4,096 tokens, LoRA r16 over a 4-bit NF4 base (double-quantised): the dequantisation alone
(bitsandbytes into bf16; ours into E4M3, both layouts) and each product's forward and backward,
bf16 against FP8, back to back. `python bench/qlora_probe.py`."""

import torch
from torch import nn

from tuneforge.peft.lora import LoRALinear
from tuneforge.precision.bnb4bit import Bnb4bitLinear
from tuneforge.precision.four_bit_fp8 import fp8_weight
from tuneforge.precision.fp8 import Fp8Recipe

TOKENS, DIM, FFN, KV = 4096, 4096, 14336, 1024
SHAPES = {"q": (DIM, DIM), "k": (KV, DIM), "v": (KV, DIM), "o": (DIM, DIM),
          "gate": (FFN, DIM), "up": (FFN, DIM), "down": (DIM, FFN)}  # fmt: skip


def per_call_ms(fn, repeats: int = 20) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    torch.manual_seed(0)
    layers = {}
    for name, (out, inp) in SHAPES.items():
        linear = nn.Linear(inp, out, bias=False, device="cuda", dtype=torch.bfloat16)
        layer = LoRALinear(linear, rank=16, alpha=32, dtype=torch.float32)
        layer.base = Bnb4bitLinear(linear, "nf4", True)
        layers[name] = layer
    four_bit = layers["gate"].base
    four_bit.compute_in_fp8(Fp8Recipe())
    held, layout = four_bit._held()[:5], four_bit.layout
    values, multiplier = four_bit.code_values, four_bit.fp8_multiplier
    print(f"gate [{FFN}, {DIM}] dequantised: bitsandbytes into bf16 "
          f"{per_call_ms(lambda: four_bit.dequantized(torch.bfloat16)):.3f} ms, ours into E4M3 "
          f"{per_call_ms(lambda: fp8_weight(held, layout, values, multiplier, False)):.3f} ms, "
          f"transposed {per_call_ms(lambda: fp8_weight(held, layout, values, multiplier, True)):.3f}"
          " ms")  # fmt: skip
    four_bit.fp8 = None
    for products in ("bf16", "fp8"):
        total = 0.0
        for name, layer in layers.items():
            if products == "fp8":
                layer.base.compute_in_fp8(Fp8Recipe())
            out, inp = SHAPES[name]
            x = torch.randn(TOKENS, inp, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            grad = torch.randn(TOKENS, out, device="cuda", dtype=torch.bfloat16)
            forward = per_call_ms(lambda layer=layer, x=x: layer(x))
            both = per_call_ms(lambda layer=layer, x=x, g=grad: layer(x).backward(g))
            total += both
            print(f"{products} {name}: forward {forward:.3f} ms, with backward {both:.3f} ms")
        print(f"{products}: a layer's seven products, forward and backward: {total:.2f} ms")


if __name__ == "__main__":
    main()
