"""What to do about each kind of out-of-memory failure `doctor oom` tells apart."""

PRESSURE_ACTIONS = [
    "memory pressure: the tensors themselves do not fit",
    "with train.compile, first train.compile_memory_budget: 0.8: the compiled blocks make "
    "their cheapest activations again in backward (a little slower, much less memory)",
    "make sure activation checkpointing is on (train.activation_checkpointing: full, or "
    "selective with a smaller checkpoint_every)",
    "lower data.max_seq_len (to the p99 of your data: `tuneforge data inspect`) or "
    "train.tokens_per_micro_batch, keeping the global batch with grad_accum_steps",
    "shard more: parallel.strategy: fsdp with zero_stage: 3, or more GPUs, or split each layer "
    "(parallel.tensor_parallel) or the experts (parallel.expert_parallel) between GPUs; "
    "`tuneforge plan CONFIG --gpus N` predicts each setting's memory and proposes a layout",
]

HOST_ACTIONS = [
    "host memory, not GPU memory, ran out (the process or the node's RAM: the kernel's OOM killer "
    "or the CPU allocator)",
    "host memory goes to pinned buffers for offloading (train.offload_checkpoints, "
    "train.offload_activations, train.offload_embedding), to data loading and tokenising "
    "(data.tokenize_workers) and to whole checkpoints read at once: offload fewer blocks or "
    "tokenise with fewer workers",
    "under SLURM ask for more memory per job (--mem or --mem-per-gpu)",
]


def fragmentation_actions(unallocated_gib: float, variable: str) -> list[str]:
    return [
        f"{unallocated_gib:.1f} GiB is reserved but unallocated: the allocator's cache is "
        "fragmented, the model fits. Do not shrink the batch; enable expandable segments: "
        f"export {variable}=expandable_segments:True",
        "check that it takes effect: `tuneforge doctor env` probes it, and `tuneforge doctor log` "
        "finds 'expandable_segments not supported' warnings (some ROCm builds ignore the "
        "setting, per rank)",
    ]


def runtime_actions(platform: str | None) -> list[str]:
    runtime, tool = ("HIP", "rocm-smi") if platform == "hip" else ("CUDA", "nvidia-smi")
    return [
        f"an out-of-memory error of the {runtime} runtime itself, without the allocator's "
        "figures: memory taken outside PyTorch's caching allocator (the GPU context, NCCL/RCCL "
        "buffers, a library's workspace) when the GPU was already full",
        f"check that nothing else holds this GPU ({tool}) and that each rank uses its own GPU "
        "(LOCAL_RANK): a second process on one GPU fails this way",
        "leave room outside PyTorch: lower the run's memory as for memory pressure, a few GiB "
        "under the GPU's capacity (`tuneforge plan CONFIG` predicts it)",
    ]
