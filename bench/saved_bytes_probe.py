"""What one decoder block keeps for backward, per token, as autograd sees it (its saved tensors'
storages, weights excluded), beside the planner's count (`plan.memory.kept_bytes_per_token`);
and the host link's rate with pinned memory, each way and both at once.

On the GPU machine:   python bench/saved_bytes_probe.py [MODEL] [TOKENS]
The host link alone:  python bench/saved_bytes_probe.py link
"""

import sys
import time

import torch

from tuneforge.models.catalog import catalog_shape
from tuneforge.models.cost import LoraShape, compiled_activation_bytes_per_token
from tuneforge.models.decoder import Decoder
from tuneforge.packed import PackedSequences
from tuneforge.peft.apply import apply_lora

DEVICE = torch.device("cuda")


def saved_bytes_per_token(args, base: str, budget: float | None, attention: str, tokens: int):
    from dataclasses import replace

    from tuneforge.execution.block_wrappers import compiled
    from tuneforge.precision.converters import FourBitBase

    args = replace(args, num_layers=1)
    model = Decoder(args, attention).to(DEVICE, torch.bfloat16)
    targets = list(LoraShape(16).targets)
    apply_lora(model, {"rank": 16, "alpha": 32, "target_modules": targets}, None, torch.float32)
    if base == "nf4":
        FourBitBase("nf4", True).convert(model)
    held = [*model.parameters(), *model.buffers()]
    excluded = {t.untyped_storage().data_ptr() for t in held}
    block = model.layers[0]
    if budget is not None:
        torch._dynamo.reset()
        block.forward = compiled(block.forward, budget)

    def saved(count: int) -> int:
        rope = tuple(
            torch.ones(count, args.rotary_dim, dtype=torch.bfloat16, device=DEVICE)
            for _ in range(2)
        )
        skip = excluded | {t.untyped_storage().data_ptr() for t in rope}
        storages: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in skip:
                storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        x = torch.randn(count, args.dim, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
        packed = PackedSequences.from_lengths([count]).to(DEVICE)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            block(x, rope, packed)
        return sum(storages.values())

    saved(tokens)  # compiles
    return (saved(2 * tokens) - saved(tokens)) / tokens


def link_gbps(gib: float = 1.0, repeats: int = 5) -> dict[str, float]:
    count = int(gib * 2**30)
    device = torch.empty(count, dtype=torch.uint8, device=DEVICE)
    host = torch.empty(count, dtype=torch.uint8, pin_memory=True)
    device_2 = torch.empty_like(device)
    host_2 = torch.empty(count, dtype=torch.uint8, pin_memory=True)  # empty_like does not pin
    side = torch.cuda.Stream()

    def timed(run) -> float:
        run()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        torch.cuda.synchronize()
        return count * repeats / (time.perf_counter() - start) / 1e9

    def both():
        host.copy_(device, non_blocking=True)
        with torch.cuda.stream(side):
            device_2.copy_(host_2, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)

    return {
        "to_host": timed(lambda: host.copy_(device, non_blocking=True)),
        "to_device": timed(lambda: device_2.copy_(host_2, non_blocking=True)),
        "each_way_at_once": timed(both),
    }


def main() -> None:
    if sys.argv[1:] == ["link"]:
        print("host link, GB/s:", {k: round(v, 1) for k, v in link_gbps().items()})
        return
    name = sys.argv[1] if len(sys.argv) > 1 else "llama-3-8b"
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    args = catalog_shape(name)
    lora = LoraShape(16)
    print(f"{name}: bytes per token one block keeps (LoRA r16 all-linear, fp32 adapters)")
    for attention in ("varlen", "cudnn"):
        for base in ("bf16", "nf4"):
            for budget in (None, 1.0, 0.9, 0.8):
                try:
                    measured = saved_bytes_per_token(args, base, budget, attention, tokens)
                except Exception as error:  # a kernel the compiler's estimate cannot count
                    print(f"  {attention:6} {base:4} budget {budget}: {type(error).__name__}")
                    continue
                planned = (
                    compiled_activation_bytes_per_token(args, 0, 2, lora, budget)
                    if budget is not None
                    else float("nan")
                )
                print(
                    f"  {attention:6} {base:4} budget {budget}: {measured / 1024:.1f} KiB "
                    f"(planned compiled: {planned / 1024:.1f} KiB)",
                    flush=True,
                )
    print("host link, GB/s:", {k: round(v, 1) for k, v in link_gbps().items()})


if __name__ == "__main__":
    main()
