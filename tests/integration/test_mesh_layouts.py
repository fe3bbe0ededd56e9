"""Device-mesh layouts on 4 and 8 gloo ranks (tiny dense and MoE models, fp32): tensor
parallelism, expert parallelism, both, and HSDP, each for LoRA and full fine-tuning, give the
losses of one process over the same global batch (its accumulation equal to the data-parallel
size) over 10 steps; a run's checkpoints reshard across layouts and resume exactly; the adapter
of a tensor × expert-parallel run loads in `peft` with the one-process run's logits."""

import json
import shutil
import subprocess

import pytest
import torch

from tests.cli_runs import losses, torchrun
from tests.helpers import save_tiny_model
from tests.mesh_runs import MODES, REPO, launch, mode_overrides, run_overrides, train

TP, EP, HSDP = (
    "parallel.tensor_parallel",
    "parallel.expert_parallel",
    "parallel.data_parallel_replicate",
)
LAYOUTS = {  # name: (ranks, model, data-parallel ranks, overrides)
    "tp2": (4, "dense", 2, [f"{TP}=2"]),  # TP 2 × FSDP 2
    "hsdp2x2": (4, "dense", 4, [f"{HSDP}=2"]),
    "tp2-hsdp2x1": (4, "dense", 2, [f"{TP}=2", f"{HSDP}=2"]),  # TP 2 × two whole replicas
    "ep2": (4, "moe", 4, [f"{EP}=2"]),
    "ep4": (4, "moe", 4, [f"{EP}=4"]),
    "tp2-ep2": (4, "moe", 2, [f"{TP}=2", f"{EP}=2"]),
    "ep4-hsdp2": (8, "moe", 8, [f"{EP}=4", f"{HSDP}=2"]),
    "tp2-ep2-fsdp4": (8, "moe", 4, [f"{TP}=2", f"{EP}=2"]),
}
REL = 1e-4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_tiny_model(root / "dense", "llama", vocab_size=384)  # the demo tokenizer's vocabulary
    save_tiny_model(root / "moe", "qwen3_moe", vocab_size=384)
    return root


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory, models):
    """Every layout and mode trained: one launch per rank count."""
    root = tmp_path_factory.mktemp("layouts")
    for ranks in (4, 8):
        runs = [
            {
                "overrides": run_overrides(
                    root / f"{name}-{mode}", models / model, "train.grad_accum_steps=1",
                    *extra, *mode_overrides(model, mode),
                )
            }
            for name, (count, model, _, extra) in LAYOUTS.items()
            if count == ranks
            for mode in MODES
        ]  # fmt: skip
        (root / f"stderr{ranks}.txt").write_text(launch(ranks, runs, root / f"spec{ranks}.json"))
    return root


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, models):
    """The one-process runs, by (model, accumulation, mode), trained when first asked for."""
    root = tmp_path_factory.mktemp("one")
    done: dict[tuple, list[float]] = {}

    def losses_of(model: str, accumulation: int, mode: str) -> list[float]:
        key = (model, accumulation, mode)
        if key not in done:
            run = root / "-".join(map(str, key))
            extra = [f"train.grad_accum_steps={accumulation}", *mode_overrides(model, mode)]
            train([{"overrides": run_overrides(run, models / model, *extra)}])
            done[key] = losses(run)
        return done[key]

    losses_of.root = root  # type: ignore[attr-defined]
    return losses_of


@pytest.mark.parametrize("ranks", [4, 8])
def test_mesh_runs_print_no_torch_warnings(layout_runs, ranks):
    """Neither a deprecated mesh slice nor a redistribution torch calls suboptimal (several
    collectives where one flattened dimension takes one), in any layout."""
    said = (layout_runs / f"stderr{ranks}.txt").read_text()
    warned = [line for line in said.splitlines() if "Warning" in line or "suboptimal" in line]
    assert not warned, "\n".join(warned[:12])


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_mesh_layout_trains_as_one_process(layout_runs, one_process, layout, mode):
    _, model, data_parallel, _ = LAYOUTS[layout]
    expected = one_process(model, data_parallel, mode)
    got = losses(layout_runs / f"{layout}-{mode}")
    assert len(got) == len(expected) == 10
    assert got == pytest.approx(expected, rel=REL)
    if mode == "full":  # the weights, gathered from the layout and saved in the HF layout
        from safetensors.torch import load_file

        saved = load_file(layout_runs / f"{layout}-{mode}" / "final" / "model.safetensors")
        alone = one_process.root / f"{model}-{data_parallel}-{mode}"
        reference = load_file(alone / "final" / "model.safetensors")
        assert saved.keys() == reference.keys()
        for name, tensor in reference.items():
            torch.testing.assert_close(saved[name], tensor, rtol=1e-3, atol=1e-4, msg=name)


GRADIENT_CASES = [  # model, mode, tensor, expert, replicate (4 ranks)
    ("dense", "lora", 2, 1, 1),
    ("dense", "full", 2, 1, 2),
    ("moe", "full", 2, 1, 1),  # Qwen3's per-head q/k norms split with their heads
    ("moe", "lora", 2, 2, 1),
    ("moe", "lora", 1, 2, 2),
]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=lambda case: "-".join(map(str, case)))
def test_mesh_gradients_equal_one_process(models, case):
    """The stricter oracle: one forward and backward's gradients, not ten steps' losses."""
    model, mode, *sizes = case
    script = [str(REPO / "tests" / "mesh_gradients.py"), str(models / model), mode]
    done = subprocess.run(
        [*torchrun(4), *script, *map(str, sizes)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-6000:]
    worst = float(done.stdout.split("worst relative gradient difference:")[1].split()[0])
    assert worst < 1e-5


def test_a_tensor_and_expert_parallel_adapter_loads_in_peft_with_the_one_process_logits(
    layout_runs, one_process, models, tmp_path
):
    """The attention adapters (split by tensor parallelism) and the experts' (split by expert
    parallelism) of a TP 2 × EP 2 run, gathered into one PEFT adapter; the one-process run
    trained on the same global batch gives the same logits through `peft`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    one_process("moe", 2, "lora")  # trained into the fixture's directory
    tokens = torch.randint(0, 384, (1, 24), generator=torch.Generator().manual_seed(3))

    def peft_logits(adapter):
        base = AutoModelForCausalLM.from_pretrained(models / "moe", dtype=torch.float32)
        with torch.no_grad():
            return PeftModel.from_pretrained(base, adapter).eval()(tokens).logits

    mesh_adapter = layout_runs / "tp2-ep2-lora" / "adapter"
    config = json.loads((mesh_adapter / "adapter_config.json").read_text())
    assert config["target_parameters"] and "q_proj" in config["target_modules"]
    one_adapter = one_process.root / "moe-2-lora" / "adapter"
    expected = peft_logits(one_adapter)
    torch.testing.assert_close(peft_logits(mesh_adapter), expected, rtol=1e-4, atol=1e-4)


def _resume_from(run, step: int) -> None:
    """Keep only the checkpoint of `step` and the metrics up to it, as a run stopped there."""
    checkpoints = run / "checkpoints"
    for directory in checkpoints.glob("step_*"):
        if directory.name != f"step_{step}":
            shutil.rmtree(directory)
    (checkpoints / "latest").write_text(json.dumps({"step": step, "path": f"step_{step}"}))
    for name in ("finished", "final", "adapter"):
        path = run / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def test_checkpoints_reshard_across_three_layouts_and_resume_exactly(models, tmp_path):
    """TP 2 × EP 2 on 4 ranks saves; one process resumes from its step 3 and saves; FSDP 2 ×
    EP 2 on 2 ranks resumes from that step 6: each continues with the uninterrupted run's
    losses (weights, adapters' optimizer states and the data's position all resharded)."""
    model = models / "moe"
    mode = mode_overrides("moe", "lora")
    straight = tmp_path / "straight"
    launch(4, [{"overrides": run_overrides(straight, model, f"{TP}=2", f"{EP}=2",
                                           "train.grad_accum_steps=1", *mode)}],
           tmp_path / "a.json")  # fmt: skip
    expected = losses(straight)
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    _resume_from(run, 3)
    resumed = {"overrides": run_overrides(run, model, "train.grad_accum_steps=2", *mode)}
    launch(1, [resumed | {"resume": "auto"}], tmp_path / "b.json")
    assert losses(run) == pytest.approx(expected, rel=REL)
    _resume_from(run, 6)
    two = run_overrides(run, model, f"{EP}=2", "train.grad_accum_steps=1", *mode)
    launch(2, [{"overrides": two, "resume": "auto"}], tmp_path / "c.json")
    assert losses(run) == pytest.approx(expected, rel=REL)
    assert (run / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_planner_holds_per_rank_what_the_ranks_hold(layout_runs, models, layout):
    """Full fine-tuning: the parameters each rank keeps (its tensor- and expert-parallel share,
    sharded by FSDP2) and its AdamW states, as the planner predicts them, against the mean over
    the ranks of what they held after the run (FSDP2 splits a dimension unevenly where it must,
    so single ranks differ by a row or two)."""
    from tuneforge.config import load_config
    from tuneforge.plan.planner import plan_run, run_model_args, setup_of
    from tuneforge.plan.prediction import CPU, Hardware

    ranks, model, _, extra = LAYOUTS[layout]
    run = layout_runs / f"{layout}-full"
    config = load_config(
        REPO / "examples" / "demo.yaml", run_overrides(run, models / model, *extra)
    )
    hardware = Hardware(gpus=ranks, gpu=CPU, memory_gib=64)
    setup = setup_of(config, run_model_args(config), hardware, 64.0)
    held = json.loads((run / "held.json").read_text())
    mean = {key: sum(rank[key] for rank in held) / len(held) for key in held[0]}
    assert setup.shares().sharded() * 4 == pytest.approx(mean["parameters"], rel=1e-9)
    assert plan_run(config, hardware).memory.optimizer == pytest.approx(mean["optimizer"], rel=1e-9)
