"""Kernel timings behind the MoE proxy's expert layer (Qwen3-30B-A3B shape, 4,096 tokens, 8 of
128 experts each), one GPU: combining each token's 8 expert rows (gather and sum, as compiled
in the block, eagerly, or as a batched matmul with the router weights), and the gate and up
projections as two grouped GEMMs or one over the stacked weights, forward and the input
gradient's GEMMs; and each of the layer's four grouped GEMMs (gate-up and down, forward and input
gradient) as ATen runs it (CUTLASS) against the fastest choice of Inductor's autotuning
(`max_autotune_gemm`: ATen and its Triton templates), and on rows dealt evenly to the experts
against rows as routed (whole tiles against a partial last tile per expert).
`python -m bench.moe_probe`."""

import functools

import torch

from bench.kernel_probe import median_ms

TOKENS, TOP_K, EXPERTS, DIM, FFN = 4096, 8, 128, 2048, 768


def routing(generator: torch.Generator):
    ids = torch.rand(TOKENS, EXPERTS, device="cuda", generator=generator).topk(TOP_K).indices
    sorted_ids, order = torch.sort(ids.reshape(-1), stable=True)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device="cuda"))
    experts = torch.arange(EXPERTS, device="cuda", dtype=sorted_ids.dtype)
    offsets = torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)
    return order, inverse, offsets


def gather_sum(rows, inverse):
    return rows.index_select(0, inverse).view(-1, TOP_K, rows.shape[-1]).sum(1)


def weighted_gather_sum(rows, inverse, weights, order):
    rows = rows * weights.reshape(-1)[order, None]
    return rows.index_select(0, inverse).view(-1, TOP_K, rows.shape[-1]).sum(1)


def weighted_bmm(rows, inverse, weights, order):
    """The router weights applied by the sum itself: [T, 1, k] @ [T, k, D]."""
    gathered = rows.index_select(0, inverse).view(-1, TOP_K, rows.shape[-1])
    return torch.bmm(weights[:, None, :], gathered).squeeze(1)


def main() -> None:
    generator = torch.Generator("cuda").manual_seed(0)
    order, inverse, offsets = routing(generator)
    rows = torch.randn(TOKENS * TOP_K, DIM, device="cuda", generator=generator).bfloat16()
    weights = torch.rand(TOKENS, TOP_K, device="cuda", generator=generator).bfloat16()
    reference = weighted_gather_sum(rows.float(), inverse, weights.float(), order)
    compiled_sum, compiled_weighted = torch.compile(gather_sum), torch.compile(weighted_gather_sum)
    table = {
        "gather only (index_select)": lambda: rows.index_select(0, inverse),
        "gather + sum, eager": lambda: gather_sum(rows, inverse),
        "gather + sum, compiled": lambda: compiled_sum(rows, inverse),
        "weights, gather + sum, eager": lambda: weighted_gather_sum(rows, inverse, weights, order),
        "weights, gather + sum, compiled": lambda: compiled_weighted(rows, inverse, weights, order),
        "gather + bmm with the weights": lambda: weighted_bmm(rows, inverse, weights, order),
    }
    moved = (rows.numel() + TOKENS * DIM) * 2 / 1e9
    for name, fn in table.items():
        ms = median_ms(fn)
        out = fn()
        error = ""
        if out.shape == reference.shape and "weights" in name:
            error = f"  rel. error {((out.float() - reference).norm() / reference.norm()):.1e}"
        print(f"{name:34s} {ms:7.3f} ms  {moved / ms:6.2f} TB/s{error}")

    gate, up = (
        torch.randn(EXPERTS, FFN, DIM, device="cuda", generator=generator).bfloat16() * 0.02
        for _ in range(2)
    )
    stacked = torch.cat([gate, up], dim=1)
    h = rows
    grad = torch.randn(TOKENS * TOP_K, 2 * FFN, device="cuda", generator=generator).bfloat16()
    grad_gate, grad_up = grad[:, :FFN].contiguous(), grad[:, FFN:].contiguous()

    def mm(x, w):
        return torch._grouped_mm(x, w, offs=offsets)

    flops = 2 * TOKENS * TOP_K * DIM * 2 * FFN / 1e12
    gemms = {
        "gate, up: two grouped GEMMs": lambda: (
            mm(h, gate.transpose(-2, -1)),
            mm(h, up.transpose(-2, -1)),
        ),
        "gate-up: one grouped GEMM": lambda: mm(h, stacked.transpose(-2, -1)),
        "input grad: two GEMMs + add": lambda: mm(grad_gate, gate) + mm(grad_up, up),
        "input grad: one GEMM (K stacked)": lambda: mm(grad, stacked),
    }
    for name, fn in gemms.items():
        ms = median_ms(fn)
        print(f"{name:34s} {ms:7.3f} ms  {flops / ms * 1e3:6.0f} TFLOP/s")
    autotuned_grouped_gemms(offsets, generator)
    tile_quantization(offsets, generator)


def autotuned_grouped_gemms(offsets: torch.Tensor, generator: torch.Generator) -> None:
    rows = TOKENS * TOP_K

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=generator).bfloat16()

    gate_up, down = randn(EXPERTS, 2 * FFN, DIM), randn(EXPERTS, DIM, FFN)
    cases = {  # name: (rows' input, the expert weights as the GEMM's second operand)
        "gate-up forward": (randn(rows, DIM), gate_up.transpose(-2, -1)),
        "down forward": (randn(rows, FFN), down.transpose(-2, -1)),
        "gate-up input gradient": (randn(rows, 2 * FFN), gate_up),
        "down input gradient": (randn(rows, DIM), down),
    }

    def mm(x, w, offs):
        return torch._grouped_mm(x, w, offs=offs)

    for name, (x, w) in cases.items():
        tuned = torch.compile(mm, mode="max-autotune-no-cudagraphs", dynamic=False)
        flops = 2 * rows * w.shape[1] * w.shape[2] / 1e12
        error = (tuned(x, w, offsets).float() - mm(x, w, offsets).float()).abs().max().item()
        for label, fn in (("ATen", mm), ("autotuned", tuned)):
            ms = median_ms(functools.partial(fn, x, w, offsets))
            print(f"{name:24s} {label:9s} {ms:7.3f} ms  {flops / ms * 1e3:6.0f} TFLOP/s")
        print(f"{name:24s} largest difference {error:.2e}")
        torch._dynamo.reset()


if __name__ == "__main__":
    main()


def tile_quantization(routed: torch.Tensor, generator: torch.Generator) -> None:
    """ATen's grouped GEMMs on rows dealt evenly (256 per expert: two whole 128-row tiles each),
    as routed (256 ± 16), and 255 / 257 alternating (the same rows; half the experts need a
    third tile for one row)."""
    rows = TOKENS * TOP_K
    even = torch.full((EXPERTS,), rows // EXPERTS, device="cuda")
    uneven = even + torch.tensor([-1, 1], device="cuda").repeat(EXPERTS // 2)
    dealings = {
        "even": even.cumsum(0).to(torch.int32),
        "routed": routed,
        "255/257": uneven.cumsum(0).to(torch.int32),
    }

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=generator).bfloat16()

    gate_up, down = randn(EXPERTS, 2 * FFN, DIM), randn(EXPERTS, DIM, FFN)
    cases = {
        "gate-up forward": (randn(rows, DIM), gate_up.transpose(-2, -1)),
        "down forward": (randn(rows, FFN), down.transpose(-2, -1)),
        "gate-up input gradient": (randn(rows, 2 * FFN), gate_up),
        "down input gradient": (randn(rows, DIM), down),
    }
    for name, (x, w) in cases.items():
        flops = 2 * rows * w.shape[1] * w.shape[2] / 1e12
        line = f"{name:24s}"
        for dealing, offs in dealings.items():
            ms = median_ms(functools.partial(torch._grouped_mm, x, w, offs=offs))
            line += f"  {dealing} {ms:.3f} ms {flops / ms * 1e3:4.0f} TFLOP/s"
        print(line)
