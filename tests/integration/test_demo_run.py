"""A shortened demo run end to end: the loss falls, weights change, the run directory is complete."""

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tuneforge.config import load_config
from tuneforge.runs.files import read_metrics
from tuneforge.train.loop import Trainer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo.yaml"


def short_demo(run_dir: Path, *overrides: str):
    return load_config(
        DEMO,
        [
            f"run.output_dir={run_dir}",
            f"data.cache_dir={run_dir.parent / 'cache'}",
            "train.max_steps=24",
            "train.warmup_steps=4",
            "eval.num_samples=16",
            "checkpoint.save_steps=10",
            "checkpoint.keep_last=1",
            "logging.log_steps=1",
            *overrides,
        ],
    )


def two_steps_after_sft(example: str, sft_run: Path, run_dir: Path, *extra: str):
    """Two steps of `examples/EXAMPLE.yaml` on the SFT run's model, evaluated at both ends."""
    config = load_config(
        REPO / "examples" / f"{example}.yaml",
        [f"model.path={sft_run / 'final'}", f"run.output_dir={run_dir}",
         f"data.cache_dir={run_dir.parent / 'cache'}", "train.max_steps=2", "eval.every_steps=2",
         "logging.log_steps=1", *extra],
    )  # fmt: skip
    trainer = Trainer(config)
    trainer.setup()
    return trainer.train()


def test_full_fine_tuning_learns_and_leaves_a_complete_run_directory(tmp_path):
    trainer = Trainer(short_demo(tmp_path / "run"))
    trainer.setup()
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    summary = trainer.train()
    saved = trainer.save()

    metrics = [m for m in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in m]
    assert [m["step"] for m in metrics] == list(range(1, 25))
    first, last = metrics[0]["loss"], sum(m["loss"] for m in metrics[-4:]) / 4
    assert last < first - 1.0, (first, last)
    evaluations = summary.evaluations
    assert evaluations[-1].loss.loss < evaluations[0].loss.loss - 1.0
    changed = [
        name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])
    ]
    assert len(changed) == len(before)

    run = tmp_path / "run"
    assert (run / "config.yaml").is_file()
    assert load_config(run / "config.yaml").train.max_steps == 24
    assert (run / "checkpoints" / "step_20" / "dcp" / ".metadata").is_file()
    assert json.loads((run / "checkpoints" / "latest").read_text())["step"] == 20
    assert not (run / "checkpoints" / "step_10").exists()  # keep_last=1
    assert (run / "finished").is_file()
    record = metrics[-1]
    assert {"tokens_per_s", "tflops", "eta_s", "grad_norm", "lr", "elapsed_s"} <= set(record)
    # every step's time is its own (the last one as well: a step read late would seem free)
    times = sorted(m["step_s"] for m in metrics)
    assert record["step_s"] > 0.2 * times[len(times) // 2], (record["step_s"], times)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert saved == run / "final"
    final = load_file(run / "final" / "model.safetensors")
    torch.testing.assert_close(
        final["model.layers.0.mlp.up_proj.weight"], trainer.model.layers[0].mlp.up_proj.weight
    )
    assert (run / "final" / "tokenizer.json").is_file()

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuneforge",
            "generate",
            str(run),
            "--prompt",
            "upper: a b c",
            "--max-new-tokens",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()

    # the DPO demo's configuration on this model: its bundled pairs load, and DPO starts at ln 2
    dpo_summary = two_steps_after_sft("demo-dpo", run, tmp_path / "dpo", "eval.num_samples=0")
    first_step = next(m for m in read_metrics(tmp_path / "dpo" / "metrics.jsonl") if "loss" in m)
    assert first_step["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert dpo_summary.evaluations[0].loss.metrics["reward_accuracy"] == 0.0

    # the GRPO demo's configuration too: its prompts load, it samples, and it scores held out
    grpo_summary = two_steps_after_sft("demo-grpo", run, tmp_path / "grpo", "eval.num_samples=8")
    steps = [m for m in read_metrics(tmp_path / "grpo" / "metrics.jsonl") if "loss" in m]
    assert len(steps) == 2 and all(0 <= m["reward"] <= 1 for m in steps)
    assert all(m["completions"] == 8 * m["groups"] for m in steps)
    held_out = grpo_summary.evaluations[0].loss
    assert held_out.loss == pytest.approx(-held_out.metrics["reward"])


def test_lora_run_trains_only_adapters_and_saves_a_peft_adapter(tmp_path):
    trainer = Trainer(
        short_demo(tmp_path / "run", "lora.enabled=true", "lora.rank=8", "train.lr=1e-2")
    )
    trainer.setup()
    frozen = {
        name: p.detach().clone()
        for name, p in trainer.model.named_parameters()
        if not p.requires_grad
    }
    summary = trainer.train()
    trainer.save()
    assert summary.evaluations[-1].loss.loss < summary.evaluations[0].loss.loss
    assert all(
        torch.equal(p, frozen[name])
        for name, p in trainer.model.named_parameters()
        if name in frozen
    )
    run = tmp_path / "run"
    assert (run / "adapter" / "adapter_config.json").is_file()
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert (run / "base" / "model.safetensors").is_file()
    # the run directory exports as it is: merged (through the CLI) and to GGUF
    merged = subprocess.run(
        [sys.executable, "-m", "tuneforge", "export", "merge", str(run), "--out", str(run / "m")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert merged.returncode == 0, merged.stderr
    from transformers import AutoModelForCausalLM

    tokens = torch.arange(3, 40)[None]
    hf = AutoModelForCausalLM.from_pretrained(run / "m").eval()
    model = trainer.model.eval().cpu()
    with torch.no_grad():
        torch.testing.assert_close(
            hf(tokens).logits.float(), model(tokens).float(), atol=1e-4, rtol=1e-4
        )
    from tuneforge.export.gguf_file import export_gguf
    from tuneforge.export.sources import resolve_source

    assert export_gguf(resolve_source(run), run / "model.gguf", "q8_0").stat().st_size > 0


def test_an_existing_run_directory_is_never_overwritten_silently(tmp_path):
    first = Trainer(short_demo(tmp_path / "run", "train.max_steps=1", "eval.num_samples=0"))
    first.setup()
    from tuneforge.errors import TuneforgeError

    with pytest.raises(TuneforgeError, match="already holds a run"):
        Trainer(short_demo(tmp_path / "run")).setup()


def test_single_on_several_processes_is_refused_before_the_run_directory_is_touched(
    tmp_path, monkeypatch
):
    from tuneforge.errors import TuneforgeError
    from tuneforge.parallel.distributed import Dist
    from tuneforge.train import loop

    run_dir = tmp_path / "run"
    Trainer(short_demo(run_dir, "train.max_steps=1", "eval.num_samples=0")).setup()
    before = sorted(p.name for p in run_dir.iterdir())
    monkeypatch.setattr(loop, "init_distributed", lambda channels: Dist(rank=0, world_size=2))
    trainer = Trainer(short_demo(run_dir, "parallel.strategy=single"), overwrite=True)
    with pytest.raises(TuneforgeError, match="use ddp or fsdp"):
        trainer.setup()
    assert before and sorted(p.name for p in run_dir.iterdir()) == before


def test_an_overwrite_whose_setup_fails_keeps_the_previous_run(tmp_path):
    from tuneforge.errors import TuneforgeError

    run_dir = tmp_path / "run"
    Trainer(short_demo(run_dir, "train.max_steps=1", "eval.num_samples=0")).setup()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    wrong_targets = ["lora.enabled=true", "lora.target_modules=[nope_proj]"]
    with pytest.raises(TuneforgeError, match="nope_proj"):
        Trainer(short_demo(run_dir, *wrong_targets), overwrite=True).setup()
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    assert not (run_dir / ".replaced").exists()


def test_a_lora_run_on_an_emulated_fp4_base_learns_and_says_what_runs(tmp_path, caplog):
    settings = ["lora.enabled=true", "lora.rank=8", "train.lr=1e-2", "eval.num_samples=0"]
    fp4 = ["precision.fp4=e2m1", "precision.fp4_param=true", "train.max_steps=12"]
    trainer = Trainer(short_demo(tmp_path / "run", *settings, *fp4))
    with caplog.at_level(logging.INFO, logger="tuneforge"):
        trainer.setup()
    assert "FP4 NVFP4 emulated" in caplog.text
    assert "as FP4 codes and scales (4.50 bits per weight)" in caplog.text
    summary = trainer.train()
    trainer.save()
    assert summary.evaluations[-1].loss.loss < summary.evaluations[0].loss.loss - 0.5
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
