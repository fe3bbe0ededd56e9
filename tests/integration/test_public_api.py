"""The public API (`tuneforge.__all__`), used as a script or a notebook uses it: only public
names, a whole campaign on the demo (train, evaluate, generate, merge, compare, the doctor), an
error path of each function, and its names and signatures held to a recorded list."""

import contextlib
import inspect
import io
import json

import pytest

import tuneforge

SIGNATURES = {
    "config": "(source, *overrides, **settings)",
    "validate": "(source, *, with_data=True)",
    "train": "(source, on_step=None, on_eval=None, *, on_start=None, overwrite=False, "
    "resume='never', force=False, progress=False)",
    "plan": "(source, *, gpu=None, gpus=1, nodes=1, gpu_mem=None, time_limit=None, "
    "fit_gib=None, what_if=(), with_data=True, rates=None)",
    "evaluate": "(run, data=None, *, num_samples=None, max_new_tokens=None)",
    "generate": "(run, prompts, *, max_new_tokens=64, temperature=0.0, top_p=1.0, top_k=0, "
    "seed=0, batch_size=32)",
    "generate_dataset": "(run, data, out, *, overwrite=False, max_new_tokens=64, "
    "temperature=0.0, top_p=1.0, top_k=0, seed=0, batch_size=32, advance=None)",
    "export_merge": "(run, out, *, base=None, adapter=None, dtype=None, overwrite=False)",
    "export_gguf": "(model, out, *, quant='f16', base=None, adapter=None, overwrite=False)",
    "compare": "(runs, *, smoothing=0.9, plot=None)",
    "doctor_oom": "(text, *, torch_version=None, config=None, gpus=1)",
    "doctor_log": "(run, *, time_limit=None, config=None, gpus=1, gpu='H100')",
    "doctor_env": "()",
    "plot": "(runs, out)",
    "inspect_data": "(source)",
    "catalog": "()",
    "slurm_chain": "(config_file, *overrides, jobs=1, time, nodes=1, gpus_per_node=0, "
    "procs_per_node=None, partition=None, account=None, env=None, out=None)",
    "slurm_submit": "(directory)",
    "slurm_status": "(run_dir)",
    "load_model": "(path_or_shape, *, num_layers=None, dtype=None, device=None, "
    "attention='auto', seed=0, init_std=0.02, draw_on=None)",
    "save_model": "(model, out_dir, dtype=None)",
    "apply_lora": "(model, config, generator=None, dtype=None)",
    "merge_lora": "(model)",
    "save_adapter": "(model, out_dir, base_model='', write=True)",
    "load_adapter": "(model, adapter_dir, dtype=None)",
}
TYPES = [
    "RunConfig", "ConfigIssue", "TuneforgeError", "ConfigError", "DataError", "RecordError",
    "ExportError", "AdapterError", "HubError", "Validation", "RunStart", "TrainSummary", "PlanResult",
    "RunEvaluation", "Comparison",
]  # fmt: skip
DEMO = "examples/demo.yaml"
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.50 GiB is free. Of the allocated memory 70.00 GiB is "
    "allocated by PyTorch, and 6.00 GiB is reserved by PyTorch but unallocated."
)


def shape(obj) -> str:
    """A signature without its annotations: the names, kinds and defaults a caller relies on."""
    signature = inspect.signature(obj)
    bare = [p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=inspect.Signature.empty))


def test_the_public_names_and_signatures_are_the_recorded_ones():
    assert sorted(tuneforge.__all__) == sorted([*SIGNATURES, *TYPES])
    assert {name: shape(getattr(tuneforge, name)) for name in SIGNATURES} == SIGNATURES
    assert all(isinstance(getattr(tuneforge, name), type) for name in TYPES)
    errors = ["ConfigError", "DataError", "RecordError", "ExportError", "AdapterError", "HubError"]
    assert all(issubclass(getattr(tuneforge, name), tuneforge.TuneforgeError) for name in errors)


def test_the_subpackages_named_like_functions_stay_modules():
    import importlib
    import pkgutil

    import tuneforge.config.loading
    import tuneforge.train.loop

    for package in pkgutil.iter_modules(tuneforge.__path__):  # each sets `tuneforge.<name>`
        importlib.import_module(f"tuneforge.{package.name}")
    assert all(callable(getattr(tuneforge, name)) for name in SIGNATURES)

    assert callable(tuneforge.config) and callable(tuneforge.train) and callable(tuneforge.plan)
    assert tuneforge.config.loading.load_config and tuneforge.train.loop.Trainer


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """A demo run trained through the API, and what its callbacks saw."""
    root = tmp_path_factory.mktemp("api")
    seen: dict[str, list] = {"start": [], "steps": [], "evals": []}
    config = tuneforge.config(
        DEMO, "train.max_steps=12", run__output_dir=str(root / "run"), eval__every_steps=6,
        eval__num_samples=20, logging__tensorboard=False, data__cache_dir=str(root / "cache"),
    )  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        summary = tuneforge.train(
            config, on_step=seen["steps"].append, on_eval=seen["evals"].append,
            on_start=seen["start"].append,
        )  # fmt: skip
    return root, config, summary, seen, printed.getvalue()


def test_a_run_trained_through_the_api_reports_what_the_cli_shows(campaign):
    root, config, summary, seen, printed = campaign
    assert printed == ""  # the library prints nothing unless asked to
    assert isinstance(summary, tuneforge.TrainSummary) and summary.stopped is None
    assert summary.run_dir == root / "run" and summary.steps == 12
    assert summary.saved == root / "run" / "final" and (summary.saved / "config.json").is_file()
    assert [record["step"] for record in seen["steps"]] == list(range(1, 13))
    assert summary.losses == [record["loss"] for record in seen["steps"]]
    assert summary.final_loss == summary.losses[-1]
    (start,) = seen["start"]
    assert isinstance(start, tuneforge.RunStart) and start.total_steps == 12
    assert [evaluation.step for evaluation in seen["evals"]] == [0, 6, 12]
    assert summary.evaluations[-1].loss.loss == seen["evals"][-1].loss.loss
    again = tuneforge.train(config, resume="auto")  # finished: nothing is run again
    assert again.finished_before and again.steps == 12
    # as its metrics.jsonl logged them: every logging.log_steps steps and the last
    assert again.losses == [summary.losses[9], summary.losses[11]]


def test_evaluate_generate_merge_compare_and_the_doctor_on_that_run(campaign, tmp_path):
    _, _, summary, _, _ = campaign
    evaluation = tuneforge.evaluate(summary.run_dir, num_samples=20)
    # the same held-out loss the run logged at its last evaluation
    assert evaluation.loss == pytest.approx(summary.evaluations[-1].loss.loss, rel=1e-6)
    assert evaluation.exact_match.num_total == 20
    replies = tuneforge.generate(summary.run_dir, ["sort: 3 1 2", "max: 4 9"], max_new_tokens=8)
    assert len(replies) == 2 and all(isinstance(reply, str) for reply in replies)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "min: 5 2"}\n')
    written = tuneforge.generate_dataset(summary.run_dir, prompts, tmp_path / "answers.jsonl")
    assert written == 1
    (line,) = (tmp_path / "answers.jsonl").read_text().splitlines()
    assert json.loads(line)["messages"][0]["content"] == "min: 5 2"
    merged = tuneforge.export_merge(summary.run_dir, tmp_path / "merged")
    assert (merged / "config.json").is_file()
    comparison = tuneforge.compare([summary.run_dir])
    assert comparison.summaries[0].steps == 12
    assert tuneforge.doctor_log(summary.run_dir).step_time_s > 0
    assert tuneforge.doctor_oom(OOM).kind != "unknown"
    assert tuneforge.plot([summary.run_dir], tmp_path / "curves.png").is_file()


def test_the_smaller_commands_data_models_environment_and_slurm(tmp_path):
    report = tuneforge.inspect_data(DEMO)
    assert report.records == 20000 and 0 < report.packing_efficiency <= 1
    assert tuneforge.catalog()["llama-3-8b"].num_layers == 32
    assert tuneforge.doctor_env().platform == "cpu"
    script, submit = tuneforge.slurm_chain(
        DEMO, f"run.output_dir={tmp_path / 'run'}", jobs=3, time="2h", out=tmp_path / "slurm"
    )
    assert "#SBATCH --time=02:00:00" in script.read_text() and submit.is_file()
    assert tuneforge.slurm_status(tmp_path / "run").state == "not started"


def test_validate_runs_the_preflight_and_returns_this_machines_issues():
    checked = tuneforge.validate(DEMO)
    assert isinstance(checked, tuneforge.Validation) and checked.config.model.name == "demo-tiny"
    fp8 = tuneforge.config(DEMO, "precision.fp8=e4m3", "model.dtype=bfloat16", "lora.enabled=true")
    (issue,) = tuneforge.validate(fp8, with_data=False).machine_issues
    assert issue.path == "precision.fp8" and "FP8 tensor cores" in issue.message


def test_plan_predicts_and_searches_recipes():
    config = tuneforge.config(
        DEMO, "model.name=llama-3-8b", "model.dtype=bfloat16", "lora.enabled=true"
    )
    predicted = tuneforge.plan(config, gpu="H100", with_data=False, what_if=["lora.rank=64"])
    assert isinstance(predicted, tuneforge.PlanResult) and predicted.plan is not None
    assert predicted.plan.memory.total > 0 and predicted.plan.step_time_s > 0
    assert [item["change"] for item in predicted.plan.what_if] == ["lora.rank=64"]
    found = tuneforge.plan(config, gpu="H100", with_data=False, fit_gib=24)
    assert found.plan is None and found.recipes is not None and found.recipes.recipes


ERRORS = {
    # function: (call, the words of its error)
    "config": (lambda tmp: tuneforge.config(DEMO, train__lrr=1e-3), "did you mean 'lr'"),
    "validate": (
        lambda tmp: tuneforge.validate(tuneforge.config(DEMO, parallel__tensor_parallel=4)),
        "parallel.tensor_parallel: 4 must divide the 6 attention heads",
    ),
    "train": (
        lambda tmp: tuneforge.train(
            tuneforge.config(DEMO, run__output_dir=str(tmp / "refused"), parallel__strategy="fsdp")
        ),
        "needs processes started by torchrun",
    ),
    "plan": (lambda tmp: tuneforge.plan(DEMO, gpu="H7", with_data=False), "--gpu H7: unknown"),
    "evaluate": (lambda tmp: tuneforge.evaluate(tmp), "is no run directory"),
    "generate": (lambda tmp: tuneforge.generate(tmp / "none", "hi"), "no such run or model"),
    "generate_dataset": (
        lambda tmp: tuneforge.generate_dataset(tmp, tmp / "p.jsonl", tmp / "x" / "o.jsonl"),
        "there is no directory",
    ),
    "export_merge": (lambda tmp: tuneforge.export_merge(tmp, tmp / "out"), "is neither"),
    "export_gguf": (lambda tmp: tuneforge.export_gguf(tmp, tmp / "m.gguf"), "is neither"),
    "compare": (lambda tmp: tuneforge.compare([tmp]), "has no metrics.jsonl"),
    "doctor_oom": (
        lambda tmp: tuneforge.doctor_oom(OOM, config=tmp / "absent.yaml"),
        "config file not found",
    ),
    "doctor_log": (lambda tmp: tuneforge.doctor_log(tmp / "absent.log"), "no such file"),
    "plot": (lambda tmp: tuneforge.plot([tmp], tmp / "c.png"), "metrics.jsonl"),
    "inspect_data": (
        lambda tmp: tuneforge.inspect_data(tuneforge.config(DEMO, data__max_seq_len=4)),
        "data.max_seq_len",
    ),
    "slurm_chain": (lambda tmp: tuneforge.slurm_chain(DEMO, time="0"), "is no time"),
    "slurm_submit": (lambda tmp: tuneforge.slurm_submit(tmp), "write the chain first"),
    "slurm_status": (lambda tmp: tuneforge.slurm_status(tmp / "none"), "no such run directory"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_each_function_raises_a_tuneforge_error_that_says_what_to_do(name, tmp_path):
    call, words = ERRORS[name]
    with pytest.raises(tuneforge.TuneforgeError, match=words.replace("(", r"\(")):
        call(tmp_path)
    assert not (tmp_path / "refused").exists()  # a refused run makes no directory


def test_a_configuration_error_names_the_field_and_the_fix():
    with pytest.raises(tuneforge.ConfigError) as raised:
        tuneforge.config({"model": {"name": "demo-tiny"}, "train": {"lr": -1}})
    issues = {issue.path: issue for issue in raised.value.issues}
    assert "data" in issues and "train.lr" in issues and issues["train.lr"].fix


def test_every_function_of_the_api_has_an_error_case():
    # the model functions have tests of their own; the catalog and this machine's report take
    # nothing a caller could give wrong
    commands = set(SIGNATURES) - {"load_model", "save_model", "apply_lora", "merge_lora",
                                  "save_adapter", "load_adapter", "catalog", "doctor_env"}  # fmt: skip
    assert sorted(ERRORS) == sorted(commands)
