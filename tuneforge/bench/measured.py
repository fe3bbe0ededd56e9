"""Measured steps of `tuneforge bench` read back with the work they did: each result's run
configuration (`workload_config`) and the document lengths of the batches each rank cycled
through, so that the planner's step-time model can be fitted to them and checked against them."""

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from tuneforge.bench.batches import batch_lengths, pair_shape
from tuneforge.bench.ours import DISTINCT_BATCHES, batch_seeds, workload_config
from tuneforge.bench.workloads import WORKLOADS, Variant
from tuneforge.config import RunConfig
from tuneforge.data.rank_balance import attention_cost, balanced_deal
from tuneforge.errors import TuneforgeError
from tuneforge.hardware.gpus import link_gbps
from tuneforge.parallel.distributed import Dist
from tuneforge.plan.calibration import Sample
from tuneforge.plan.memory import Setup
from tuneforge.plan.planner import run_model_args, setup_of
from tuneforge.plan.prediction import Hardware
from tuneforge.plan.step_estimate import configured_work

Cycle = list[list[list[list[int]]]]
"""Steps → ranks → micro-batches → document lengths."""


@dataclass(frozen=True)
class MeasuredStep:
    name: str
    config: RunConfig
    gpus: int
    cycle: Cycle
    seconds: float
    allocated_gib: float | None = None
    reserved_gib: float | None = None
    cap_gib: float | None = None
    source: str = ""

    def hardware(self, gpu: str = "H200") -> Hardware:
        return Hardware(gpus=self.gpus, gpu=gpu)


def _rank_lengths(workload_gpus: int, settings: Variant, tokens: int, rank: int, world: int):
    """Each batch's document lengths on one rank, as `ours.rank_batches` deals them."""
    if settings.balanced and world > 1:
        pool = [
            batch_lengths(tokens, settings.one_document, seed)
            for seed in batch_seeds(0, 1, world, same_data=False)
        ]
        dealt = balanced_deal(range(len(pool)), [attention_cost(p) for p in pool], world,
                              random.Random(0))  # fmt: skip
        return [pool[index] for index in dealt[rank::world]]
    seeds = batch_seeds(rank, world, workload_gpus, settings.same_data)
    return [batch_lengths(tokens, settings.one_document, seed) for seed in seeds]


def bench_cycle(workload_name: str, variant: str, gpus: int) -> tuple[RunConfig, Cycle]:
    """A bench result's configuration and the batches of one whole cycle of its steps."""
    workload, settings = WORKLOADS[workload_name], Variant.parse(variant)
    config = workload_config(workload, settings, Dist(0, gpus, 0))
    tokens = config.train.tokens_per_micro_batch
    accum = config.train.grad_accum_steps
    if workload.objective == "dpo":
        pairs = []
        for index in range(DISTINCT_BATCHES):
            prompt, reply = pair_shape(tokens, index)
            pairs.append([prompt + reply, prompt + reply])
        ranks = [pairs] * gpus
    else:
        ranks = [_rank_lengths(workload.gpus, settings, tokens, r, gpus) for r in range(gpus)]
    batches = len(ranks[0])
    steps = batches // math.gcd(batches, accum)
    cycle = [
        [[lengths[(step * accum + k) % batches] for k in range(accum)] for lengths in ranks]
        for step in range(steps)
    ]
    return config, cycle


def read_bench_results(file: Path) -> list[MeasuredStep]:
    """tuneforge's results in a bench JSON (`tuneforge bench --out`, or bench/measured_steps.json)."""
    try:
        results = json.loads(file.read_text())["results"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise TuneforgeError(f"{file}: not a bench result file ({error})") from None
    steps = []
    for result in results:
        if result.get("system", "tuneforge") != "tuneforge" or "ms_per_step" not in result:
            continue
        if result.get("workload") not in WORKLOADS:
            continue
        gpus = int(result.get("gpus", 1))
        # a curated row names the variant that runs its work today where the defaults moved
        variant = result.get("variant_now", result["variant"])
        config, cycle = bench_cycle(result["workload"], variant, gpus)
        cap = result.get("memory_cap_gib")
        held = f" held to {cap:g} GiB" if cap else ""
        steps.append(
            MeasuredStep(
                name=f"{result['workload']} {result['variant']}{held}"
                + (f" on {gpus} GPUs" if gpus > 1 else ""),
                config=config,
                gpus=gpus,
                cycle=cycle,
                seconds=result["ms_per_step"] / 1000,
                allocated_gib=result.get("peak_alloc_gib"),
                reserved_gib=result.get("peak_reserved_gib"),
                cap_gib=cap,
                source=result.get("source", str(file)),
            )
        )
    return steps


def measured_setup(measured: MeasuredStep, gpu: str = "H200") -> Setup:
    """The planner's setup of the measured run, its documents' mean length from the cycle."""
    tokens = sum(sum(sum(m) for m in rank) for step in measured.cycle for rank in step)
    documents = sum(sum(len(m) for m in rank) for step in measured.cycle for rank in step)
    config = measured.config
    return setup_of(
        config, run_model_args(config), measured.hardware(gpu), tokens / max(documents, 1)
    )


def measured_sample(measured: MeasuredStep, gpu: str = "H200") -> Sample:
    """The work of each step of the measured cycle on each rank, for the step-time model."""
    config, setup = measured.config, measured_setup(measured, gpu)
    works = [[configured_work(config, setup, rank) for rank in step] for step in measured.cycle]
    return Sample(measured.name, works, measured.seconds, link_gbps(gpu)[0])
