"""`doctor oom` and `doctor log` on the message and log formats they meet in practice."""

import re
from pathlib import Path

import pytest

from tuneforge.config import load_config
from tuneforge.doctor.log_scan import scan_log
from tuneforge.doctor.oom import allocator_variable, diagnose
from tuneforge.models.catalog import catalog_shape

CUDA_FRAGMENTED = """Traceback (most recent call last):
  File "train.py", line 12, in <module>
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 79.15 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has \
77.90 GiB memory in use. Of the allocated memory 70.50 GiB is allocated by PyTorch, and 6.20 GiB \
is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting \
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for \
Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"""

HIP_PRESSURE = """torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.95 GiB. GPU 0 has \
a total capacity of 63.98 GiB of which 1.16 GiB is free. Of the allocated memory 61.34 GiB is \
allocated by PyTorch, and 820.00 MiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid \
fragmentation."""

CUDA_OLD = """RuntimeError: CUDA out of memory. Tried to allocate 256.00 MiB (GPU 0; 15.78 GiB total \
capacity; 14.56 GiB already allocated; 3.44 MiB free; 14.75 GiB reserved in total by PyTorch) If \
reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation."""

CUDA_OLD_FRAGMENTED = """RuntimeError: CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; \
39.59 GiB total capacity; 30.10 GiB already allocated; 1.02 GiB free; 37.20 GiB reserved in total \
by PyTorch)"""

# "Process N" lines are the other processes on the GPU; this process has its own line
OTHER_PROCESSES = """torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 \
has a total capacity of 79.15 GiB of which 300.00 MiB is free. Process 4242 has 40.00 GiB memory \
in use. Including non-PyTorch memory, this process has 38.80 GiB memory in use. Of the allocated \
memory 37.50 GiB is allocated by PyTorch, and 600.00 MiB is reserved by PyTorch but unallocated."""

SHARED_GPU_WRAPPED = """torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
GPU 0 has a total capacity of 79.15 GiB of which 512.00 MiB is free.
Process 1201 has 40.00 GiB memory in use.
Process 1377 has 22.40 GiB memory in use.
Including non-PyTorch memory, this process has 16.00 GiB memory in use. Of the allocated memory
14.10 GiB is allocated by PyTorch, and 2.40 GiB is reserved by PyTorch but unallocated."""

TORCH_2_1 = """torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.37 GiB. GPU 0 \
has a total capacty of 79.11 GiB of which 2.93 GiB is free. Including non-PyTorch memory, this \
process has 76.17 GiB memory in use. Of the allocated memory 68.61 GiB is allocated by PyTorch, \
and 5.63 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large \
try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management \
and PYTORCH_CUDA_ALLOC_CONF"""


def test_current_cuda_message_with_much_reserved_is_fragmentation():
    report = diagnose(CUDA_FRAGMENTED, "2.5.1")
    assert report.kind == "fragmentation" and report.platform == "cuda"
    assert report.requested_gib == 2.0 and report.total_gib == 79.15 and report.free_gib == 1.23
    assert report.allocated_gib == 70.5 and report.reserved_unallocated_gib == 6.2
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in report.actions[0]
    # the variable the message names is the failed run's torch's own, whatever runs here
    assert "export PYTORCH_CUDA_ALLOC_CONF=" in diagnose(CUDA_FRAGMENTED, "2.10.0").actions[0]


def test_hip_message_with_little_reserved_is_pressure():
    report = diagnose(HIP_PRESSURE, "2.5.1")
    assert report.kind == "pressure" and report.platform == "hip"
    assert report.reserved_unallocated_gib == pytest.approx(820 / 1024)
    assert any("activation checkpointing" in action for action in report.actions)
    assert any("train.compile_memory_budget: 0.8" in action for action in report.actions)


def test_pre_2023_messages_are_read():
    old = diagnose(CUDA_OLD)
    assert old.kind == "pressure"
    assert old.requested_gib == pytest.approx(0.25) and old.total_gib == 15.78
    assert old.reserved_unallocated_gib == pytest.approx(14.75 - 14.56)
    fragmented = diagnose(CUDA_OLD_FRAGMENTED, "1.13.1")
    assert fragmented.kind == "fragmentation"
    assert fragmented.reserved_unallocated_gib == pytest.approx(7.1)


def test_memory_of_other_processes_is_named():
    report = diagnose(OTHER_PROCESSES)
    assert report.kind == "other_processes" and report.other_processes_gib == pytest.approx(40.0)
    assert report.this_process_gib == pytest.approx(38.8)


def test_a_shared_gpu_is_read_from_a_wrapped_message():
    report = diagnose(SHARED_GPU_WRAPPED)
    assert report.other_processes_gib == pytest.approx(62.4) and report.this_process_gib == 16.0
    assert report.kind == "other_processes" and "62.4 GiB" in report.actions[0]
    assert report.total_gib == 79.15 and report.requested_gib == 2.0


def test_torch_2_1_wording_is_read_and_advised_for_its_version():
    report = diagnose(TORCH_2_1, "2.1.2")
    assert report.total_gib == 79.11 and report.kind == "fragmentation"
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in report.actions[0]
    hip = diagnose(HIP_PRESSURE.replace("820.00 MiB", "5.00 GiB"), "2.10.0")
    assert "export PYTORCH_HIP_ALLOC_CONF=" in hip.actions[0]  # as the HIP message says


def test_out_of_memory_without_the_allocators_figures_is_still_named():
    runtime = diagnose("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be ...")
    assert runtime.kind == "runtime" and runtime.platform == "cuda"
    assert "without the allocator's figures" in runtime.actions[0]
    assert diagnose("RuntimeError: HIP error: out of memory").platform == "hip"
    host = diagnose(
        "RuntimeError: [enforce fail at alloc_cpu.cpp:83] data. DefaultCPUAllocator: not enough "
        "memory: you tried to allocate 34359738368 bytes."
    )
    assert host.kind == "host" and "host memory" in host.actions[0]
    killed = diagnose("slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0.")
    assert killed.kind == "host"


def test_an_oom_while_resuming_says_so_and_no_message_is_unknown():
    report = diagnose("loading checkpoint via dcp.load\n" + HIP_PRESSURE)
    assert report.during_resume and "checkpoint" in report.actions[-1]
    assert diagnose("Segmentation fault").kind == "unknown"


def test_allocator_variable_follows_platform_and_version():
    assert allocator_variable("hip", "2.4.0") == "PYTORCH_HIP_ALLOC_CONF"
    assert allocator_variable("cuda", "2.8.0+cu128") == "PYTORCH_CUDA_ALLOC_CONF"
    assert allocator_variable("hip", "2.9.0+rocm6.4") == "PYTORCH_ALLOC_CONF"


LUMI_LOG = """[rank0]:[W801 10:00:01] Warning: expandable_segments not supported on this platform
[rank1]:[W801 10:00:01] Warning: expandable_segments not supported on this platform
[rank2]:[W801 10:00:01] Warning: expandable_segments not supported on this platform
[W801 10:00:02] Warning: PYTORCH_HIP_ALLOC_CONF is deprecated, use PYTORCH_ALLOC_CONF instead
  0%|          | 1/6060 [02:05<210:22:00, 125.00s/it]
  0%|          | 2/6060 [04:10<210:20:00, 125.00s/it]
{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.0}
  0%|          | 3/6060 [06:15<210:18:00, 125.10s/it]
[rank3]:[E801 12:00:00] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=99, OpType=ALLREDUCE)
"""

RESTARTED_CHAIN = """step 100/600  loss 1.2  lr 1e-4  grad_norm 0.5  900 tok/s
step 200/600  loss 1.1  lr 1e-4  grad_norm 0.5  900 tok/s
step 1/600  loss 3.2  lr 1e-6  grad_norm 2.0  900 tok/s
step 2/600  loss 3.1  lr 2e-6  grad_norm 2.0  900 tok/s
"""

MEGATRON = """ iteration      100/    6060 | consumed samples: 800 | elapsed time per iteration (ms): 2400.0 |
 iteration      200/    6060 | consumed samples: 1600 | elapsed time per iteration (ms): 2500.0 |
 skipped iterations:   2 | number of nan iterations:   0 |
"""


def codes(report):
    return {finding.code: finding for finding in report.findings}


def test_a_lumi_style_log_shows_every_problem():
    report = scan_log(LUMI_LOG, time_limit_s=38 * 3600)
    found = codes(report)
    assert found["expandable_segments_inactive"].count == 3
    assert "ranks: 0, 1, 2" in found["expandable_segments_inactive"].message
    assert found["allocator_env_deprecated"].count == 1
    assert found["nan_or_skipped_iterations"].count == 1
    assert found["collective_error"].count == 1
    # the mean of the steps' times: N steps take N times the mean
    assert report.step_time_s == pytest.approx((125.0 + 125.0 + 125.1) / 3)
    assert report.total_steps == 6060
    # 6060 steps at 125 s is about 210 h: six jobs of 38 h
    assert (
        "210 h" in found["eta_exceeds_limit"].message
        and "about 6 jobs" in found["eta_exceeds_limit"].advice
    )


def test_a_chain_that_restarted_from_step_zero_is_caught():
    found = codes(scan_log(RESTARTED_CHAIN))
    assert "after reaching step 200" in found["restart_from_step_zero"].message


def test_megatron_iterations_and_skips():
    report = scan_log(MEGATRON, time_limit_s=4 * 3600)
    assert report.steps_seen == 200 and report.step_time_s == pytest.approx(2.45)
    found = codes(report)
    assert "nan_or_skipped_iterations" in found and "eta_exceeds_limit" in found
    assert "restart_from_step_zero" not in found


def test_a_gpu_held_down_by_heat_is_found_with_its_rank():
    log = (
        "step 40/600  loss 1.2\n"
        "WARNING step 45: rank 3's GPU has had its clock held down by thermal at 5 readings in a "
        "row (SM clock 1,100 of 1,980 MHz, 450 W): every step of the run is slower for it.\n"
        "    HW Slowdown                       : Active\n"
        "    SW Power Cap                      : Active\n"
    )
    found = codes(scan_log(log))["gpu_clock_slowdown"]
    assert found.count == 2 and "ranks: 3, ?" in found.message
    assert "sbatch --exclude" in found.advice
    assert "gpu_clock_slowdown" not in codes(scan_log("    SW Power Cap : Active\n"))


def test_a_clean_log_has_no_findings():
    assert scan_log("step 1/10  loss 2.0\nstep 2/10  loss 1.9\n").findings == []


def qwen3_8b_config(tmp_path, *sections: str) -> Path:
    """A run configuration on the demo's data with documents up to 8,192 tokens."""
    config = tmp_path / "run.yaml"
    extends = "extends: " + str(Path("examples/demo.yaml").resolve())
    config.write_text("\n".join([extends, "data: {max_seq_len: 8192}", *sections]) + "\n")
    return config


def test_with_a_config_each_remedy_is_sized_by_the_planner(tmp_path):
    from tuneforge.doctor.oom_plan import remedies

    config = qwen3_8b_config(
        tmp_path,
        "model: {name: qwen3-8b, dtype: bfloat16}",
        "train: {tokens_per_micro_batch: 16384}",
        "parallel: {strategy: fsdp, zero_stage: 2}",
    )
    lines = remedies(load_config(config, []), gpus=8, capacity_gib=63.98)
    assert lines[0].startswith("the planner predicts")
    checkpointing = next(line for line in lines if line.startswith("activation checkpointing"))
    assert checkpointing.endswith(", fits")
    assert any(line.startswith("ZeRO-3") for line in lines)
    assert any("micro-batch of 8192 tokens" in line for line in lines)
    assert not any("memory budget" in line for line in lines)  # eager blocks
    split = next(line for line in lines if line.startswith("tensor parallelism over 2 GPUs"))
    before, after = (float(x) for x in re.findall(r"([\d.]+) -> ([\d.]+) GiB", split)[0])
    assert after < before  # each GPU keeps half of every layer's activations
    assert not any(line.startswith("expert parallelism") for line in lines)  # a dense model
    compiled = remedies(load_config(config, ["train.compile=true"]), gpus=8, capacity_gib=63.98)
    budget = next(line for line in compiled if line.startswith("a memory budget of 0.8"))
    before, after = (float(x) for x in re.findall(r"([\d.]+) -> ([\d.]+) GiB", budget)[0])
    assert after < before


def test_a_full_fine_tune_over_master_weights_is_offered_the_lighter_ways(tmp_path):
    """Qwen3-8B on one GPU: fp32 masters and fp32 m and v are 12 bytes a parameter; a bf16
    remainder with fp32 m and v 10, bf16 m and v 4 (8.2 B parameters: -15.3 and -61.1 GiB)."""
    from tuneforge.doctor.oom_plan import remedies

    config = qwen3_8b_config(
        tmp_path,
        "model: {name: qwen3-8b, dtype: bfloat16}",
        "train: {tokens_per_micro_batch: 8192}",
    )
    lines = remedies(load_config(config, []), gpus=1, capacity_gib=139.8)
    saved = {}
    for name in ("compensated", "false"):
        line = next(line for line in lines if f"precision.master_weights: {name}" in line)
        saved[name] = float(re.findall(r"\(([-+][\d.]+)\)", line)[0])
    params = catalog_shape("qwen3-8b").num_params()
    assert saved["compensated"] == pytest.approx(-2 * params / 2**30, abs=0.06)
    assert saved["false"] == pytest.approx(-8 * params / 2**30, abs=0.06)
    assert not any(
        "master_weights" in line
        for line in remedies(load_config(config, ["lora.enabled=true"]), 1, 80.0)
    )


class _Board:
    """NVML's part of `Nvml` for one GPU at rest."""

    max_sm_clock_mhz, default_power_limit_w = 1980.0, 700.0

    def __init__(self, power_limit_w: float, reasons: int):
        self.power_limit_w, self.reasons = power_limit_w, reasons

    def read(self):
        from tuneforge.hardware.nvml import Sample

        return Sample(345.0, 80.0, self.reasons)


def test_a_lowered_power_limit_and_a_hot_gpu_at_rest_are_warned_of():
    from tuneforge.doctor.env import power_findings

    clocks, warnings = power_findings(2, _Board(500.0, 0x20))  # 0x20: thermal slowdown
    assert clocks == {
        "power_limit_w": 500.0,
        "default_power_limit_w": 700.0,
        "sm_clock_max_mhz": 1980.0,
        "clock_held_down_by": ["thermal"],
    }
    assert len(warnings) == 2
    assert "GPU 2's power limit is 500 W, below its default 700 W" in warnings[0]
    assert "GPU 2 has its clock held down by thermal now (345 of 1,980 MHz" in warnings[1]


def test_a_gpu_at_its_default_limit_and_not_held_down_gets_no_warning():
    from tuneforge.doctor.env import power_findings

    assert power_findings(0, _Board(700.0, 0x1))[1] == []  # 0x1: idle, not a slowdown
    assert power_findings(0, _Board(690.0, 0x0))[1] == []  # within 5% of the default


def test_remedies_size_memory_from_the_datas_lengths_as_plan_does(tmp_path):
    from tuneforge.config import load_config
    from tuneforge.data.length_policy import RecordLengths
    from tuneforge.doctor.oom_plan import remedies
    from tuneforge.hardware.gpus import GIB
    from tuneforge.plan.planner import plan_run
    from tuneforge.plan.prediction import Hardware

    config = qwen3_8b_config(
        tmp_path,
        "model: {name: qwen3-8b, dtype: bfloat16, attention: eager}",
        "train: {tokens_per_micro_batch: 8192}",
    )
    records = RecordLengths([300] * 2000, None)
    lines = remedies(load_config(config, []), gpus=1, capacity_gib=139.0, records=records)
    planned = plan_run(load_config(config, []), Hardware(gpus=1, memory_gib=139.0), records)
    assert (
        lines[0]
        == f"the planner predicts {planned.memory.total / GIB:.1f} GiB per GPU for this configuration"
    )
    assert (
        lines[0] != remedies(load_config(config, []), gpus=1, capacity_gib=139.0)[0]
    )  # documents of 8192
    assert any("micro-batch of 4096 tokens and data.max_seq_len 4096" in line for line in lines)


def test_restarts_a_log_states_are_caught():
    hf = (
        "{'loss': 1.1, 'learning_rate': 2e-05, 'epoch': 0.4}\n"
        "***** Running training *****\n"
        "  Continuing training from checkpoint, will skip to saved global_step\n"
        "  Continuing training from epoch 0\n"
        "  Continuing training from global step 0\n"
    )
    found = codes(scan_log(hf))["restart_from_step_zero"]
    assert "Continuing training from global step 0" in found.message
    deepspeed = (
        "[WARNING] [engine.py:2903:load_checkpoint] Unable to find latest file at "
        "/scratch/run/checkpoints/latest, if trying to load latest checkpoint please ensure "
        "this file exists or pass an explicit checkpoint tag when loading a checkpoint.\n"
    )
    assert "restart_from_step_zero" in codes(scan_log(deepspeed))
    assert "restart_from_step_zero" not in codes(
        scan_log("  Continuing training from global step 400\n")
    )


def test_step_times_are_read_in_the_unit_each_format_prints():
    fast_tqdm = "".join(f" {i}/60000 [00:{i:02d}<2:00:00,  2.00it/s]\n" for i in range(1, 40))
    report = scan_log(fast_tqdm, time_limit_s=4 * 3600)
    assert report.step_time_s == pytest.approx(0.5) and report.total_steps == 60000
    assert "eta_exceeds_limit" in codes(report)  # 60,000 steps at 0.5 s is 8.3 h
    slow_tqdm = "  1%|          | 30/2000 [1:02:30<68:24:10, 125.00s/it]\n"
    assert scan_log(slow_tqdm).step_time_s == pytest.approx(125.0)
    megatron = " iteration      10/    100 | elapsed time per iteration (ms): 85.0 |\n"
    assert scan_log(megatron).step_time_s == pytest.approx(0.085)
    mixed = slow_tqdm + megatron.replace("85.0", "125000.0")
    assert scan_log(mixed).step_time_s == pytest.approx(125.0)


def test_a_large_log_is_read_as_a_stream_in_one_pass():
    """Every line once: with 100,000 steps, a scan that looks back over the steps seen takes
    minutes."""
    lines = (f"step {i % 50_000 + 1}/50000  loss 1.0  step_s: 0.25\n" for i in range(100_000))
    report = scan_log(lines)
    assert report.steps_seen == 50_000 and report.step_time_s == pytest.approx(0.25)
    assert codes(report)["restart_from_step_zero"].count == 1


def test_a_lora_run_is_offered_its_base_in_fp8_sized_by_the_planner(tmp_path):
    from tuneforge.doctor.oom_plan import remedies
    from tuneforge.models.catalog import catalog_shape
    from tuneforge.plan.base_weights import frozen_linears
    from tuneforge.plan.memory import FP8_BASE_RESERVE_GIB

    model, batch = (
        "model: {name: qwen3-8b, dtype: bfloat16}",
        "train: {tokens_per_micro_batch: 8192}",
    )
    config = qwen3_8b_config(tmp_path, model, batch, "lora: {enabled: true}")
    line = next(
        line for line in remedies(load_config(config, []), 1, 24.0) if "only in FP8" in line
    )
    before, after = (float(x) for x in re.findall(r"([\d.]+) -> ([\d.]+) GiB", line)[0])

    weights = frozen_linears(catalog_shape("qwen3-8b"))[0]
    # a byte less per weight, less the cached blocks FP8 products hold
    assert before - after == pytest.approx(weights / 2**30 - FP8_BASE_RESERVE_GIB, abs=0.1)
    done = remedies(
        load_config(config, ["precision.fp8=e4m3", "precision.fp8_base_weights=true"]), 1, 24.0
    )
    assert not any("only in FP8" in line for line in done)
    full = qwen3_8b_config(tmp_path, model, batch)
    assert not any("only in FP8" in line for line in remedies(load_config(full, []), 1, 24.0))


def test_qlora_is_proposed_for_a_lora_run_with_the_memory_it_saves(tmp_path):
    """A LoRA run on an 8B base that does not fit a 16 GiB card: the 4-bit base saves the
    base's 3/4, sized by the planner; never proposed for full fine-tuning or once quantised."""
    from tuneforge.doctor.oom_plan import remedies

    config = qwen3_8b_config(
        tmp_path,
        "model: {name: qwen3-8b, dtype: bfloat16}",
        "lora: {enabled: true}",
        "train: {tokens_per_micro_batch: 8192, activation_checkpointing: full}",
    )
    lines = remedies(load_config(config, []), gpus=1, capacity_gib=16.0)
    qlora = next(line for line in lines if line.startswith("QLoRA"))
    before, after = (float(x) for x in re.findall(r"([\d.]+) -> ([\d.]+) GiB", qlora)[0])
    assert before > 16.0 and after < 16.0 and qlora.endswith(", fits")
    assert before - after > 0.7 * 7.0  # most of the ~7.6 GiB of frozen linears in bf16
    assert not any(
        line.startswith("QLoRA")
        for line in remedies(load_config(config, ["lora.enabled=false"]), 1, 16.0)
    )
    quantised = remedies(load_config(config, ["model.quantize=nf4"]), gpus=1, capacity_gib=16.0)
    assert not any(line.startswith("QLoRA") for line in quantised)
