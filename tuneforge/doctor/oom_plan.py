"""For an out-of-memory run with a known configuration: how much each remedy saves, from the
planner (the compiled blocks' memory budget, activation checkpointing, ZeRO-3, a halved
micro-batch), given the GPU's capacity from
the error message."""

from pathlib import Path

from tuneforge.config import load_config
from tuneforge.hardware.gpus import GIB
from tuneforge.plan.memory_options import COMPILE_BUDGET
from tuneforge.plan.plan import Hardware
from tuneforge.plan.planner import plan_run

REMEDIES = {
    "train.activation_checkpointing=full": "activation checkpointing on every block",
    "parallel.zero_stage=3": "ZeRO-3 (parallel.strategy: fsdp, zero_stage: 3)",
}


def remedies(
    config_file: Path, overrides: list[str], gpus: int, capacity_gib: float | None
) -> list[str]:
    """One line per remedy: predicted GiB per GPU before and after, and whether it then fits."""
    config = load_config(config_file, overrides)
    hardware = Hardware(gpus=gpus, memory_gib=capacity_gib)
    current = plan_run(config, hardware).memory.total / GIB
    train = config.train
    options = {}
    if (
        train.compile
        and train.activation_checkpointing == "none"
        and train.compile_memory_budget > COMPILE_BUDGET
    ):
        options[f"train.compile_memory_budget={COMPILE_BUDGET}"] = (
            f"a memory budget of {COMPILE_BUDGET} for the compiled blocks (about 1% slower)"
        )
    options |= REMEDIES
    if gpus == 1:
        options.pop("parallel.zero_stage=3")
    half = max(config.data.max_seq_len, config.train.tokens_per_micro_batch // 2)
    if half < config.train.tokens_per_micro_batch:
        options[f"train.tokens_per_micro_batch={half}"] = (
            f"a micro-batch of {half} tokens (double grad_accum_steps to keep the global batch)"
        )
    lines = [f"the planner predicts {current:.1f} GiB per GPU for this configuration"]
    for change, label in options.items():
        extra = [change, "parallel.strategy=fsdp"] if change.startswith("parallel.") else [change]
        after = (
            plan_run(load_config(config_file, [*overrides, *extra]), hardware).memory.total / GIB
        )
        fits = capacity_gib is None or after <= capacity_gib
        lines.append(
            f"{label}: {current:.1f} -> {after:.1f} GiB ({after - current:+.1f})"
            + ("" if capacity_gib is None else (", fits" if fits else ", still too much"))
        )
    return lines
