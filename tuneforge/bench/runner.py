"""Runs the benchmark's plan — tuneforge variants and available peers per workload, each in its
own process — and reports tokens/s, ms/step, peak memory, MFU and the ratio to each peer."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

from tuneforge.bench.child import RESULT_PREFIX
from tuneforge.bench.workloads import WORKLOADS, Variant, Workload, baseline_variant

PEERS = ("hf+peft", "hf+peft+liger", "unsloth", "trl")
PEER_MODULES = {
    "hf+peft": "peft",
    "hf+peft+liger": "liger_kernel",
    "unsloth": "unsloth",
    "trl": "trl",
}
PEER_OBJECTIVES = {
    "hf+peft": ("sft",),
    "hf+peft+liger": ("sft",),
    "unsloth": ("sft",),
    "trl": ("dpo", "grpo"),
}
"""The objectives each peer trains: TRL is measured on preference training (its DPOTrainer)
and on GRPO (its GRPOTrainer)."""


@dataclass(frozen=True)
class Run:
    workload: str
    system: str
    variant: str = ""
    checkpointing: bool = False

    def spec(
        self, warmup: int, steps: int, profile: bool = False, memory_cap_gib: float | None = None
    ) -> dict:
        return {
            "profile": profile and self.system == "tuneforge",
            "memory_cap_gib": memory_cap_gib,
            "workload": self.workload,
            "system": self.system,
            "variant": self.variant,
            "checkpointing": self.checkpointing,
            "warmup": warmup,
            "steps": steps,
        }


def available_peers(wanted: list[str]) -> tuple[list[str], dict[str, str]]:
    """Peers importable here, and why each other one is left out."""
    present, missing = [], {}
    for peer in wanted:
        module = PEER_MODULES[peer]
        if importlib.util.find_spec(module) is None:
            missing[peer] = f"`{module}` is not importable"
        else:
            present.append(peer)
    return present, missing


def needs_fp8(run: Run) -> bool:
    """A tuneforge run whose variant computes in FP8 (it needs FP8 tensor cores)."""
    if run.system != "tuneforge":
        return False
    return Variant.parse(run.variant.removesuffix("+1gpu")).fp8 is not None


def plan_runs(workloads: list[Workload], peers: list[str]) -> list[Run]:
    runs = []
    for workload in workloads:
        if workload.gpus > 1:  # the one-GPU runs first: a cut-off call keeps what scaling needs
            baselines = dict.fromkeys(baseline_variant(v) for v in workload.variants)
            runs += [Run(workload.name, "tuneforge", f"{b}+1gpu") for b in baselines]
        runs += [Run(workload.name, "tuneforge", variant) for variant in workload.variants]
        if workload.gpus > 1:
            continue
        for peer in peers:
            if workload.objective not in PEER_OBJECTIVES[peer]:
                continue
            if (
                peer == "unsloth"
                and workload.targets
                and any("experts." in t for t in workload.targets)
            ):
                continue  # Unsloth adapts modules by name; expert banks are parameters
            if peer == "unsloth" and workload.dora:
                continue  # Unsloth's fast paths are for LoRA, not DoRA
            runs += [Run(workload.name, peer, "", gc) for gc in workload.peer_checkpointing]
    return runs


def run_gpus(run: Run) -> int:
    """GPUs a run takes: its workload's, or one for a one-GPU baseline (`+1gpu`)."""
    return 1 if run.variant.endswith("+1gpu") else WORKLOADS[run.workload].gpus


def held_cap(workload: Workload, enforce_cap: bool, cap_gib: float | None) -> float | None:
    """The GiB a run's allocator is held to: `--cap-gib` for every run; otherwise, with
    `--enforce-cap`, a capped workload's own cap (the strongest peer's checkpointed peak)."""
    if cap_gib is not None:
        return cap_gib
    return workload.memory_cap_gib if enforce_cap else None


def execute(
    run: Run,
    warmup: int,
    steps: int,
    profile: bool = False,
    limit_s: float | None = None,
    memory_cap_gib: float | None = None,
) -> dict:
    """One run in its own process (group: torchrun's workers too), killed after `limit_s`; with
    `memory_cap_gib`, the process's allocator may hold no more than that."""
    spec = run.spec(warmup, steps, profile, memory_cap_gib)
    if run.variant.endswith("+1gpu"):
        spec["variant"] = run.variant.removesuffix("+1gpu")
    gpus = run_gpus(run)
    if gpus > 1:
        launcher = ["torchrun", "--standalone", f"--nproc_per_node={gpus}"]
    else:
        launcher = [sys.executable]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = [*launcher, "-m", "tuneforge.bench.child", json.dumps(spec)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return spec | {"error": f"stopped after the {limit_s:g} s limit per run"}
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line.removeprefix(RESULT_PREFIX)) | {"variant_run": run.variant}
    return spec | {"error": f"exit {process.returncode}", "trace": stderr[-3000:]}


def summarise(result: dict, peak_tflops: float) -> dict:
    if "error" in result:
        return result
    seconds = result["ms_per_step"] / 1e3
    result["tokens_per_s"] = result["tokens_per_step"] / seconds
    result["mfu"] = result["flops_per_step"] / seconds / (peak_tflops * 1e12 * result["gpus"])
    return result
