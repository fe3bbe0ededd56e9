"""The planner against exact parameter counts, the LUMI-G report's figures, and the padding
arithmetic that made halving max_seq_len only 1.2x faster without packing."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from tuneforge.config import load_config
from tuneforge.data.length_policy import RecordLengths
from tuneforge.hardware.gpus import GIB
from tuneforge.models.args import ModelArgs
from tuneforge.models.catalog import catalog_shape
from tuneforge.models.cost import attention_activation_bytes_per_token
from tuneforge.models.decoder import Decoder
from tuneforge.plan.memory import Setup, static_bytes
from tuneforge.plan.planner import (
    Hardware,
    jobs_needed,
    plan_config,
    plan_run,
    replicated_memory_gib,
)
from tuneforge.plan.workload import epoch_workload
from tuneforge.precision.trained_weights import TrainedWeights

DEMO = "examples/demo.yaml"
LLAMA3_8B_LORA = [
    "model.name=llama-3-8b",
    "model.dtype=bfloat16",
    "data.max_seq_len=4096",
    "train.tokens_per_micro_batch=4096",
    "lora.enabled=true",
]
OFFLOADED_CHECKPOINTS_8B_LORA = [
    *LLAMA3_8B_LORA,
    "lora.target_modules=[all-linear]",
    "train.activation_checkpointing=full",
    "train.offload_checkpoints=true",
]


def qwen3_8b(*extra: str):
    return load_config(
        DEMO,
        [
            "model.name=qwen3-8b",
            "model.dtype=bfloat16",
            "model.attention=eager",
            "data.max_seq_len=8192",
            "train.tokens_per_micro_batch=8192",
            "parallel.strategy=fsdp",
            "parallel.zero_stage=2",
            *extra,
        ],
    )


def test_static_bytes_are_the_real_parameter_bytes():
    args = ModelArgs(vocab_size=300, dim=64, num_layers=3, num_heads=4, num_kv_heads=2, ffn_dim=96)
    model = Decoder(args).to(torch.bfloat16)
    actual = sum(p.numel() * p.element_size() for p in model.parameters())
    weights, gradients, optimizer = static_bytes(Setup(args, 2, 1024))
    assert weights == actual and gradients == actual and optimizer == 2 * actual


def _fsdp2_held_bytes(rank: int, port: int, fp32_shards: bool, out) -> None:
    """What FSDP2 under ZeRO-2 holds of the demo model on this rank: its shards and the
    gathered weights after a forward (distinct storages), and its gradients after backward."""
    import torch.distributed as dist

    from tuneforge.config.sections.parallel import ParallelSection
    from tuneforge.models.api import load_model
    from tuneforge.parallel.distributed import Dist, parallelize
    from tuneforge.parallel_dims import ParallelDims

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
        section = ParallelSection(strategy="fsdp", zero_stage=2)
        dims = ParallelDims.of("fsdp", 2)
        parallelize(model, model.layers, dims, section, Dist(rank, 2), fp32_shards=fp32_shards)
        logits = model(torch.randint(0, model.args.vocab_size, (1, 32)))
        held: dict[str, dict[int, int]] = {"shards": {}, "gathered": {}}
        for module in model.modules():
            state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
            group = state._fsdp_param_group if state is not None else None
            for param in group.fsdp_params if group is not None else []:
                kinds = {"shards": param._sharded_param_data, "gathered": param._unsharded_param}
                for kind, tensor in kinds.items():
                    storage = tensor.untyped_storage()
                    held[kind][storage.data_ptr()] = storage.nbytes()
        logits.float().sum().backward()
        grads = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
        out[rank] = {kind: sum(storages.values()) for kind, storages in held.items()} | {
            "gradients": sum(g.numel() * g.element_size() for g in grads)
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("master", [False, True], ids=["pure", "fp32-shards"])
def test_zero2_counts_what_fsdp2_holds_on_two_ranks(master):
    """Under ZeRO-2 (no reshard after forward) FSDP2 keeps each parameter's shard beside the
    gathered weights until backward; with master weights the shards are fp32 (the master the
    optimizer bytes count) and so are the gradients. The planner's weights and gradients
    against what two gloo ranks hold (shards padded to even rows: within 2%)."""
    import socket

    import torch.multiprocessing as mp

    from tuneforge.models.api import model_args

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = mp.get_context("spawn").Manager().dict()
    mp.spawn(_fsdp2_held_bytes, args=(port, master, out), nprocs=2)
    held = out[0]
    args = model_args("demo-tiny")
    trained = TrainedWeights.of(master, "bfloat16")
    setup = Setup(args, 2, 1024, data_parallel=2, zero_stage=2, trained=trained)
    weights, gradients, _ = static_bytes(setup)
    shards = 0 if master else held["shards"]  # fp32 shards: the master, in the optimizer bytes
    assert weights == pytest.approx(held["gathered"] + shards, rel=0.02)
    assert gradients == pytest.approx(held["gradients"], rel=0.02)
    shard_bytes = 4 if master else 2
    assert held["shards"] == pytest.approx(args.num_params() * shard_bytes / 2, rel=0.02)
    assert out[1] == pytest.approx(held, rel=0.02)


def test_report_qwen3_8b_zero2_on_8_gpus_of_64_gib():
    """≈30 GiB of static tensors (bf16 weights, fp32 master and AdamW sharded 8 ways), and
    gradient checkpointing needed at long sequences."""
    hardware = Hardware(gpus=8, gpu="MI250X")
    plan = plan_run(qwen3_8b(), hardware)
    assert 28 <= plan.memory.static / GIB <= 31
    assert plan.gradient_checkpointing_needed and not plan.fits
    assert plan_run(qwen3_8b("train.activation_checkpointing=full"), hardware).fits
    assert plan.zero_stage_advice.startswith("ZeRO-2")


def test_report_moe_attention_activations_are_smaller_than_dense_8b():
    moe, dense = catalog_shape("qwen3-30b-a3b"), catalog_shape("qwen3-8b")
    assert attention_activation_bytes_per_token(moe) < attention_activation_bytes_per_token(dense)
    assert moe.dim < dense.dim and moe.num_params(active=True) < dense.num_params()


def test_report_6060_steps_at_125_s_is_210_h_and_6_jobs_of_38_h():
    eta_s = 6060 * 125
    assert eta_s / 3600 == pytest.approx(210.4, abs=0.1)
    assert jobs_needed(eta_s, 38 * 3600, margin_s=60) == 6


def test_zero_stage_advice_follows_the_report_table():
    eight = Hardware(gpus=8, gpu="MI250X")
    for model, stage in (
        ("qwen3-8b", 2),
        ("qwen3-32b", 3),
        ("qwen3-30b-a3b", 3),  # 30.5 B in total: over the MoE line of 30 B
        ("qwen3-235b-a22b", 3),
    ):
        config = load_config(DEMO, [f"model.name={model}", "model.dtype=bfloat16"])
        assert plan_run(config, eight).zero_stage_advice.startswith(f"ZeRO-{stage}"), model


def heavy_tailed_lengths(count: int = 4000) -> list[int]:
    rng = np.random.default_rng(0)
    return [int(x) for x in np.clip(rng.lognormal(6.5, 1.0, count), 16, 16000)]


def test_halving_max_seq_len_without_packing_is_far_from_4x():
    args = catalog_shape("qwen3-8b")
    raw = heavy_tailed_lengths()
    speedups = {}
    for packing in ("none", "ffd"):
        work = {
            limit: epoch_workload(
                args, RecordLengths(raw).documents(limit, "truncate", False), 8192, packing, None
            )
            for limit in (8192, 4096)
        }
        speedups[packing] = work[8192].flops / work[4096].flops
        if packing == "none":
            assert work[8192].computed_tokens > 1.5 * work[8192].real_tokens  # padding
    # only the few long documents get shorter, and without packing padding to each micro-batch's
    # longest dominates: nowhere near the 2-4x a halved length suggests
    assert 0.8 < speedups["none"] < 1.5
    assert 1.0 < speedups["ffd"] < 1.5


def test_what_if_and_save_steps_against_a_time_limit(tmp_path):
    hardware = Hardware(gpus=8, gpu="MI250X", time_limit_s=3600)
    overrides = [
        "model.name=qwen3-8b",
        "model.dtype=bfloat16",
        "data.max_seq_len=4096",
        "train.tokens_per_micro_batch=4096",
        "train.activation_checkpointing=full",
        "train.max_steps=6060",
        "checkpoint.save_steps=5000",
    ]
    plan = plan_config(
        load_config(DEMO, overrides),
        hardware,
        RecordLengths(heavy_tailed_lengths()),
        ["data.packing=none"],
    )
    assert any("save_steps=5000 exceeds" in problem for problem in plan.problems)
    assert plan.jobs_needed is not None and plan.jobs_needed > 1
    (item,) = plan.what_if
    assert item["change"] == "data.packing=none" and item["speedup"] < 1.0
    data = plan.as_dict()
    assert {"weights", "gradients", "optimizer", "activations", "other", "static", "total"} <= set(
        data["memory_gib"]
    )
    for key in (
        "fits",
        "zero_stage_advice",
        "gradient_checkpointing_needed",
        "step_time_s",
        "eta_h",
        "jobs_needed",
    ):
        assert key in data


def test_plan_command_prints_json():
    result = subprocess.run(
        [sys.executable, "-m", "tuneforge", "plan", DEMO, "--json", "--gpu", "H200"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["fits"] and data["gpu_memory_gib"] == 141.0 and data["suggested_max_seq_len"]
    assert data["strategy"] == "single" and data["collective_gb_per_step"] == 0.0


def test_plan_command_names_the_strategy_and_its_traffic_on_several_gpus():
    result = subprocess.run(
        [sys.executable, "-m", "tuneforge", "plan", DEMO, "--gpus", "4", "--gpu", "H200"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "parallel.strategy ddp (every GPU holds the whole model:" in text
    assert "GB sent per GPU and optimizer step" in text


def test_offloaded_checkpoints_leave_the_block_inputs_off_the_gpu():
    """Llama-3-8B LoRA at 4,096 tokens: full checkpointing keeps 32 block inputs of
    4,096 x 4,096 bf16 values (1 GiB) on the GPU; offloaded, none of them, and the planner says
    so when only that fits."""
    shape = [
        *LLAMA3_8B_LORA,
        "lora.target_modules=[all-linear]",
        "train.activation_checkpointing=full",
    ]
    hardware = Hardware(gpu="H200", memory_gib=17.5)
    full = plan_run(load_config(DEMO, shape), hardware)
    offloaded = plan_run(load_config(DEMO, [*shape, "train.offload_checkpoints=true"]), hardware)
    assert full.memory.activations - offloaded.memory.activations == 32 * 4096 * 4096 * 2
    assert not full.fits and offloaded.fits
    assert any("train.offload_checkpoints: true" in advice for advice in full.advice)
    assert not any("offload" in advice for advice in offloaded.advice)


def test_blocks_with_offloaded_activations_keep_nothing_on_the_gpu_and_are_not_recomputed():
    """Llama-3-8B LoRA, compiled: the activations of 8 of 32 blocks in host memory take exactly
    their kept bytes off the step's activations; with all 32, the peak is full offloaded
    checkpointing's (nothing kept, one block whole at a time) but for what comes back into the
    other staging slot meanwhile (a block's activations, not an input), without the
    recomputation."""
    from tuneforge.models.cost import LoraShape, compiled_activation_bytes_per_token

    shape = [*LLAMA3_8B_LORA, "lora.target_modules=[all-linear]", "train.compile=true"]
    hardware = Hardware(gpu="H200", memory_gib=141)
    plain = plan_run(load_config(DEMO, shape), hardware)
    eight = plan_run(load_config(DEMO, [*shape, "train.offload_activations=8"]), hardware)
    block = compiled_activation_bytes_per_token(catalog_shape("llama-3-8b"), 0, 2, LoraShape(16))
    assert plain.memory.activations - eight.memory.activations == pytest.approx(8 * block * 4096)
    checkpointed = [*shape, "train.activation_checkpointing=full", "train.offload_checkpoints=true"]
    offloaded = plan_run(load_config(DEMO, checkpointed), hardware)
    on_host = plan_run(load_config(DEMO, [*checkpointed, "train.offload_activations=32"]), hardware)
    other_slot = (block - 4096 * 2) * 4096
    assert on_host.memory.allocated - offloaded.memory.allocated == pytest.approx(other_slot)
    # not recomputed: plain's products, and the transfers beyond what the compute hides
    assert on_host.step_parts["gemm bf16"] == pytest.approx(plain.step_parts["gemm bf16"])
    assert on_host.step_parts["gemm bf16"] < offloaded.step_parts["gemm bf16"]
    transfers = on_host.step_parts["host transfers"]
    assert on_host.step_time_s == pytest.approx(plain.step_time_s + transfers, rel=0.02)


def test_an_embedding_in_host_memory_leaves_the_gpu():
    """Llama-3-8B LoRA: the input embedding (128,256 x 4,096 bf16, ~1 GiB) off the GPU."""
    shape = LLAMA3_8B_LORA
    hardware = Hardware(gpu="H200", memory_gib=141)
    plain = plan_run(load_config(DEMO, shape), hardware)
    hosted = plan_run(load_config(DEMO, [*shape, "train.offload_embedding=true"]), hardware)
    assert plain.memory.weights - hosted.memory.weights == 128256 * 4096 * 2
    assert plain.memory.allocated - hosted.memory.allocated == 128256 * 4096 * 2


def test_the_planner_suggests_the_host_embedding_when_only_that_fits():
    shape = OFFLOADED_CHECKPOINTS_8B_LORA
    hardware = Hardware(gpu="H200", memory_gib=16.5)
    plan = plan_run(load_config(DEMO, shape), hardware)
    hosted = plan_run(load_config(DEMO, [*shape, "train.offload_embedding=true"]), hardware)
    assert not plan.fits and hosted.fits
    assert any("train.offload_embedding: true" in advice for advice in plan.advice)
    assert not any("offload_embedding" in advice for advice in hosted.advice)


def test_a_smaller_compile_budget_is_proposed_before_checkpointing_where_it_fits():
    """Llama-3-8B LoRA, compiled, on a GPU between the plan's memory at budget 1 and at 0.8:
    the advice names train.compile_memory_budget and its predicted total, which the plan made
    with that setting reproduces; eager blocks get no such advice."""
    shape = [*LLAMA3_8B_LORA, "lora.target_modules=[all-linear]", "train.compile=true"]
    roomy = Hardware(gpu="H200", memory_gib=141)
    full_budget = plan_run(load_config(DEMO, shape), roomy).memory.total / GIB
    budget = plan_run(load_config(DEMO, [*shape, "train.compile_memory_budget=0.8"]), roomy)
    smaller = budget.memory.total / GIB
    assert smaller < full_budget - 2
    hardware = Hardware(gpu="H200", memory_gib=(smaller + full_budget) / 2)
    plan = plan_run(load_config(DEMO, shape), hardware)
    assert not plan.fits
    (advice,) = [a for a in plan.advice if "compile_memory_budget" in a]
    assert f"{smaller:.1f} GiB with train.compile_memory_budget: 0.8" in advice
    eager = plan_run(load_config(DEMO, [*shape, "train.compile=false"]), hardware)
    assert not any("compile_memory_budget" in a for a in eager.advice)


def test_kept_blocks_add_their_activations_and_save_their_recomputation():
    """Llama-3-8B LoRA, compiled, fully checkpointed with offloaded inputs: two blocks keeping
    their activations add exactly two compiled blocks' bytes, and the step gets shorter."""
    from tuneforge.models.cost import LoraShape, compiled_activation_bytes_per_token

    shape = [*OFFLOADED_CHECKPOINTS_8B_LORA, "train.compile=true"]
    hardware = Hardware(gpu="H200", memory_gib=141)
    checkpointed = plan_run(load_config(DEMO, shape), hardware)
    kept = plan_run(load_config(DEMO, [*shape, "train.keep_activations=2"]), hardware)
    block = compiled_activation_bytes_per_token(catalog_shape("llama-3-8b"), 0, 2, LoraShape(16))
    assert kept.memory.activations - checkpointed.memory.activations == pytest.approx(
        2 * block * 4096
    )
    assert kept.step_time_s < checkpointed.step_time_s


def test_memory_left_is_offered_to_checkpointed_blocks():
    """Fully checkpointed Llama-3-8B LoRA with room for three kept blocks within 90% of the
    GPU, not four: the advice names three and the total the plan with three predicts."""
    shape = [
        *LLAMA3_8B_LORA,
        "lora.target_modules=[all-linear]",
        "train.activation_checkpointing=full",
    ]
    roomy = Hardware(gpu="H200", memory_gib=141)
    totals = [
        plan_run(load_config(DEMO, [*shape, f"train.keep_activations={n}"]), roomy).memory.total
        / GIB
        for n in (3, 4)
    ]
    hardware = Hardware(gpu="H200", memory_gib=sum(totals) / 2 / 0.9)
    plan = plan_run(load_config(DEMO, shape), hardware)
    (advice,) = [a for a in plan.advice if "keep_activations" in a]
    assert f"{totals[0]:.1f} GiB with train.keep_activations: 3" in advice
    three = plan_run(load_config(DEMO, [*shape, "train.keep_activations=3"]), hardware)
    assert not any("keep_activations" in a for a in three.advice)  # already the most
    assert three.step_time_s < plan.step_time_s


def test_collective_traffic_counts_ring_phases_over_the_gradients_and_gathered_weights():
    """Per GPU and step on two ranks: DDP all-reduces the bf16 gradients (two phases of half the
    buffer); FSDP2 ZeRO-2 gathers the weights once and reduce-scatters fp32 gradients; ZeRO-3
    gathers for forward and backward of each micro-batch; LoRA moves only fp32 adapter
    gradients under DDP."""
    from dataclasses import replace

    from tuneforge.models.cost import LoraShape, lora_params
    from tuneforge.plan.traffic import step_traffic_bytes

    args = catalog_shape("llama-3.2-1b")
    params = args.num_params()
    ddp = Setup(args, 2, 4096, data_parallel=2, zero_stage=0)
    assert step_traffic_bytes(ddp, 4) == 2 * 0.5 * params * 2
    assert step_traffic_bytes(replace(ddp, zero_stage=2), 4) == 0.5 * (params * 2 + params * 4)
    zero3 = replace(ddp, zero_stage=3, grad_accum_steps=2)
    assert step_traffic_bytes(zero3, 2) == 0.5 * (4 * params * 2 + params * 2)
    lora = LoraShape(16, ("q_proj", "v_proj"), ())
    assert step_traffic_bytes(replace(ddp, lora=lora), 4) == lora_params(args, lora) * 4
    assert step_traffic_bytes(replace(ddp, data_parallel=1), 4) == 0.0


def test_ddp_is_advised_where_every_gpu_holds_the_whole_model():
    """A 1B full fine-tune under FSDP2 on two H200s fits replicated: DDP is proposed with both
    traffics; a 70B one does not fit replicated and keeps the ZeRO advice."""
    small = ["model.name=llama-3.2-1b", "model.dtype=bfloat16", "train.tokens_per_micro_batch=4096",
             "data.max_seq_len=4096", "parallel.strategy=fsdp", "parallel.zero_stage=2"]  # fmt: skip
    plan = plan_run(load_config(DEMO, small), Hardware(gpus=2, gpu="H200"))
    advice = [line for line in plan.advice if "parallel.strategy: ddp" in line]
    assert len(advice) == 1
    assert "2.47 GB per GPU and step (gradients only) against FSDP's 3.71 GB" in advice[0]
    assert plan.as_dict()["collective_gb_per_step"] == pytest.approx(3.707, abs=1e-3)
    large = [*small, "model.name=llama-3-70b", "train.activation_checkpointing=full"]
    plan = plan_run(load_config(DEMO, large), Hardware(gpus=8, gpu="H200"))
    assert not any("parallel.strategy: ddp" in line for line in plan.advice)
    ddp = [*small, "parallel.strategy=ddp"]
    plan = plan_run(load_config(DEMO, ddp), Hardware(gpus=2, gpu="H200"))
    assert not any("parallel.strategy: ddp" in line for line in plan.advice)


def test_auto_runs_ddp_where_every_gpu_holds_the_whole_model_and_fsdp_elsewhere(monkeypatch):
    """`parallel.strategy: auto` on several GPUs: DDP for a 1B full fine-tune on two H200s (the
    plan is then DDP's: no sharding, no DDP advice), FSDP2 for a 70B one on eight, and FSDP2
    where a ZeRO stage is asked for; the trainer decides the same way from its GPU's memory."""
    from types import SimpleNamespace

    from tuneforge.parallel.distributed import Dist
    from tuneforge.plan.strategy import resolve_dims
    from tuneforge.train import layout_choice

    small = ["model.name=llama-3.2-1b", "model.dtype=bfloat16", "train.tokens_per_micro_batch=4096",
             "data.max_seq_len=4096"]  # fmt: skip
    plan = plan_run(load_config(DEMO, small), Hardware(gpus=2, gpu="H200"))
    assert (plan.strategy, plan.zero_stage) == ("ddp", 0)
    assert plan.strategy_reason.startswith("every GPU holds the whole model")
    assert not any("parallel.strategy: ddp" in line for line in plan.advice)
    assert plan.collective_gb_per_step == pytest.approx(2.47, abs=0.01)
    large = [*small, "model.name=llama-3-70b", "train.activation_checkpointing=full"]
    plan = plan_run(load_config(DEMO, large), Hardware(gpus=8, gpu="H200"))
    assert plan.strategy == "fsdp" and plan.zero_stage == 3
    assert "would need" in plan.strategy_reason
    staged = plan_run(load_config(DEMO, [*small, "parallel.zero_stage=2"]), Hardware(gpus=2))
    assert (staged.strategy, staged.zero_stage) == ("fsdp", 2)
    assert plan_run(load_config(DEMO, small), Hardware(gpus=1)).strategy == "single"

    parallel = load_config(DEMO, small).parallel
    assert resolve_dims(parallel, 2, 16.0, None)[0].strategy == "fsdp"  # memory unknown (CPU)
    assert resolve_dims(parallel, 2, 16.0, 18.0)[0].strategy == "fsdp"  # over 85% of the GPU
    assert resolve_dims(parallel, 2, 16.0, 80.0)[0].strategy == "ddp"

    config = load_config(DEMO, small)
    cpu = Dist(rank=0, world_size=2)
    assert layout_choice.choose_dims(config, cpu).strategy == "fsdp"
    gpu = Dist(rank=0, world_size=2, device=torch.device("cuda", 0))
    properties = SimpleNamespace(total_memory=141 * GIB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    assert layout_choice.choose_dims(config, gpu).strategy == "ddp"
    properties.total_memory = 16 * GIB
    assert layout_choice.choose_dims(config, gpu).strategy == "fsdp"

    # eager attention holds each document's scores: the data's own lengths decide, as in the plan
    eager = load_config(DEMO, [*small, "model.attention=eager"])
    short = RecordLengths([300, 450, 200] * 50)
    hardware = Hardware(gpus=2, gpu="H100")
    plan = plan_run(eager, hardware, short)
    assert plan.strategy == "ddp"
    assert plan.memory.total / GIB == pytest.approx(replicated_memory_gib(eager, hardware, short))
    long_gib = replicated_memory_gib(eager, hardware)
    short_gib = replicated_memory_gib(eager, hardware, short)
    assert short_gib < 0.9 * long_gib
    properties.total_memory = (short_gib + long_gib) / 2 / 0.85 * GIB
    assert layout_choice.choose_dims(eager, gpu).strategy == "fsdp"
    assert layout_choice.choose_dims(eager, gpu, short).strategy == "ddp"


@pytest.mark.slow
def test_a_step_waits_for_its_slowest_rank_as_the_loader_deals_the_epoch():
    """Long-tailed documents on eight ranks: the planner's wait factor equals the one counted
    from the loaders' own epoch orders; balancing lowers it; the step time grows by it, and the
    planner proposes data.balance_ranks."""
    from tuneforge.data.packing import PackedLoader
    from tuneforge.data.token_store import make_example
    from tuneforge.models.catalog import catalog_shape
    from tuneforge.plan.rank_wait import slowest_rank_factor
    from tuneforge.plan.workload import epoch_workload

    rng = np.random.default_rng(5)
    lengths = [int(x) for x in rng.lognormal(np.log(900), 1.0, 3000).clip(16, 8192)]
    args = catalog_shape("llama-3.2-1b")
    epoch = epoch_workload(args, lengths, 8192, "ffd", None)
    examples = [make_example(list(range(n)), [True] * n) for n in lengths]
    factors = {}
    for balance in (False, True):
        loaders = [PackedLoader(examples, 8192, 3, "ffd", r, 8, balance=balance) for r in range(8)]
        orders = [loader.epoch_order(0) for loader in loaders]
        steps = len(orders[0]) // 2  # two micro-batches a step
        work = [
            [sum(epoch.micro_batch_flops[i] for i in order[2 * s : 2 * s + 2]) for order in orders]
            for s in range(steps)
        ]
        counted = sum(max(w) for w in work) / sum(sum(w) / 8 for w in work)
        factor = slowest_rank_factor(
            epoch.micro_batch_flops, epoch.micro_batch_attention, 8, 2, 3, balance
        )
        assert factor == pytest.approx(counted, rel=1e-12)
        factors[balance] = factor
    assert factors[False] > factors[True] > 1.0
    assert (
        slowest_rank_factor(epoch.micro_batch_flops, epoch.micro_batch_attention, 1, 2, 3, False)
        == 1.0
    )

    config = load_config(DEMO, ["model.name=llama-3.2-1b", "model.dtype=bfloat16",
                                "data.max_seq_len=8192", "train.tokens_per_micro_batch=8192",
                                "train.grad_accum_steps=2", "train.seed=3"])  # fmt: skip
    one = plan_run(config, Hardware(gpus=1, gpu="H200"), RecordLengths(lengths))
    eight = plan_run(config, Hardware(gpus=8, gpu="H200"), RecordLengths(lengths))
    assert one.slowest_rank_factor == 1.0
    # the mean rank's step is one GPU's plus its collectives; the step waits for the slowest
    collectives = sum(v for k, v in eight.step_parts.items() if k.startswith("collective"))
    assert collectives > 0
    mean_rank = eight.step_time_s / eight.slowest_rank_factor
    assert mean_rank == pytest.approx(one.step_time_s + collectives)
    assert eight.balanced_slowest_rank_factor < eight.slowest_rank_factor
    assert any("data.balance_ranks: true" in line for line in eight.advice)


def test_what_ifs_use_the_plans_step_time_model_recomputation_included():
    hardware = Hardware(gpus=1, gpu="H200")
    plan = plan_config(
        load_config(DEMO, LLAMA3_8B_LORA), hardware, None, ["train.activation_checkpointing=full"]
    )
    (item,) = plan.what_if
    changed = plan_run(
        load_config(DEMO, [*LLAMA3_8B_LORA, "train.activation_checkpointing=full"]), hardware
    )
    assert item["speedup"] == pytest.approx(plan.step_time_s / changed.step_time_s)
    # every block's products once more (LoRA: forward and input gradient, now a third pass)
    assert 0.6 < item["speedup"] < 0.8
    ratio = changed.step_parts["gemm bf16"] / plan.step_parts["gemm bf16"]
    assert 1.4 < ratio < 1.5
    # a change of the micro-batch is judged per token, not per (longer) step
    (bigger,) = plan_config(
        load_config(DEMO, LLAMA3_8B_LORA), hardware, None, ["train.tokens_per_micro_batch=8192"]
    ).what_if
    assert bigger["speedup"] == pytest.approx(1.0, abs=0.01)


def test_a_plan_for_the_cpu_uses_its_cores_and_host_memory(monkeypatch):
    from tuneforge.api.planning import target_hardware as _target
    from tuneforge.hardware.cpu import cpu_cores, host_memory_gib
    from tuneforge.plan.prediction import CPU

    cpu = Hardware(gpu=CPU)
    assert cpu.gpu_memory_gib == pytest.approx(host_memory_gib())
    assert cpu.peak_tflops == pytest.approx(cpu_cores() * 0.05)
    plan = plan_run(load_config(DEMO, []), cpu)
    assert 0.01 < plan.step_time_s < 10  # on an H100 the demo's step is predicted at ~0 s
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _target(None)[0] == CPU and "no GPU here" in _target(None)[1]
    assert _target("cpu")[0] == CPU and _target("H200") == ("H200", "H200")


def test_no_micro_batch_that_fits_is_said_as_such():
    plan = plan_run(
        load_config(DEMO, ["model.name=llama-3-70b", "model.dtype=bfloat16"]),
        Hardware(gpus=1, gpu="H100"),
    )
    assert not plan.fits and plan.largest_micro_batch_tokens == 0
    assert not any("about 0 tokens" in line for line in plan.advice)
    assert any(line.startswith("no micro-batch fits") for line in plan.advice)


def test_the_plan_states_moe_against_dense_per_token_and_per_model():
    """The report's second finding: a MoE with a narrower model can cost less per token than a
    dense model with fewer parameters; compare active dimensions, not totals."""
    hardware = Hardware(gpus=8, gpu="MI250X")
    moe = plan_run(
        load_config(DEMO, ["model.name=qwen3-30b-a3b", "model.dtype=bfloat16"]), hardware
    )
    dense = plan_run(load_config(DEMO, ["model.name=qwen3-8b", "model.dtype=bfloat16"]), hardware)
    assert moe.model["params_b"] > 3 * dense.model["params_b"]
    assert moe.model["active_params_b"] < dense.model["active_params_b"]
    assert moe.per_token["training_gflop"] < dense.per_token["training_gflop"]
    assert moe.per_token["attention_kib_per_layer"] < dense.per_token["attention_kib_per_layer"]
    assert moe.model["dim"] < dense.model["dim"]
    assert {"per_token", "model"} <= set(moe.as_dict())


def step_flops(overrides: list[str]) -> float:
    """The FLOPs the step-time model counts in one step of `max_seq_len` documents."""
    from tuneforge.plan.planner import run_model_args, sampled_steps, setup_of
    from tuneforge.plan.step_estimate import configured_work

    config = load_config(DEMO, overrides)
    setup = setup_of(config, run_model_args(config), Hardware(gpu="H100"), 4096)
    work = configured_work(config, setup, sampled_steps(config, None)[0])
    return sum(work.gemm_flops.values()) + work.attention_flops


def test_a_preference_run_adds_the_references_forward_and_its_frozen_copy_or_one_pass():
    from tuneforge.assets import DEMO_DATA_DIR
    from tuneforge.models.cost import forward_flops_per_token, training_flops_per_token
    from tuneforge.plan.planner import run_model_args

    hardware = Hardware(gpus=1, gpu="H100")
    pairs = f"[{{path: {DEMO_DATA_DIR / 'pairs_train.jsonl'}, format: preference}}]"
    common = ["model.name=qwen3-8b", "model.dtype=bfloat16", "data.max_seq_len=4096"]
    common += ["train.tokens_per_micro_batch=4096", "train.max_steps=10", "data.eval=[]"]
    common += ["eval.every_steps=null"]
    common += ["eval.num_samples=0"]

    def plans(*settings: str):
        sft = plan_config(load_config(DEMO, [*common, *settings]), hardware, None, [])
        dpo = plan_config(
            load_config(DEMO, [*common, *settings, "train.objective=dpo", f"data.train={pairs}"]), hardware,
            None, [],
        )  # fmt: skip
        return sft, dpo

    sft, dpo = plans("lora.enabled=false")  # full fine-tuning: a frozen copy
    shape = run_model_args(load_config(DEMO, ["model.name=qwen3-8b"]))
    copy = shape.num_params() * 2  # bf16
    assert dpo.memory.weights - sft.memory.weights == pytest.approx(copy)
    ratio = 1 + forward_flops_per_token(shape, 4096) / training_flops_per_token(shape, 4096)
    sft_config = [*common, "lora.enabled=false"]
    dpo_config = [*sft_config, "train.objective=dpo", f"data.train={pairs}"]
    assert step_flops(dpo_config) / step_flops(sft_config) == pytest.approx(ratio)
    assert dpo.step_time_s > sft.step_time_s
    assert "frozen_copy" in dpo.objective and "frozen copy" in dpo.objective
    sft, dpo = plans("lora.enabled=true")  # a fresh adapter: the base itself, no copy
    assert dpo.memory.weights == sft.memory.weights and dpo.step_time_s > sft.step_time_s
    assert "adapters_off" in dpo.objective and "frozen copy" not in dpo.objective
    assert sft.objective is None
    sft, dpo = plans("lora.enabled=false", "dpo.reference=precomputed")  # one pass, before
    assert dpo.memory.weights == sft.memory.weights and dpo.step_time_s == sft.step_time_s
    assert "before training" in dpo.objective and "none per step" in dpo.objective


def test_a_distillation_run_adds_its_teachers_weights_and_forward_unless_its_logits_are_cached():
    from tuneforge.models.cost import forward_flops_per_token, training_flops_per_token
    from tuneforge.plan.planner import run_model_args, section_model_args

    hardware = Hardware(gpus=1, gpu="H100")
    common = ["model.name=qwen3-1.7b", "model.dtype=bfloat16", "data.max_seq_len=4096"]
    common += ["train.tokens_per_micro_batch=4096", "train.max_steps=10", "lora.enabled=false"]
    sft = plan_config(load_config(DEMO, common), hardware, None, [])
    teacher = ["train.objective=distill", "distill.teacher.name=qwen3-8b"]
    distill = plan_config(load_config(DEMO, [*common, *teacher]), hardware, None, [])
    teacher_args = section_model_args(load_config(DEMO, teacher).distill.teacher)
    student_args = run_model_args(load_config(DEMO, common))
    assert distill.memory.weights - sft.memory.weights == pytest.approx(
        teacher_args.num_params() * 2
    )
    ratio = 1 + forward_flops_per_token(teacher_args, 4096) / training_flops_per_token(
        student_args, 4096
    )
    assert step_flops([*common, *teacher]) / step_flops(common) == pytest.approx(ratio)
    assert distill.step_time_s > sft.step_time_s
    assert "distill forward_kl: the teacher (online)" in distill.objective
    # under FSDP2 on 4 GPUs its blocks are sharded, its embedding, head and norm whole
    four = Hardware(gpus=4, gpu="H100")
    sharded = [*common, "parallel.strategy=fsdp"]
    sft4 = plan_config(load_config(DEMO, sharded), four, None, [])
    distill4 = plan_config(load_config(DEMO, [*sharded, *teacher]), four, None, [])
    root = teacher_args.vocab_size * teacher_args.dim * 2 + teacher_args.dim  # untied
    per_gpu = ((teacher_args.num_params() - root) / 4 + root) * 2
    assert distill4.memory.weights - sft4.memory.weights == pytest.approx(per_gpu)
    # a 4-bit teacher: its linears as NF4 codes and absmaxes (and a dequantisation buffer)
    from tuneforge.plan.base_weights import BaseWeights, frozen_linears

    four_bit = plan_config(
        load_config(DEMO, [*common, *teacher, "distill.teacher.quantize=nf4"]), hardware, None, []
    )
    linears = frozen_linears(teacher_args)[0]
    held = sum(BaseWeights("bnb-nf4").bytes(teacher_args, 2))
    assert four_bit.memory.weights - sft.memory.weights == pytest.approx(
        (teacher_args.num_params() - linears) * 2 + held
    )
    cached = ["distill.teacher_logits=cached", "distill.top_k=64"]
    distill = plan_config(load_config(DEMO, [*common, *teacher, *cached]), hardware, None, [])
    assert distill.memory.weights == sft.memory.weights
    assert distill.step_time_s == sft.step_time_s
    assert "teacher (cached)" in distill.objective and "512 bytes per supervised token" in (
        distill.objective
    )


@pytest.mark.parametrize(
    ("master_weights", "extra_bytes"), [(False, 0), (True, 8), ("compensated", 6)]
)
def test_the_optimizer_counts_what_master_weights_keep(master_weights, extra_bytes):
    """Against pure bf16 (m and v in bf16: 4 bytes a parameter): fp32 masters and fp32 m and v
    add 8 bytes, a bf16 remainder and fp32 m and v 6 — as measured on the 1B shape (+8.0, +6.0
    bytes a parameter, bench/RESULTS.md)."""
    one_gpu = Hardware(gpus=1, gpu="H100")
    args = ["model.name=llama-3.2-1b", "model.dtype=bfloat16"]
    pure = plan_run(load_config(DEMO, [*args, "precision.master_weights=false"]), one_gpu)
    plan = plan_run(
        load_config(DEMO, [*args, f"precision.master_weights={master_weights}"]), one_gpu
    )
    params = catalog_shape("llama-3.2-1b").num_params()
    assert plan.memory.optimizer - pure.memory.optimizer == pytest.approx(extra_bytes * params)
