"""Two processes on CPU (gloo) through torchrun: the same global batch gives the losses of one
process, for DDP and FSDP2; a two-rank run killed and resumed gives its own losses exactly, and
a checkpoint written by two ranks resumes on one."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.cli_runs import (
    DEMO,
    MODES,
    REPO,
    WIDE_LOG,
    finish,
    losses,
    overrides,
    torchrun,
    wait_for_step,
)
from tuneforge.runs.files import read_metrics

STEPS = 8


def launch(run_dir: Path, ranks: int, *extra: str, resume: bool = False) -> subprocess.Popen:
    train = ["-m", "tuneforge", "train", str(DEMO), *overrides(run_dir, *extra)]
    train += [f"train.max_steps={STEPS}", "checkpoint.save_steps=2"]
    train += ["--resume", "auto"] if resume else ["--overwrite"]
    args = [*torchrun(ranks), *train] if ranks > 1 else [sys.executable, *train]
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=WIDE_LOG
    )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """Two micro-batches per step on one process: the global batch of two ranks with one each."""
    run = tmp_path_factory.mktemp("one") / "run"
    finish(launch(run, 1))
    return losses(run)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "auto"])
def test_two_ranks_give_the_losses_of_one(tmp_path, one_process, strategy):
    """`auto` on CPUs (memory unknown): FSDP2, chosen by the first rank for both."""
    run = tmp_path / "run"
    process = launch(run, 2, "train.grad_accum_steps=1", f"parallel.strategy={strategy}")
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out + err
    assert losses(run) == pytest.approx(one_process, rel=1e-5, abs=1e-6)
    if strategy == "auto":
        assert "parallel.strategy auto: fsdp" in out + err


MASTER = ["model.dtype=bfloat16", "precision.master_weights=true"]


@pytest.fixture(scope="module")
def one_process_master(tmp_path_factory):
    run = tmp_path_factory.mktemp("one-master") / "run"
    finish(launch(run, 1, *MASTER))
    return step_records(run)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_master_weights_on_two_ranks_train_as_on_one_and_save_bf16(
    tmp_path, one_process_master, strategy
):
    """bf16 compute over fp32 masters: MasterAdamW on one process and under DDP, fp32 shards
    under FSDP2. FSDP2 reduces the ranks' bf16 gradients in fp32 where one process sums its
    micro-batches' in bf16: the first step's gradient norms agree to one bf16 unit, and the
    losses after one update to the rounding of that update. Later steps are not compared: at the
    demo's learning rate the difference grows with every step (an AVX2 CPU measured 1.5e-3 by
    the fourth step, 3e-5 at the second)."""
    run = tmp_path / "run"
    process = launch(run, 2, *MASTER, "train.grad_accum_steps=1", f"parallel.strategy={strategy}")
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out + err
    got, one = step_records(run), one_process_master
    assert len(got) == len(one) == STEPS
    assert got[0]["loss"] == pytest.approx(one[0]["loss"], rel=1e-6)  # the same bf16 weights
    assert got[0]["grad_norm"] == pytest.approx(one[0]["grad_norm"], rel=2**-7)
    assert got[1]["loss"] == pytest.approx(one[1]["loss"], rel=3e-4)
    assert got[1]["loss"] < got[0]["loss"] - 1.0  # the update was taken
    text = " ".join((out + err).split())
    assert "trained weights: fp32 master" in text
    assert ("FSDP2 shards" in text) == (strategy == "fsdp")
    with safe_open(run / "final" / "model.safetensors", "pt") as saved:
        assert {saved.get_slice(name).get_dtype() for name in saved.keys()} == {"BF16"}  # noqa: SIM118


def test_two_zero2_ranks_accumulating_give_the_losses_of_one(tmp_path):
    """FSDP2 under ZeRO-2 keeps its parameters gathered between a step's micro-batches and
    gathers them again after each update: two ranks of two micro-batches each train as one
    process with four."""
    finish(launch(tmp_path / "one", 1, "train.grad_accum_steps=4"))
    two = tmp_path / "two"
    zero2 = ["train.grad_accum_steps=2", "parallel.strategy=fsdp", "parallel.zero_stage=2"]
    finish(launch(two, 2, *zero2))
    assert losses(two) == pytest.approx(losses(tmp_path / "one"), rel=1e-5, abs=1e-6)


def test_two_ddp_ranks_with_compiled_blocks_give_the_losses_of_one(tmp_path):
    """DDP's gradients as views into its buckets, filled by compiled blocks' backward graphs."""
    finish(launch(tmp_path / "one", 1, "train.compile=true"))
    two = tmp_path / "two"
    finish(
        launch(two, 2, "train.compile=true", "train.grad_accum_steps=1", "parallel.strategy=ddp")
    )
    assert losses(two) == pytest.approx(losses(tmp_path / "one"), rel=1e-5, abs=1e-6)


def test_two_lora_ranks_resume_exactly(tmp_path):
    """With the ranks' micro-batches dealt by attention work (data.balance_ranks): the deal is
    the seed's, so the resumed run hands out the same micro-batches."""
    lora = ["train.grad_accum_steps=1", "parallel.strategy=ddp", "data.balance_ranks=true"]
    lora += MODES["lora"]
    reference = tmp_path / "straight"
    finish(launch(reference, 2, *lora))
    run = tmp_path / "run"
    process = launch(run, 2, *lora)
    wait_for_step(run, 5, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    subprocess.run(["pkill", "-9", "-f", str(run)], check=False)
    unbalanced = launch(run, 2, *lora, "data.balance_ranks=false", resume=True)
    _, err = unbalanced.communicate(timeout=600)
    assert unbalanced.returncode != 0 and "ValueError" not in err  # torchrun adds its own trace
    assert "error: resuming" in err and "saved with data.balance_ranks on" in err, err[-2000:]
    finish(launch(run, 2, *lora, resume=True))
    assert losses(run) == losses(reference)


@pytest.mark.parametrize(
    ("precision", "one_rank_rel"), [([], 1e-4), (MASTER, 2e-3)], ids=["fp32", "bf16-master"]
)
def test_two_ranks_resume_exactly_and_on_one_rank(tmp_path, precision, one_rank_rel):
    """With master weights the checkpoint holds the fp32 shards, and one process resumes from
    them into its bf16 weights and fp32 masters; it then sums its two micro-batches' bf16
    gradients where FSDP2 reduced them in fp32: equal to bf16 rounding, not to fp32's."""
    fsdp = ["train.grad_accum_steps=1", "parallel.strategy=fsdp", *precision]
    reference = tmp_path / "straight"
    finish(launch(reference, 2, *fsdp))
    run = tmp_path / "run"
    process = launch(run, 2, *fsdp)
    wait_for_step(run, 5, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    subprocess.run(["pkill", "-9", "-f", str(run)], check=False)  # the ranks torchrun started
    assert json.loads((run / "checkpoints" / "latest").read_text())["step"] == 4
    finish(launch(run, 2, *fsdp, resume=True))
    assert losses(run) == losses(reference)
    # a checkpoint of two FSDP ranks reshards onto one process (two micro-batches per step)
    (run / "finished").unlink()
    for step_dir in (run / "checkpoints").glob("step_*"):
        if step_dir.name != "step_6":
            continue
        (run / "checkpoints" / "latest").write_text(json.dumps({"step": 6, "path": "step_6"}))
    finish(launch(run, 1, "train.max_steps=8", *precision, resume=True))
    assert losses(run)[6:] == pytest.approx(losses(reference)[6:], rel=one_rank_rel)


def test_an_fp4_lora_base_under_fsdp2_trains_as_under_ddp(tmp_path):
    """Emulated FP4 under FSDP2: the quantised base replicated on every rank, or with
    fp4_param_gather its codes and scales sharded and all-gathered as bytes, which computes
    exactly the same. Against DDP: FSDP2's reduction rounds the adapters' last bits
    differently, and at this learning rate FP4's coarse rounding of the activations amplifies
    that some thirty times a step (an AVX2 CPU measured 7e-8 in the second step's gradient
    norm, 4e-5 in the third step's loss, 4% by the sixth), so DDP is matched over the first
    two steps, before it compounds: the gradients of the same weights, then of one update."""
    fp4 = ["train.grad_accum_steps=1", *MODES["lora-fp4"]]
    settings = {
        "ddp": ["parallel.strategy=ddp"],
        "fsdp": ["parallel.strategy=fsdp"],
        "gather": ["parallel.strategy=fsdp", "precision.fp4_param_gather=true"],
    }
    logs = {}
    for name, extra in settings.items():
        process = launch(tmp_path / name, 2, *fp4, *extra)
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, out + err
        logs[name] = " ".join((out + err).split())
    steps = {name: step_records(tmp_path / name) for name in settings}
    assert steps["gather"] == steps["fsdp"]
    for key in ("loss", "grad_norm"):
        fsdp, ddp = ([step[key] for step in steps[name][:2]] for name in ("fsdp", "ddp"))
        assert fsdp == pytest.approx(ddp, rel=1e-5), key
    losses_fsdp = [step["loss"] for step in steps["fsdp"]]
    assert min(losses_fsdp[1:]) < losses_fsdp[0] - 1.0
    assert "FP4 codes replicated on every rank" in logs["fsdp"]
    assert "sharded across the ranks and all-gathered as FP4" in logs["gather"]


def step_records(run_dir: Path) -> list[dict]:
    """Each step's loss and gradient norm."""
    records = read_metrics(run_dir / "metrics.jsonl")
    return [{"loss": r["loss"], "grad_norm": r["grad_norm"]} for r in records if "loss" in r]


def test_frozen_models_beside_the_trained_one_are_sharded_and_train_as_on_one_rank(tmp_path):
    """Under FSDP2 an MoE distillation teacher and a preference run's frozen copy have their
    blocks sharded across the ranks: two ranks give one process's losses."""
    from tests.helpers import save_tiny_model
    from tuneforge.models.api import model_args

    teacher = tmp_path / "teacher"
    save_tiny_model(teacher, "qwen3_moe", vocab_size=model_args("demo-tiny").vocab_size)
    pairs = REPO / "tuneforge" / "assets" / "demo_data" / "pairs_train.jsonl"
    objectives = {
        "distill": ["train.objective=distill", f"distill.teacher.path={teacher}",
                    "distill.teacher.dtype=float32", "distill.kd_weight=0.8"],
        "dpo": ["train.objective=dpo", f"data.train=[{{path: {pairs}, format: preference}}]",
                "dpo.reference=frozen_copy", "train.lr=1.0e-3"],
    }  # fmt: skip
    for name, settings in objectives.items():
        finish(launch(tmp_path / f"{name}-one", 1, *settings))
        two = launch(tmp_path / f"{name}-two", 2, *settings, "train.grad_accum_steps=1",
                     "parallel.strategy=fsdp")  # fmt: skip
        out, err = two.communicate(timeout=600)
        assert two.returncode == 0, out + err
        one_rank = losses(tmp_path / f"{name}-one")
        assert losses(tmp_path / f"{name}-two") == pytest.approx(one_rank, rel=1e-5, abs=1e-6)
        if name == "distill":
            assert "teacher: its blocks sharded across the 2 ranks" in " ".join((out + err).split())


def test_a_lora_reward_model_saved_by_two_fsdp_ranks_equals_one_process(tmp_path):
    """A reward model's adapters are folded in one weight at a time, each gathered from the
    shards of both ranks: the saved classifier equals the one process's."""
    pairs = REPO / "tuneforge" / "assets" / "demo_data" / "pairs_train.jsonl"
    settings = ["train.objective=reward", f"data.train=[{{path: {pairs}, format: preference}}]",
                "lora.enabled=true", "lora.rank=4", "train.lr=1.0e-3"]  # fmt: skip
    finish(launch(tmp_path / "one", 1, *settings))
    two = launch(tmp_path / "two", 2, *settings, "train.grad_accum_steps=1",
                 "parallel.strategy=fsdp")  # fmt: skip
    out, err = two.communicate(timeout=600)
    assert two.returncode == 0, out + err
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5, abs=1e-6)
    saved = {}
    for name in ("one", "two"):
        with safe_open(tmp_path / name / "final" / "model.safetensors", "pt") as weights:
            saved[name] = {key: weights.get_tensor(key) for key in weights.keys()}  # noqa: SIM118
    assert saved["one"].keys() == saved["two"].keys()
    assert "score.weight" in saved["one"] and not any("lora" in key for key in saved["one"])
    for key, tensor in saved["one"].items():
        assert saved["two"][key].float().allclose(tensor.float(), rtol=1e-4, atol=1e-6), key
