"""Exact resume: a run interrupted (kill -9, SIGTERM, a time limit) and resumed gives the losses
of the run that was never interrupted, bit for bit, for full fine-tuning and LoRA; a resume that
would change memory-critical settings is refused; non-finite steps follow the policy."""

import json
import os
import signal

import pytest
import torch

from tests.cli_runs import (
    DEMO,
    MODES,
    STEPS,
    assert_clean_failure,
    cli,
    finish,
    losses,
    overrides,
    run_cli,
    wait_for_step,
)
from tuneforge.config import load_config
from tuneforge.errors import TuneforgeError
from tuneforge.runs.files import is_finished, read_metrics
from tuneforge.runs.time_budget import EXIT_RESUME
from tuneforge.train.loop import Trainer


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The losses of each mode run straight through."""
    found = {}
    for mode, extra in MODES.items():
        run = tmp_path_factory.mktemp(f"straight-{mode}") / "run"
        finish(cli(run, *extra))
        found[mode] = losses(run)
        assert len(found[mode]) == STEPS
    return found


@pytest.mark.parametrize("mode", list(MODES))
def test_kill_9_then_resume_gives_identical_losses(tmp_path, references, mode):
    run = tmp_path / "run"
    process = cli(run, *MODES[mode])
    wait_for_step(run, 7, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert json.loads((run / "checkpoints" / "latest").read_text())["step"] == 6
    finish(cli(run, *MODES[mode], resume=True))
    assert losses(run) == references[mode]


def test_sigterm_saves_exits_75_and_resumes_exactly(tmp_path, references):
    run = tmp_path / "run"
    process = cli(run, *MODES["lora"])
    wait_for_step(run, 4, process)
    process.send_signal(signal.SIGTERM)
    finish(process, EXIT_RESUME)
    stopped_at = json.loads((run / "checkpoints" / "latest").read_text())["step"]
    assert 4 <= stopped_at < STEPS and len(losses(run)) == stopped_at
    finish(cli(run, *MODES["lora"], resume=True))
    assert losses(run) == references["lora"]
    finish(cli(run, *MODES["lora"], resume=True))  # finished: nothing to do


def test_time_limit_saves_exits_75_and_resumes_exactly(tmp_path, references):
    run = tmp_path / "run"
    limit = ["train.time_limit=1s", "checkpoint.exit_margin_s=0"]
    finish(cli(run, *MODES["full"], *limit), EXIT_RESUME)
    assert len(losses(run)) < STEPS
    for _ in range(STEPS):  # each job gets a few steps; chain them until the run finishes
        process = cli(
            run, *MODES["full"], "train.time_limit=4s", "checkpoint.exit_margin_s=0", resume=True
        )
        process.communicate(timeout=600)
        if process.returncode == 0:
            break
        assert process.returncode == EXIT_RESUME
    assert losses(run) == references["full"]


def test_a_checkpoint_killed_while_written_leaves_the_previous_one(tmp_path, references):
    run = tmp_path / "run"
    process = cli(run, *MODES["full"])
    wait_for_step(run, 7, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = run / "checkpoints" / ".step_9.partial"  # as a kill in the middle of a save leaves it
    (partial / "dcp").mkdir(parents=True)
    (partial / "dcp" / "__0_0.distcp").write_bytes(b"half a checkpoint")
    finish(cli(run, *MODES["full"], resume=True))
    assert losses(run) == references["full"] and not partial.exists()


def test_host_memory_options_train_exactly_like_the_plain_run(tmp_path, references):
    """`train.offload_activations` through `tuneforge train`: the saved-tensor hooks change
    nothing in the numbers (on a CPU the tiny blocks' tensors stay under the copy size). The
    demo model ties its embedding to the output layer: `train.offload_embedding` is refused."""
    run = tmp_path / "run"
    finish(cli(run, *MODES["lora"], "train.offload_activations=2"))
    assert losses(run) == references["lora"]
    refused = cli(tmp_path / "tied", *MODES["lora"], "train.offload_embedding=true")
    out, err = refused.communicate(timeout=600)
    assert refused.returncode == 2 and "Traceback" not in err
    assert "train.offload_embedding: this model's output layer shares the embedding" in out + err


def test_resume_refuses_changed_memory_settings_unless_forced(tmp_path):
    run = tmp_path / "run"
    finish(cli(run, "train.max_steps=4"))
    (run / "finished").unlink()  # pretend it stopped after its last checkpoint
    config = load_config(DEMO, overrides(run, "train.activation_checkpointing=full"))
    trainer = Trainer(config, resume="auto")
    with pytest.raises(TuneforgeError, match=r"train.activation_checkpointing: 'none' -> 'full'"):
        trainer.setup()
    forced = Trainer(config, resume="auto", force=True)
    forced.setup()
    assert forced.progress.step == 3


def test_a_run_directory_is_not_reused_without_resume_or_overwrite(tmp_path):
    run = tmp_path / "run"
    finish(cli(run, "train.max_steps=2"))
    with pytest.raises(TuneforgeError, match="--resume auto to continue it"):
        Trainer(load_config(DEMO, overrides(run))).setup()


@pytest.mark.parametrize("policy", ["skip", "stop"])
def test_non_finite_steps_follow_the_policy(tmp_path, policy):
    config = load_config(
        DEMO, overrides(tmp_path / "run", "train.max_steps=5", f"train.on_nonfinite={policy}")
    )
    trainer = Trainer(config)
    trainer.setup()
    forward = trainer.objective.forward
    calls = {"n": 0}

    def poisoned(*args):
        calls["n"] += 1
        output = forward(*args)
        poison = calls["n"] in (5, 6)
        return output._replace(loss_sum=output.loss_sum * float("nan")) if poison else output

    trainer.objective.forward = poisoned  # step 3's two micro-batches
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    summary = trainer.train()
    assert summary.skipped_steps == 1
    if policy == "stop":
        assert summary.stopped == "non-finite" and summary.steps == 3
    else:
        assert summary.stopped is None and summary.steps == 5
        assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert records[2]["nonfinite_steps"] == 1 and records[1]["nonfinite_steps"] == 0
    trainer.close()
    os.environ.pop("WORLD_SIZE", None)


def test_run_settings_include_the_offload_options_and_skip_unrecorded_ones():
    from tuneforge.runs.run_dir import changed_settings, run_settings

    config = load_config(DEMO, ["train.offload_activations=2"])
    saved = run_settings(load_config(DEMO, []))
    assert changed_settings(saved, config) == ["train.offload_activations: 0 -> 2"]
    del saved["train.offload_activations"]  # a run saved before the setting existed
    assert changed_settings(saved, config) == []


def test_a_checkpoint_of_other_weights_is_refused_with_its_reason(tmp_path):
    """Resuming from a checkpoint that lacks a trained weight (another model, other adapters,
    or an older layout) names the checkpoint and the missing weight, without a traceback."""
    from torch import nn

    from tuneforge.parallel.distributed import Dist
    from tuneforge.train.save_resume import LoopState, load_checkpoint, save_checkpoint

    def module(name: str) -> nn.Module:
        m = nn.Module()
        m.register_parameter(name, nn.Parameter(torch.ones(3)))
        return m

    saved = module("gate_proj")
    state = LoopState(1, 10, {"position": 0}, 1.0, 1, {})
    path, _ = save_checkpoint(
        tmp_path, saved, torch.optim.AdamW(saved.parameters()), state, Dist(), 2
    )
    other = module("gate_up_proj")
    with pytest.raises(TuneforgeError) as raised:
        load_checkpoint(path, other, torch.optim.AdamW(other.parameters()), Dist())
    message = str(raised.value)
    assert str(path) in message and "Missing key" in message and "gate_up_proj" in message
    assert "Traceback" not in message


def test_a_damaged_newest_checkpoint_is_kept_aside_and_the_one_before_resumes_exactly(
    tmp_path, references
):
    run = tmp_path / "run"
    finish(cli(run, *MODES["lora"]))
    (run / "finished").unlink()  # as if killed after its last checkpoint (step 9)
    data = run / "checkpoints" / "step_9" / "dcp" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:598])
    process = cli(run, *MODES["lora"], resume=True)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out + err
    assert "step_9 is damaged (dcp/__0_0.distcp holds 598 of its" in " ".join(err.split())
    assert losses(run) == references["lora"]
    assert (
        run / "checkpoints" / "damaged" / "step_9" / "dcp" / "__0_0.distcp"
    ).stat().st_size == 598


def test_resume_arguments_that_mean_nothing_are_refused_even_on_a_finished_run(tmp_path):
    run = tmp_path / "run"
    finish(cli(run, "train.max_steps=2"))
    for args in (["--resume", "sometimes"], ["--resume", "auto", "--overwrite"]):
        result = run_cli("train", str(DEMO), *overrides(run, "train.max_steps=2"), *args)
        assert_clean_failure(result, "--resume")
    assert is_finished(run)


def test_a_changed_schedule_is_refused_and_recorded_when_forced(tmp_path):
    run = tmp_path / "run"
    finish(cli(run, "train.max_steps=4"))
    (run / "finished").unlink()
    config = load_config(DEMO, overrides(run, "train.max_steps=6"))
    with pytest.raises(TuneforgeError, match=r"train.max_steps: 4 -> 6.*--force"):
        Trainer(config, resume="auto").setup()
    forced = Trainer(config, resume="auto", force=True)
    forced.setup()
    assert forced.total_steps == 6 and forced.progress.step == 3
    recorded = (run / "config.yaml").read_text()
    assert recorded.startswith("# resumed at step 3 with train.max_steps: 4 -> 6\n")
    assert load_config(run / "config.yaml", []).train.max_steps == 6
    forced.close()
