"""Kernel timings behind the Llama-3-8B LoRA step, one GPU: attention backends over a packed
step (forward + backward, checked against PyTorch's flash varlen: FlashAttention-4 where
installed, cuDNN through nested tensors) and over one 4,096-token document (SDPA's flash and cuDNN
kernels on the dense sequence), the block's GEMMs run separately or fused (q, k, v as one; gate
and up as one), and each adapter's GEMMs with the update accumulated or over a wide weight
[W | B]. `python bench/kernel_probe.py [attention]` (attention: its probes only)."""

import sys
import traceback

import numpy as np
import torch

from tuneforge.bench.batches import document_lengths
from tuneforge.packed import PackedSequences

TOKENS, HEADS, KV_HEADS, HEAD_DIM, DIM, FFN = 4096, 32, 8, 128, 4096, 14336


def median_ms(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def flash_varlen(q, k, v, packed):
    from torch.nn.attention.varlen import varlen_attn

    cu = packed.cu_seqlens
    return varlen_attn(q, k, v, cu, cu, packed.max_seqlen, packed.max_seqlen, window_size=(-1, 0))


def cudnn_nested(q, k, v, packed):
    """cuDNN through SDPA on nested jagged tensors: [B, j, H, D] transposed to [B, H, j, D]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    groups = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    offsets = packed.cu_seqlens.long()
    nested = [
        torch.nested.nested_tensor_from_jagged(t, offsets, max_seqlen=packed.max_seqlen).transpose(
            1, 2
        )
        for t in (q, k, v)
    ]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(*nested, is_causal=True)
    return out.transpose(1, 2).values()


def sdpa_dense(backend_name: str, gqa: bool):
    """SDPA on the whole step as one causal sequence [1, H, T, D] through one backend; `gqa`
    False repeats k and v to every query head first (a backend without GQA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def attend(q, k, v, packed):
        assert packed.cu_seqlens.numel() == 2, "one document"
        groups = q.shape[1] // k.shape[1]
        if not gqa:
            k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        dense = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                *dense, is_causal=True, enable_gqa=gqa and groups > 1
            )
        return out.squeeze(0).transpose(0, 1)

    return attend


def flash4_varlen(q, k, v, packed):
    from tuneforge.models.attention import flash4_attention

    return flash4_attention(q, k, v, packed)


def probe_attention(one_document: bool = False) -> None:
    lengths = [TOKENS] if one_document else document_lengths(TOKENS, np.random.default_rng(0))
    packed = PackedSequences.from_lengths(lengths, "cuda")
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    flops = 4 * HEADS * HEAD_DIM * pairs * 3.5  # forward 2 GEMMs, backward 5 (2.5x)
    print(f"attention: {len(lengths)} documents, max {max(lengths)}, {flops / 1e9:.0f} GFLOP")
    gen = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(TOKENS, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(TOKENS, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    grad = torch.randn_like(q)
    reference = None
    candidates = [("flash varlen", flash_varlen), ("flash4", flash4_varlen)]
    if one_document:
        candidates += [
            ("sdpa flash", sdpa_dense("FLASH_ATTENTION", gqa=True)),
            ("sdpa cudnn gqa", sdpa_dense("CUDNN_ATTENTION", gqa=True)),
            ("sdpa cudnn repeated k, v", sdpa_dense("CUDNN_ATTENTION", gqa=False)),
        ]
    else:
        candidates.append(("cudnn nested", cudnn_nested))
    for name, fn in candidates:
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        try:
            out = fn(*leaves, packed)
            out.backward(grad)
        except Exception as error:  # report and go on: this is a probe
            print(f"  {name}: failed: {type(error).__name__}: {str(error)[:300]}")
            traceback.print_exc(limit=-3)
            continue
        results = [out.detach()] + [t.grad.clone() for t in leaves]
        if reference is None:
            reference = results
        errors = [
            (a.float() - b.float()).abs().max().item()
            for a, b in zip(results, reference, strict=True)
        ]

        def step(fn=fn, leaves=leaves):
            fn(*leaves, packed).backward(grad)

        forward_ms = median_ms(lambda fn=fn, leaves=leaves: fn(*leaves, packed))
        total_ms = median_ms(step)
        print(
            f"  {name}: forward {forward_ms:.3f} ms, forward+backward {total_ms:.3f} ms "
            f"({flops / total_ms / 1e9:.0f} TFLOP/s); max |diff| out/dq/dk/dv vs flash "
            + " ".join(f"{e:.3g}" for e in errors)
        )


def print_rows(name: str, rows: dict, flops: float) -> None:
    for row, fn in rows.items():
        ms = median_ms(fn)
        print(f"  {name} {row}: {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s)")


def probe_fusion(name: str, x: torch.Tensor, outs: tuple[int, ...]) -> None:
    weights = [torch.randn(n, DIM, device="cuda", dtype=torch.bfloat16) / 64 for n in outs]
    fused = torch.cat(weights)
    grads = [torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16) for n in outs]
    fused_grad = torch.cat(grads, dim=1)
    rows = {
        "forward, separate": lambda: [x @ w.T for w in weights],
        "forward, fused": lambda: x @ fused.T,
        "input grad, separate": lambda: sum(g @ w for g, w in zip(grads, weights, strict=True)),
        "input grad, fused": lambda: fused_grad @ fused,
    }
    print_rows(name, rows, 2 * TOKENS * DIM * sum(outs))


def probe_single(name: str, n: int, k: int) -> None:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64
    a = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16)
    print_rows(name, {"forward": lambda: a @ w.T, "input grad": lambda: g @ w}, 2 * TOKENS * n * k)


def probe_wide(name: str, n: int, k: int, tail: int, scaling: float = 2.0) -> None:
    """One adapter's GEMMs with its update accumulated into the base GEMM's output (the fused
    LoRA linear) against the base weight stored wide, [W | B], whose GEMM adds the update (a
    layout measured and dropped: bench/NOTES.md); `tail` is the wide tail's width (the ranks
    sharing the input)."""
    rank = 16 if tail >= 16 else tail
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64
    A = torch.randn(rank, k, device="cuda", dtype=torch.bfloat16) / 64
    B = torch.randn(n, rank, device="cuda", dtype=torch.bfloat16) / 64
    x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
    u = x @ A.T
    g = torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16)
    wide = torch.cat([w, torch.zeros(n, tail, device="cuda", dtype=w.dtype)], dim=1)
    wide[:, k : k + rank] = B
    x_wide = torch.cat([x, torch.zeros(TOKENS, tail, device="cuda", dtype=x.dtype)], dim=1)
    x_wide[:, k : k + rank] = u * scaling
    A_wide = torch.zeros(tail, k, device="cuda", dtype=A.dtype)
    A_wide[:rank] = A

    def input_grad_wide():
        d_wide = g @ wide
        return torch.addmm(d_wide[:, :k], d_wide[:, k:] * scaling, A_wide)

    rows = {
        "forward, update accumulated": lambda: (x @ w.T).addmm_(u, B.T, alpha=scaling),
        "forward, wide": lambda: x_wide @ wide.T,
        "input grad, g·B then accumulated": lambda: (g @ w).addmm_(g @ B, A, alpha=scaling),
        "input grad, wide": input_grad_wide,
        "input grad, wide weight read as W and B": lambda: (g @ wide[:, :k]).addmm_(
            (g @ wide[:, k:]).mul_(scaling), A_wide
        ),
    }
    print_rows(name, rows, 2 * TOKENS * n * k)


def probe_gemms() -> None:
    x = torch.randn(TOKENS, DIM, device="cuda", dtype=torch.bfloat16)
    probe_fusion("q,k,v", x, (DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM))
    probe_fusion("gate,up", x, (FFN, FFN))
    probe_single("o", DIM, DIM)
    probe_single("down", DIM, FFN)
    probe_wide("wide q,k,v", DIM + 2 * KV_HEADS * HEAD_DIM, DIM, 48)
    probe_wide("wide gate", FFN, DIM, 32)
    probe_wide("wide o", DIM, DIM, 16)
    probe_wide("wide down", DIM, FFN, 16)


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), "cudnn", torch.backends.cudnn.version())
    probe_attention()
    probe_attention(one_document=True)
    if sys.argv[1:] == ["attention"]:
        sys.exit(0)
    print("GEMMs (bf16, 4,096 tokens):")
    probe_gemms()
