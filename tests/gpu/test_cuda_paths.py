"""CUDA-only paths against their CPU-proven references (skipped without a GPU)."""

import pytest
import torch

from tests.helpers import save_tiny_model
from tuneforge.models import flash4
from tuneforge.models.args import MoEArgs
from tuneforge.models.attention import (
    cudnn_attention,
    resolve_backend,
    sdpa_attention,
    varlen_attention,
)
from tuneforge.models.moe import MoE
from tuneforge.packed import PackedSequences

CUDA = torch.device("cuda")


def test_auto_picks_the_fastest_backend_installed_here():
    expected = "flash4" if flash4.available(CUDA) else "varlen"
    assert resolve_backend("auto", CUDA) == expected


@pytest.mark.parametrize(
    ("fast", "kv_heads", "window"),
    [
        (varlen_attention, 8, None),
        (varlen_attention, 2, None),
        (varlen_attention, 2, 37),
        (cudnn_attention, 8, None),
        (cudnn_attention, 2, None),
    ],
)
def test_fused_kernels_equal_sdpa_in_bf16(fast, kv_heads, window):
    """Flash varlen and cuDNN (plain causal attention only) against SDPA's own choice per
    document."""
    lengths = [100, 1, 300, 57, 512]
    generator = torch.Generator(device=CUDA).manual_seed(0)
    total = sum(lengths)
    q = torch.randn(
        total, 8, 64, device=CUDA, dtype=torch.bfloat16, generator=generator, requires_grad=True
    )
    k = torch.randn(
        total,
        kv_heads,
        64,
        device=CUDA,
        dtype=torch.bfloat16,
        generator=generator,
        requires_grad=True,
    )
    v = torch.randn(
        total,
        kv_heads,
        64,
        device=CUDA,
        dtype=torch.bfloat16,
        generator=generator,
        requires_grad=True,
    )
    packed = PackedSequences.from_lengths(lengths, CUDA)
    grad_out = torch.randn(total, 8, 64, device=CUDA, dtype=torch.bfloat16, generator=generator)
    results = []
    for attention in (fast, sdpa_attention):
        out = attention(q, k, v, packed, window)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        results.append((out, *grads))
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def test_grouped_gemm_experts_equal_the_loop_in_bf16():
    """Both bf16 paths against the fp32 per-expert loop on the same weights: the grouped path
    is no further from it than the bf16 loop (elementwise, a sum of 1,000 tokens' router
    gradients in bf16 differs by an ulp of its largest element between any two orders)."""
    args = MoEArgs(num_experts=16, top_k=4, expert_ffn_dim=128, norm_topk_prob=True)
    grouped = MoE(256, args, "grouped").to(CUDA, torch.bfloat16)
    loop = MoE(256, args, "loop").to(CUDA, torch.bfloat16)
    reference = MoE(256, args, "loop").to(CUDA)
    with torch.no_grad():
        for param in grouped.parameters():
            param.normal_(0, 0.05)
    loop.load_state_dict(grouped.state_dict())
    reference.load_state_dict({k: v.float() for k, v in grouped.state_dict().items()})
    x = torch.randn(1000, 256, device=CUDA, dtype=torch.bfloat16)
    outputs = [
        model(x if model is not reference else x.float()) for model in (grouped, loop, reference)
    ]
    for out in outputs:
        out.float().square().sum().backward()

    def error(got, expected):
        return ((got.float() - expected).norm() / expected.norm()).item()

    expected = outputs[2]
    assert error(outputs[0], expected) <= 1.1 * error(outputs[1], expected) + 1e-3
    for (name, a), b, r in zip(
        grouped.named_parameters(), loop.parameters(), reference.parameters(), strict=True
    ):
        assert error(a.grad, r.grad) <= 1.1 * error(b.grad, r.grad) + 1e-3, name
        assert error(a.grad, r.grad) < 0.06, name


@pytest.mark.parametrize(
    "family", ["llama", "qwen3", "qwen3_moe", "mistral", "mixtral", "deepseek_v2", "gemma3_text"]
)
def test_whole_model_varlen_matches_sdpa_and_cpu_fp32(tmp_path, family):
    import tuneforge

    save_tiny_model(tmp_path, family, hidden_size=128, intermediate_size=256)
    reference = tuneforge.load_model(tmp_path, dtype="float32", attention="sdpa")
    same_dtype = tuneforge.load_model(tmp_path, dtype="bfloat16", device="cuda", attention="sdpa")
    on_gpu = tuneforge.load_model(tmp_path, dtype="bfloat16", device="cuda")
    args = on_gpu.args
    expected = resolve_backend("auto", CUDA, torch.bfloat16, args.head_dim, args.plain_attention)
    assert on_gpu.layers[0].attn.backend == expected and expected in ("flash4", "varlen")
    tokens = torch.randint(0, 128, (90,), generator=torch.Generator().manual_seed(0))
    cu = torch.tensor([0, 30, 31, 90], dtype=torch.int32)
    with torch.no_grad():
        fp32 = reference(tokens, cu_seqlens=cu)
        sdpa = same_dtype(tokens.cuda(), cu_seqlens=cu.cuda()).float().cpu()
        got = on_gpu(tokens.cuda(), cu_seqlens=cu.cuda()).float().cpu()
    torch.testing.assert_close(got, sdpa, atol=2e-2, rtol=2e-2)
    # against fp32 on average: bf16 alone moves a few rows past 5e-2 (Gemma's larger logits; a
    # MoE token whose best experts nearly tie routes otherwise), in sdpa on the CPU as well
    error, bf16_error = (got - fp32).abs().mean(), (sdpa - fp32).abs().mean()
    assert error <= 1.1 * bf16_error + 1e-3 and error < 2e-2


@pytest.mark.parametrize("rank", [16, 4])
def test_expert_lora_grouped_equals_the_loop_on_a_bf16_bank(rank):
    from tuneforge.peft.expert_lora import ExpertLoRA

    def build(implementation):
        torch.manual_seed(0)
        moe = MoE(256, MoEArgs(num_experts=16, top_k=4, expert_ffn_dim=128), implementation)
        for param in moe.parameters():
            torch.nn.init.normal_(param, std=0.05)
        for projection, (out, inp) in {"gate_up_proj": (256, 256), "down_proj": (256, 128)}.items():
            adapter = ExpertLoRA(16, inp, out, rank, 2.0 * rank, dtype=torch.float32)
            torch.nn.init.normal_(adapter.lora_B, std=0.05)
            moe.experts.adapters[projection] = adapter
        moe.to(CUDA)
        moe.router.to(torch.bfloat16)
        moe.experts.gate_up_proj.data = moe.experts.gate_up_proj.data.bfloat16()
        moe.experts.down_proj.data = moe.experts.down_proj.data.bfloat16()
        return moe

    grouped, loop = build("grouped"), build("loop")
    x = torch.randn(512, 256, device=CUDA, dtype=torch.bfloat16)
    out_grouped, out_loop = grouped(x), loop(x)
    torch.testing.assert_close(out_grouped, out_loop, atol=2e-2, rtol=2e-2)
    out_grouped.float().square().sum().backward()
    out_loop.float().square().sum().backward()
    for (name, a), (_, b) in zip(
        grouped.experts.adapters.named_parameters(),
        loop.experts.adapters.named_parameters(),
        strict=True,
    ):
        assert a.grad.dtype == torch.float32 and torch.isfinite(a.grad).all()
        torch.testing.assert_close(a.grad, b.grad, atol=5e-2, rtol=5e-2, msg=name)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dim", [2048, 100])
def test_gather_sum_kernel_equals_the_fp32_sum(weighted, dim):
    """The Triton kernel (fp32 sums of bf16 rows) against the same sum in fp32 on the CPU."""
    from tuneforge.models.gather_sum import _gather_sum, _triton_kernel, gather_sum

    assert _triton_kernel() is not None, "Triton is installed with CUDA builds of torch"
    generator = torch.Generator().manual_seed(0)
    tokens, top_k = 513, 8
    rows = torch.randn(tokens * top_k, dim, generator=generator).bfloat16()
    index = torch.randperm(tokens * top_k, generator=generator)
    weights = torch.rand(tokens, top_k, generator=generator).bfloat16() if weighted else None
    got = gather_sum(
        rows.to(CUDA), index.to(CUDA), None if weights is None else weights.to(CUDA), top_k
    )
    expected = _gather_sum(rows.float(), index, None if weights is None else weights.float(), top_k)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu().float(), expected, rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("attention", ["flash4", "varlen"])
def test_stacked_weights_keep_no_more_for_backward(attention):
    """What a block saves for backward, in storage bytes, is the same with q, k and v's frozen
    weights stacked as without: no saved tensor is a slice holding several outputs alive."""
    if attention == "flash4" and not flash4.available(CUDA):
        pytest.skip("flash-attn-4 is not installed")
    plain = saved_activation_bytes(attention, stack=False)
    assert saved_activation_bytes(attention, stack=True) <= plain * 1.002


def saved_activation_bytes(attention: str, stack: bool) -> int:
    """Storage bytes a LoRA block of the Llama-3.2-1B shape saves for backward, weights aside."""
    import tuneforge
    from tuneforge.peft.apply import apply_lora
    from tuneforge.peft.stacked_weights import stack_frozen_weights

    model = tuneforge.load_model(
        "llama-3.2-1b", num_layers=1, dtype="bfloat16", device="cuda", attention=attention
    )
    lora = {"target_modules": ["all-linear"], "rank": 16, "alpha": 32}
    apply_lora(model, lora, torch.Generator("cuda").manual_seed(1), torch.float32)
    if stack:
        assert stack_frozen_weights(model) == 1
    x = torch.randn(4096, model.args.dim, device="cuda", dtype=torch.bfloat16)
    packed = PackedSequences.from_lengths([1000, 3096], "cuda")
    rope = model.rope(packed.position_ids, x.dtype)
    storages = {}

    def keep(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        model.layers[0](x.requires_grad_(), rope, packed)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(size for ptr, size in storages.items() if ptr not in weights)


def test_the_memory_profile_names_the_copy_streams_pools():
    """A tensor sent to the host and brought back: the copy back is allocated in its side
    stream's pool, which the profile's cache breakdown names."""
    from tuneforge.bench.profile import peak_breakdown
    from tuneforge.execution.offloaded_checkpoints import HostCopy

    x = torch.randn(1024, 1024, device="cuda")

    def step():
        copy = HostCopy(x * 2)
        copy.prefetch()
        assert copy.restore().sum().item() == pytest.approx(2 * x.sum().item(), rel=1e-4)

    step()
    cache = peak_breakdown(step)["cache"]
    assert {"compute", "copies to_device"} <= set(cache["by_stream"])
    assert cache["by_stream"]["copies to_device"]["reserved_gib"] > 0


def test_the_kernel_profile_counts_kernels_not_the_optimizers_annotated_range():
    """The optimizer's step is a range annotated on the device's timeline around its kernels:
    counted too, the kernels' time exceeded the step's."""
    from tuneforge.bench.profile import profile_steps

    layer = torch.nn.Linear(2048, 2048, device=CUDA)
    optimizer = torch.optim.AdamW(layer.parameters(), fused=True)
    x = torch.randn(4096, 2048, device=CUDA)

    def step():
        layer(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    profile = profile_steps(step, steps=3)
    names = [kernel["kernel"] for kernel in profile["top_kernels"]]
    assert names and not any(name.startswith("Optimizer.") for name in names)
    assert 0 < profile["gpu_busy_ms_per_step"] <= profile["wall_ms_per_step"]


def test_offloaded_blocks_come_back_into_the_compute_streams_slots():
    """Blocks alternating activations in host memory and checkpointed inputs in host memory,
    three steps: the gradients are the plain run's, the copies back allocate nothing on their
    side stream (two slots of the compute stream's, reused in turn), and the slots go back to
    the compute stream's pool once backward is over."""
    from tuneforge.execution.activation_offload import offloaded_activations
    from tuneforge.execution.offloaded_checkpoints import (
        OffloadChain,
        copy_stream_names,
        offloaded_checkpoint,
    )

    torch.cuda.empty_cache()  # no side-stream segment left by an earlier test
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(1024, 1024, device=CUDA) / 32) for _ in range(6)]
    x = torch.randn(4096, 1024, device=CUDA)

    def gradients(chain):
        h = x
        for index, weight in enumerate(weights):

            def run(h, weight=weight):
                return torch.tanh(h @ weight) @ weight.T

            if chain is None:
                block = run
            elif index % 2:
                module = torch.nn.Module()
                module.weight = weight
                block = offloaded_activations(run, module, chain, min_bytes=0)
            else:
                block = offloaded_checkpoint(run, [weight], chain)
            h = block(h)
        return torch.autograd.grad(h.square().sum(), weights)

    expected = gradients(None)
    chain = OffloadChain()
    for _ in range(3):
        got = gradients(chain)
        assert chain.slots.buffers == [None, None]
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e)
    torch.cuda.synchronize()
    side = {handle for handle, name in copy_stream_names().items() if name == "copies to_device"}
    segments = torch.cuda.memory._snapshot()["segments"]
    assert side and not [s for s in segments if s["stream"] in side]


def test_nvml_reads_the_current_devices_clock_and_power():
    """The sampler's reader finds the CUDA device in NVML by its UUID and reads values within
    the board's own limits."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    from tuneforge.hardware.nvml import open_nvml

    nvml, why_not = open_nvml()
    assert nvml is not None, why_not
    sample = nvml.read()
    assert 0 < sample.sm_clock_mhz <= nvml.max_sm_clock_mhz
    assert 0 < sample.power_w < 2 * nvml.power_limit_w

    from tuneforge.train.device_watch import DeviceWatch

    stats = DeviceWatch(torch.device("cuda"), rank=0, settle_steps=0).check(1)
    assert 0 < stats["gpu_sm_clock_mhz"] <= nvml.max_sm_clock_mhz
    assert isinstance(stats["gpu_clock_held_down_by"], list) and "mem_allocated_gib" in stats

    from tuneforge.doctor.env import inspect_environment

    gpu = inspect_environment().gpus[0]
    assert 0 < gpu["power_limit_w"] <= gpu["default_power_limit_w"] * 1.5
