"""One pipeline from a built model to its first step (`train/prepare.py`): the trainer and the
benchmark both prepare their model through it, so a benchmark measures what `tuneforge train`
runs."""

from tests.cli_runs import DEMO
from tuneforge.bench import ours
from tuneforge.bench.workloads import ALL_LINEAR, Workload
from tuneforge.config import load_config
from tuneforge.train import loop, prepare


def _structure(prepared) -> tuple[list[tuple[str, str]], list[tuple[str, tuple[int, ...]]]]:
    """The prepared objective's modules (name, class) and its trained parameters' shapes."""
    objective = prepared.objective
    modules = [(name, type(module).__name__) for name, module in objective.named_modules()]
    trained = [(n, tuple(p.shape)) for n, p in objective.named_parameters() if p.requires_grad]
    return modules, trained


def test_the_trainer_and_the_bench_prepare_the_model_through_one_function(tmp_path, monkeypatch):
    assert loop.prepare_model is ours.prepare_model is prepare.prepare_model
    prepared = {}

    def spy(who):
        def prepare_model(config, model, *args, **kwargs):
            prepared[who] = prepare.prepare_model(config, model, *args, **kwargs)
            return prepared[who]

        return prepare_model

    monkeypatch.setattr(loop, "prepare_model", spy("trainer"))
    monkeypatch.setattr(ours, "prepare_model", spy("bench"))
    ours.run_ours(Workload("tiny", "demo-tiny", ALL_LINEAR, tokens=256), "eager", 1, 1)
    config = load_config(
        DEMO,
        [f"run.output_dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}",
         "model.dtype=bfloat16", "lora.enabled=true", "lora.rank=16", "lora.alpha=32",
         f"lora.target_modules=[{', '.join(ALL_LINEAR)}]", "train.tokens_per_micro_batch=256",
         "logging.tensorboard=false"],
    )  # fmt: skip
    trainer = loop.Trainer(config)
    try:
        trainer.setup()
    finally:
        trainer.close()
    assert set(prepared) == {"trainer", "bench"}
    assert _structure(prepared["trainer"]) == _structure(prepared["bench"])
