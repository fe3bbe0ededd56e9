"""Is a kernel-bound step held back by the GPU's power limit? The Llama-3-8B step's widest GEMM
([4096, 4096] x [4096, 14336], bf16) timed two ways: each GEMM alone after the GPU idled
(as the profiler's gaps let it), and back to back for a few seconds (as a training step runs
them), with the SM clock, the power draw and the driver's reasons for holding the clock down
sampled through NVML over the second. `python bench/power_probe.py`."""

import time

import torch

from tuneforge.bench.gpu_clocks import GpuSampler, describe
from tuneforge.hardware.nvml import open_nvml

TOKENS, DIM, FFN = 4096, 4096, 14336
FLOP = 2 * TOKENS * DIM * FFN


def timed(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    nvml, why_not = open_nvml()
    if nvml is None:
        raise SystemExit(f"no clock readings: {why_not}")
    x = torch.randn(TOKENS, DIM, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(FFN, DIM, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(TOKENS, FFN, device="cuda", dtype=torch.bfloat16)

    def gemm():
        torch.mm(x, weight.t(), out=out)

    for _ in range(20):
        gemm()
    torch.cuda.synchronize()

    rested = []
    for _ in range(30):
        time.sleep(0.05)
        rested.append(timed(gemm))
    with GpuSampler(nvml.read) as loaded_sampler:
        ms, repeats = 0.0, 0
        deadline = time.perf_counter() + 4.0
        while time.perf_counter() < deadline:
            ms += timed(lambda: [gemm() for _ in range(50)])
            repeats += 50
    rested_ms = sorted(rested)[len(rested) // 2]
    for name, gemm_ms in (("alone after 50 ms idle", rested_ms), ("back to back", ms / repeats)):
        print(f"{name}: {gemm_ms:.3f} ms per GEMM, {FLOP / gemm_ms / 1e9:.0f} TFLOP/s")
    summary = loaded_sampler.summary(nvml.max_sm_clock_mhz, nvml.power_limit_w)
    print(f"back to back, {describe(summary)}")


if __name__ == "__main__":
    main()
