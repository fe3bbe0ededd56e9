"""Planner validation: run short trainings of several configurations on the GPU machine, record
peak memory and step time, then compare with `tuneforge plan`'s prediction.

On the GPU machine (2 GPUs):   python bench/plan_validation.py measure OUT_DIR [CASE ...]
Anywhere afterwards:           python bench/plan_validation.py predict OUT_DIR/measured.jsonl

The step-time model against every recorded bench step (bench/measured_steps.json), fitted on
half of the configurations and checked on the other half, then fitted on all of them (the rates
`hardware/step_rates.py` ships):
                               python bench/plan_validation.py time [bench/measured_steps.json]
"""

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "demo.yaml"
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "sigma",
    "tau",
    "omega",
]
STEPS = 12

# name: (GPUs, overrides)
CASES = {
    "1b-full-none-1k": (1, ["model.name=llama-3.2-1b", "lora.enabled=false", "seq=1024"]),
    "1b-full-full-4k": (
        1,
        [
            "model.name=llama-3.2-1b",
            "lora.enabled=false",
            "train.activation_checkpointing=full",
            "seq=4096",
        ],
    ),
    "1b-lora-none-4k": (1, ["model.name=llama-3.2-1b", "lora.enabled=true", "seq=4096"]),
    "1b-lora-full-8k": (
        1,
        [
            "model.name=llama-3.2-1b",
            "lora.enabled=true",
            "train.activation_checkpointing=full",
            "seq=8192",
        ],
    ),
    "qwen3-4b-8l-lora-none-2k": (
        1,
        ["model.name=qwen3-4b", "model.num_layers=8", "lora.enabled=true", "seq=2048"],
    ),
    "qwen3-4b-8l-lora-full-8k": (
        1,
        [
            "model.name=qwen3-4b",
            "model.num_layers=8",
            "lora.enabled=true",
            "train.activation_checkpointing=full",
            "seq=8192",
        ],
    ),
    "8b-4l-lora-none-4k": (
        1,
        ["model.name=llama-3-8b", "model.num_layers=4", "lora.enabled=true", "seq=4096"],
    ),
    "8b-4l-full-none-2k": (
        1,
        ["model.name=llama-3-8b", "model.num_layers=4", "lora.enabled=false", "seq=2048"],
    ),
    "moe-2l-lora-attn-4k": (
        1,
        ["model.name=qwen3-30b-a3b", "model.num_layers=2", "lora.enabled=true", "seq=4096"],
    ),
    "moe-4l-lora-experts-full-8k": (
        1,
        [
            "model.name=qwen3-30b-a3b",
            "model.num_layers=4",
            "lora.enabled=true",
            "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,experts.gate_up_proj,experts.down_proj]",
            "train.activation_checkpointing=full",
            "seq=8192",
        ],
    ),
    "mistral-7b-4l-lora-none-8k": (
        1,
        ["model.name=mistral-7b-v0.1", "model.num_layers=4", "lora.enabled=true", "seq=8192"],
    ),
    "mixtral-2l-lora-experts-4k": (
        1,
        [
            "model.name=mixtral-8x7b",
            "model.num_layers=2",
            "lora.enabled=true",
            "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,w1,w2,w3]",
            "seq=4096",
        ],
    ),
    "deepseek-v2-lite-4l-lora-experts-4k": (
        1,
        [
            "model.name=deepseek-v2-lite",
            "model.num_layers=4",
            "lora.enabled=true",
            "lora.target_modules=[q_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,"
            "experts.gate_up_proj,experts.down_proj]",
            "seq=4096",
        ],
    ),
    "gemma-3-4b-8l-lora-none-4k": (
        1,
        ["model.name=gemma-3-4b", "model.num_layers=8", "lora.enabled=true", "seq=4096"],
    ),
    "1b-full-fsdp2-2gpu-4k": (
        2,
        ["model.name=llama-3.2-1b", "lora.enabled=false", "parallel.strategy=fsdp", "seq=4096"],
    ),
    "qwen3-8b-4l-full-fsdp2-2gpu-2k": (
        2,
        [
            "model.name=qwen3-8b",
            "model.num_layers=4",
            "lora.enabled=false",
            "parallel.strategy=fsdp",
            "parallel.zero_stage=3",
            "seq=2048",
        ],
    ),
    "1b-full-accum2-2k": (
        1,
        [
            "model.name=llama-3.2-1b",
            "lora.enabled=false",
            "train.grad_accum_steps=2",
            "seq=2048",
        ],
    ),
    "qwen3-4b-8l-full-selective-4k": (
        1,
        [
            "model.name=qwen3-4b",
            "model.num_layers=8",
            "lora.enabled=false",
            "train.activation_checkpointing=selective",
            "seq=4096",
        ],
    ),
    "8b-4l-lora-ddp-2gpu-4k": (
        2,
        [
            "model.name=llama-3-8b",
            "model.num_layers=4",
            "lora.enabled=true",
            "parallel.strategy=ddp",
            "seq=4096",
        ],
    ),
    "1b-full-zero2-2gpu-4k": (
        2,
        [
            "model.name=llama-3.2-1b",
            "lora.enabled=false",
            "parallel.strategy=fsdp",
            "parallel.zero_stage=2",
            "seq=4096",
        ],
    ),
}


def synthetic_data(file: Path, records: int = 400) -> None:
    """Raw text of about 8k tokens per record with the demo tokenizer (one word, about one token)."""
    rng = random.Random(0)
    with file.open("w") as handle:
        for _ in range(records):
            handle.write(
                json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(3000, 6000)))}) + "\n"
            )


def overrides_of(name: str, data: Path, out: Path) -> tuple[int, list[str]]:
    gpus, items = CASES[name]
    seq = next(int(i.split("=")[1]) for i in items if i.startswith("seq="))
    return gpus, [
        *(i for i in items if not i.startswith("seq=")),
        "model.dtype=bfloat16",
        f"data.train=[{{path: {data}, format: text}}]",
        "data.eval=[]",
        "eval.every_steps=null",
        "data.on_too_long=truncate",
        f"data.max_seq_len={seq}",
        f"train.tokens_per_micro_batch={seq}",
        f"train.max_steps={STEPS}",
        "train.lr=1e-4",
        "train.min_lr=1e-5",
        "train.warmup_steps=2",
        "eval.num_samples=0",
        "logging.log_steps=1",
        "logging.progress=false",
        "logging.tensorboard=false",
        "checkpoint.save_final=false",
        f"run.output_dir={out / name}",
    ]


def measure(out: Path, *names: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = out / "long.jsonl"
    synthetic_data(data)
    results = out / "measured.jsonl"
    for name in names or CASES:
        gpus, overrides = overrides_of(name, data, out)
        launcher = (
            ["torchrun", "--standalone", f"--nproc_per_node={gpus}"]
            if gpus > 1
            else [sys.executable]
        )
        env = os.environ | ({"CUDA_VISIBLE_DEVICES": "0"} if gpus == 1 else {})
        run = subprocess.run(
            [*launcher, "-m", "tuneforge", "train", str(DEMO), *overrides, "--overwrite"],
            capture_output=True,
            text=True,
            env=env,
        )
        metrics = out / name / "metrics.jsonl"
        if run.returncode != 0 or not metrics.is_file():
            print(f"{name}: failed\n{run.stderr[-2000:]}")
            continue
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if '"loss"' in line]
        steady = [r for r in rows if r["step"] > 3]
        record = {
            "name": name,
            "gpus": gpus,
            "peak_gib": max(r["mem_peak_gib"] for r in rows),
            "reserved_gib": max(r["mem_reserved_gib"] for r in rows),
            "step_s": statistics.median(r["step_s"] for r in steady),
            "mfu": statistics.median(r["mfu"] for r in steady if r.get("mfu") is not None),
        }
        print(json.dumps(record))
        with results.open("a") as handle:
            handle.write(json.dumps(record) + "\n")


def predict(measured_file: Path) -> None:
    from tuneforge.config import load_config
    from tuneforge.data.training_data import load_training_data
    from tuneforge.hardware.gpus import GIB
    from tuneforge.plan.memory import CONTEXT_GIB
    from tuneforge.plan.planner import plan_run
    from tuneforge.plan.prediction import Hardware
    from tuneforge.train.build import load_tokenizer

    data = Path(tempfile.gettempdir()) / "tuneforge-plan-validation" / "long.jsonl"
    if not data.is_file():  # the same records the measurement used (fixed seed)
        data.parent.mkdir(exist_ok=True)
        synthetic_data(data)
    print(
        "| case | GPUs | peak allocated GiB | predicted | error | reserved GiB | predicted total"
        " (no context) | step s | predicted at 40% MFU | measured MFU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for line in measured_file.read_text().splitlines():
        measured = json.loads(line)
        gpus, overrides = overrides_of(measured["name"], data, measured_file.parent)
        config = load_config(DEMO, overrides)
        lengths = load_training_data(
            config.data, load_tokenizer(config), config.train.tokens_per_micro_batch, 0
        ).stats.records
        plan = plan_run(config, Hardware(gpus=gpus, gpu="H200"), lengths)
        # max_memory_allocated sees tensors only: compare the planner's peak of allocated
        # tensors (its total adds the CUDA context, collective buffers and allocator rounding)
        predicted = plan.memory.allocated / GIB
        error = predicted / measured["peak_gib"] - 1
        # the reserved pool: allocated plus the allocator's rounding and cached blocks (the
        # planner's total less the CUDA context, which the pool does not hold)
        pool = plan.memory.total / GIB - CONTEXT_GIB["cuda"]
        print(
            f"| {measured['name']} | {gpus} | {measured['peak_gib']:.2f} | {predicted:.2f} | "
            f"{error:+.0%} | {measured['reserved_gib']:.2f} | {pool:.2f} | "
            f"{measured['step_s']:.3f} | {plan.step_time_s:.3f} | {measured['mfu']:.0%} |"
        )


SETS_A_CONSTANT = {
    "llama3-8b-lora compiled+chunk2048+onedoc+fp8+fp8base+cudnn+host6": "cudnn_restored_block_s",
    "llama3.2-1b-full compiled+fp8+torchao": "fp8_kernels",
    "llama3-8b-qlora compiled+full+offload+chunk512+onedoc+budget0.8+hostembed+host16+fp8": (
        "fp8_kernels"
    ),
}
"""Rows a constant of `hardware/step_rates.py` was read from: in the fitted half, whatever
their place."""


def validate_time(file: Path) -> None:
    from tuneforge.bench.measured import measured_sample, measured_setup, read_bench_results
    from tuneforge.hardware.gpus import GIB
    from tuneforge.hardware.step_rates import FITTED, H200
    from tuneforge.plan.calibration import fit_rates, sample_seconds
    from tuneforge.plan.memory import predict_memory

    measured = read_bench_results(file)
    samples = [measured_sample(m) for m in measured]
    memories = [predict_memory(measured_setup(m)) for m in measured]
    # alternate rows of the sorted file, and the rows constants were read from
    labels = [
        "fit" if index % 2 == 0 or sample.name in SETS_A_CONSTANT else "check"
        for index, sample in enumerate(samples)
    ]
    halves = {h: [s for s, label in zip(samples, labels, strict=True) if label == h]
              for h in ("fit", "check")}  # fmt: skip
    rates = fit_rates(halves["fit"], H200, "fitted on the first half")
    print(
        "| configuration | half | measured ms | predicted ms | error | bound by | allocated GiB "
        "| predicted | error | reserved GiB | predicted | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    memory_errors: list[float] = []
    errors: dict[str, list[float]] = {"fit": [], "check": []}
    from tuneforge.plan.step_time import step_time

    for index, sample in enumerate(samples):
        half = labels[index]
        predicted = sample_seconds(sample, rates)
        error = predicted / sample.seconds - 1
        errors[half].append(error)
        bound = step_time(sample.works[0][0], rates, sample.link_gbps).bound
        row = measured[index]
        allocated, reserved = memories[index].allocated / GIB, memories[index].reserved / GIB
        memory = [f"{row.allocated_gib:.2f}", f"{allocated:.2f}"]
        memory.append(f"{allocated / row.allocated_gib - 1:+.1%}")
        memory_errors.append(abs(allocated / row.allocated_gib - 1))
        if row.reserved_gib and not row.cap_gib:  # a held run's pool is the hold's
            memory += [f"{row.reserved_gib:.2f}", f"{reserved:.2f}"]
            memory.append(f"{reserved / row.reserved_gib - 1:+.1%}")
        else:
            memory += ["", f"{reserved:.2f}", ""]
        print(
            f"| {sample.name} | {half} | {sample.seconds * 1000:.1f} | {predicted * 1000:.1f} | "
            f"{error:+.1%} | {bound} | {' | '.join(memory)} |"
        )
    for half, values in errors.items():
        absolute = sorted(abs(v) for v in values)
        within = sum(v <= 0.15 for v in absolute)
        print(
            f"\n{half}: {len(values)} configurations, median |error| "
            f"{statistics.median(absolute):.1%}, largest {absolute[-1]:.1%}, {within} within 15%"
        )
    memory_errors.sort()
    print(
        f"\nallocated memory: median |error| {statistics.median(memory_errors):.1%}, largest "
        f"{memory_errors[-1]:.1%}, {sum(e <= 0.10 for e in memory_errors)} of "
        f"{len(memory_errors)} within 10%"
    )
    print("\nfitted on the first half:", {k: round(getattr(rates, k), 5) for k in FITTED})
    everything = fit_rates(samples, H200, "fitted on all")
    print("fitted on all:", {k: round(getattr(everything, k), 5) for k in FITTED})


if __name__ == "__main__":
    if sys.argv[1] == "measure":
        measure(Path(sys.argv[2]), *sys.argv[3:])
    elif sys.argv[1] == "time":
        validate_time(
            Path(sys.argv[2] if len(sys.argv) > 2 else REPO / "bench" / "measured_steps.json")
        )
    else:
        predict(Path(sys.argv[2]))
