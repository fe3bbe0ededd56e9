"""Calibrating the step-time model on measured steps (bench results, run directories), the
shipped rates against every recorded step, and `plan --fit`'s recipe search."""

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tuneforge.bench.batches import batch_lengths, synthetic_batch
from tuneforge.bench.measured import bench_cycle, measured_sample, read_bench_results
from tuneforge.bench.ours import batch_seeds
from tuneforge.cli.main import app
from tuneforge.config import load_config
from tuneforge.errors import TuneforgeError
from tuneforge.hardware.gpus import GIB
from tuneforge.hardware.step_rates import H200, load_rates
from tuneforge.plan.calibration import sample_seconds
from tuneforge.plan.measured_runs import run_seconds
from tuneforge.plan.planner import run_model_args
from tuneforge.plan.prediction import Hardware
from tuneforge.plan.recipe_search import candidates, search_recipes

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "bench" / "measured_steps.json"
DEMO = "examples/demo.yaml"
LLAMA3_8B_LORA = [
    "model.name=llama-3-8b", "model.dtype=bfloat16", "lora.enabled=true", "lora.rank=16",
    "lora.alpha=32", "lora.target_modules=[all-linear]", "data.max_seq_len=4096",
    "train.tokens_per_micro_batch=4096",
]  # fmt: skip


def test_a_bench_cycle_has_the_documents_each_rank_trained_on():
    for seed in (0, 3, 101):
        batch = synthetic_batch(1000, 4096, False, seed)
        assert batch_lengths(4096, False, seed) == batch.packed.lengths()
    config, cycle = bench_cycle("llama3.2-1b-full-fsdp2-2gpu", "compiled+ddp+accum4", 2)
    assert config.parallel.strategy == "ddp" and config.train.grad_accum_steps == 4
    seeds = [batch_seeds(rank, 2, 2, False) for rank in range(2)]
    assert len(cycle) == 1 and len(cycle[0]) == 2  # four batches a rank: one step of four
    for rank in range(2):
        expected = [batch_lengths(4096, False, seed) for seed in seeds[rank]]
        assert cycle[0][rank] == expected
    _, one_doc = bench_cycle("llama3-8b-lora", "compiled+onedoc", 1)
    assert one_doc == [[[[4096]]]] * 4


def test_the_shipped_rates_predict_every_recorded_step():
    """The H200's rates (fitted on these steps) against them: the targets of docs/plan.md's
    validation table, which fits on half and checks on the other half."""
    measured = read_bench_results(MEASURED)
    assert len(measured) >= 12
    errors = [abs(sample_seconds(measured_sample(m), H200) / m.seconds - 1) for m in measured]
    assert statistics.median(errors) <= 0.07
    assert max(errors) <= 0.15


def test_the_recorded_steps_hold_each_configuration_once():
    """A configuration is its workload, its set of options (in any order), its hold and its
    GPUs: the file keeps the latest measurement of each, so the table counts each once."""
    rows = json.loads(MEASURED.read_text())["results"]
    keys = [
        (r["workload"], frozenset(r["variant"].split("+")), r.get("memory_cap_gib"), r["gpus"])
        for r in rows
    ]
    assert len(set(keys)) == len(keys)


def test_a_4bit_base_multiplied_in_fp8_is_costed_at_its_own_kernels_rate():
    """Its products dequantise the codes into E4M3 each time (measured slower than the 4-bit
    base's bf16 products): not at the rate of FP8 products on FP8 or bf16 weights."""
    from tuneforge.hardware.step_rates import FOUR_BIT_FP8
    from tuneforge.plan.planner import setup_of
    from tuneforge.plan.step_estimate import configured_work
    from tuneforge.plan.step_time import step_time

    qlora = [*LLAMA3_8B_LORA, "model.quantize=nf4", "train.compile=true"]
    times = {}
    for fp8 in ([], ["precision.fp8=e4m3"]):
        config = load_config(DEMO, [*qlora, *fp8])
        setup = setup_of(config, run_model_args(config), Hardware(gpu="H200"), 4096)
        work = configured_work(config, setup, [[4096]])
        times[bool(fp8)] = step_time(work, H200).total_s
        if fp8:
            assert work.fp8_kernel == FOUR_BIT_FP8
    assert dict(H200.fp8_kernels)[FOUR_BIT_FP8] < 1.0
    assert times[True] > times[False]


def test_a_run_directory_gives_its_steady_step_time(tmp_path):
    rows = [
        {"step": s, "loss": 1.0, "step_s": 9.0 if s <= 3 else 1.0 + s % 2} for s in range(1, 12)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_seconds(tmp_path) == pytest.approx(np.mean([1.0 + s % 2 for s in range(4, 12)]))


def test_plan_calibrate_fits_writes_and_names_the_rates(tmp_path):
    bench = {"results": json.loads(MEASURED.read_text())["results"][:12]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    rates = tmp_path / "h200.json"
    args = ["plan", DEMO, *LLAMA3_8B_LORA, "--gpu", "H200", "--no-data"]
    result = CliRunner().invoke(
        app, [*args, "--calibrate", str(tmp_path / "bench.json"), "--save-rates", str(rates)],
        env={"COLUMNS": "300"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    fitted = load_rates(rates)
    assert fitted.name.startswith("H200 rates fitted on 12 measured step(s) of bench.json")
    assert fitted.name in result.output.replace("\n", "")
    used = CliRunner().invoke(app, [*args, "--rates", str(rates)], env={"COLUMNS": "300"})
    assert used.exit_code == 0 and fitted.name in used.output.replace("\n", "")
    refused = CliRunner().invoke(app, [*args, "--save-rates", str(rates)])
    assert isinstance(refused.exception, TuneforgeError)
    assert "give --calibrate too" in str(refused.exception)
    unknown = tmp_path / "h7.json"  # an unknown GPU is refused before any rates are written
    calibrate = ["--calibrate", str(tmp_path / "bench.json"), "--save-rates", str(unknown)]
    refused = CliRunner().invoke(app, [*[a if a != "H200" else "H7" for a in args], *calibrate])
    assert isinstance(refused.exception, TuneforgeError)
    assert "--gpu H7: unknown" in str(refused.exception) and not unknown.exists()


def test_the_recipe_search_picks_the_fastest_that_fits_and_its_overrides_load():
    hardware = Hardware(gpu="H200")
    roomy = search_recipes(load_config(DEMO, LLAMA3_8B_LORA), hardware, None, 80.0)
    tight = search_recipes(load_config(DEMO, LLAMA3_8B_LORA), hardware, None, 16.5)
    assert roomy.searched > 100 and roomy.recipes and tight.recipes
    for search, cap in ((roomy, 80.0), (tight, 16.5)):
        speeds = [r.tokens_per_s for r in search.recipes]
        assert all(speed <= speeds[0] * 1.01 for speed in speeds)  # ties: less memory first
        for recipe in search.recipes:
            assert recipe.reserved_gib <= cap
            config = load_config(DEMO, [*LLAMA3_8B_LORA, *recipe.overrides])  # the rules pass
            assert config.train.compile
    # less memory never buys speed
    assert tight.recipes[0].tokens_per_s <= roomy.recipes[0].tokens_per_s
    assert any(
        "offload" in o or "checkpointing" in o or "quantize" in o or "fp8" in o
        for o in tight.recipes[0].overrides
    )
    none = search_recipes(load_config(DEMO, LLAMA3_8B_LORA), hardware, None, 2.0)
    assert none.recipes == [] and none.least_gib > 2.0
    assert none.least_gib <= min(r.reserved_gib for r in tight.recipes)


def test_cudnn_attention_is_searched_where_it_runs_and_as_it_was_measured():
    config = load_config(DEMO, LLAMA3_8B_LORA)
    on_h200 = [c for c in candidates(config, Hardware(gpu="H200")) if "model.attention" in c]
    assert on_h200 and all(c["model.attention"] == "cudnn" for c in on_h200)
    for choice in on_h200:  # every activation kept, no budget: how it holds flash's memory
        assert choice["train.activation_checkpointing"] == "none"
        assert choice["train.compile_memory_budget"] == 1.0
    assert not any("model.attention" in c for c in candidates(config, Hardware(gpu="MI300X")))
    latent = load_config(DEMO, [*LLAMA3_8B_LORA, "model.name=deepseek-v2-lite"])
    assert not run_model_args(latent).plain_attention
    assert not any("model.attention" in c for c in candidates(latent, Hardware(gpu="H200")))
    flash4 = load_config(DEMO, [*LLAMA3_8B_LORA, "model.attention=flash4"])
    assert not any("model.attention" in c for c in candidates(flash4, Hardware(gpu="H200")))


def test_plan_fit_prints_the_recipes_with_their_overrides():
    result = CliRunner().invoke(
        app, ["plan", DEMO, *LLAMA3_8B_LORA, "--gpu", "H200", "--no-data", "--fit", "24", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found["fit_gib"] == 24 and found["recipes"]
    first = found["recipes"][0]
    assert first["reserved_gib"] <= 24 and first["overrides"]
    assert first["reserved_gib"] * GIB > first["allocated_gib"] * GIB
