"""Runs of the demo's data on tiny dense and MoE models under device-mesh layouts: several
trainings in one `torchrun` launch (one process group, so the ranks start once), and the
one-process runs they are compared with. Run as a script under torchrun, it trains every run of
the JSON list it is given."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script under torchrun
    sys.path.insert(0, str(REPO))

from tests.cli_runs import torchrun  # noqa: E402
from tests.helpers import QUIET_DEMO  # noqa: E402

DEMO = REPO / "examples" / "demo.yaml"
STEPS = 10
LORA = ["lora.enabled=true", "lora.rank=4", "lora.dropout=0", "train.lr=1e-2"]
MODES = {"full": [], "lora": LORA}
EXPERT_ADAPTERS = (
    "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,experts.gate_up_proj,experts.down_proj]"
)


def mode_overrides(model: str, mode: str) -> list[str]:
    """A mode's overrides; the MoE model's adapters include its experts'."""
    return [*MODES[mode], EXPERT_ADAPTERS] if model == "moe" and mode == "lora" else MODES[mode]


def run_overrides(run_dir: Path, model_dir: Path, *extra: str) -> list[str]:
    return [
        f"run.output_dir={run_dir}",
        f"data.cache_dir={run_dir.parent / 'cache'}",
        "model.name=null",
        f"model.path={model_dir}",
        f"train.max_steps={STEPS}",
        "train.warmup_steps=2",
        "train.tokens_per_micro_batch=256",
        *QUIET_DEMO,
        "checkpoint.save_steps=3",
        "checkpoint.keep_last=5",
        *extra,
    ]


def train(runs: list[dict]) -> None:
    """Each of `runs` ({"overrides": [...], "resume": "never" | "auto"}) trained in turn in
    this process (one rank of a launch, or the only process)."""
    from tuneforge.config import load_config
    from tuneforge.train.loop import Trainer

    for run in runs:
        config = load_config(DEMO, run["overrides"])
        resume = run.get("resume", "never")
        trainer = Trainer(config, overwrite=resume == "never", resume=resume)
        trainer.setup()
        summary = trainer.train()
        _record_held_bytes(trainer)
        if summary.stopped is None:
            trainer.save()


def _local_bytes(tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _record_held_bytes(trainer) -> None:
    """What each rank holds after its last step, in `held.json` of the run directory: its
    parameters' and its optimizer states' bytes (its shards, under FSDP2 and the mesh)."""
    import torch.distributed as dist

    states = trainer.optimizer.state.values()
    held = {
        "parameters": sum(_local_bytes(p) for p in trainer.model.parameters()),
        "optimizer": sum(
            _local_bytes(value)
            for state in states
            for key, value in state.items()
            if key != "step" and hasattr(value, "numel")
        ),
    }
    ranks = [held]
    if dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, held)
    if trainer.world.is_main:
        (trainer.run_dir / "held.json").write_text(json.dumps(ranks))


def launch(ranks: int, runs: list[dict], spec: Path) -> str:
    """`runs` trained by `ranks` processes started by torchrun (one process: in a child); what
    they wrote to stderr."""
    spec.write_text(json.dumps(runs))
    command = [*(torchrun(ranks) if ranks > 1 else [sys.executable]), __file__, str(spec)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    return done.stderr


if __name__ == "__main__":
    train(json.loads(Path(sys.argv[1]).read_text()))
    import torch.distributed as dist

    from tuneforge.parallel.distributed import exit_rank

    if dist.is_initialized():
        dist.destroy_process_group()
    exit_rank(0)  # as `tuneforge train` ends a rank
