"""All-gather and reduce-scatter bandwidth between the GPUs of one host, at the sizes FSDP2
moves for one block of the workload-5 model (Llama-3.2-1B: ~61 M parameters, bf16), and the
embedding's (263 M). `torchrun --nproc_per_node=2 bench/nccl_probe.py`; NCCL_* variables (such
as NCCL_PROTO or NCCL_DEBUG=INFO) apply as usual."""

import os
import time

import torch
import torch.distributed as dist


def bandwidth(op, output: torch.Tensor, input: torch.Tensor, repeats: int = 10) -> float:
    """GB/s of `op(output, input)`: the larger tensor's bytes over the median time."""
    for _ in range(3):
        op(output, input)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        op(output, input)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    size = max(output.numel(), input.numel()) * output.element_size()
    return size / sorted(times)[len(times) // 2] / 1e9


def main() -> None:
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    for name, params in (("block", 61_000_000), ("embedding", 263_000_000)):
        shard = torch.randn(params // world, device="cuda", dtype=torch.bfloat16)
        full = torch.empty(params // world * world, device="cuda", dtype=torch.bfloat16)
        gather = bandwidth(dist.all_gather_into_tensor, full, shard)
        scatter = bandwidth(dist.reduce_scatter_tensor, shard, full)
        if rank == 0:
            print(
                f"{name} ({2 * params / 1e6:.0f} MB): all-gather {gather:.0f} GB/s, "
                f"reduce-scatter {scatter:.0f} GB/s",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
