"""The command line on bad input: exit code 2, a clear message, no traceback."""

import json
import subprocess
import sys

import pytest

from tests.cli_runs import REPO, assert_clean_failure, run_cli


def test_missing_config_file(tmp_path):
    result = run_cli("config", "validate", str(tmp_path / "absent.yaml"))
    assert_clean_failure(result, "config file not found")


def test_bad_yaml(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  name: demo-tiny\n  dtype: [float32\n")
    result = run_cli("config", "validate", str(config))
    assert_clean_failure(result, "YAML syntax error", f"{config}:")


def test_unknown_key_and_a_bad_override_together():
    result = run_cli("train", "examples/demo.yaml", "train.lrr=1e-3", "lora.rank=-1")
    assert_clean_failure(result, "2 configuration problems", "did you mean 'lr'", "lora.rank")


def test_offload_without_checkpointing():
    result = run_cli("config", "validate", "examples/demo.yaml", "train.offload_checkpoints=true")
    assert_clean_failure(result, "train.offload_checkpoints", "activation_checkpointing: full")


def test_host_embedding_in_a_full_fine_tune():
    result = run_cli(
        "config", "validate", "examples/demo.yaml", "train.offload_embedding=true",
        "lora.enabled=false",
    )  # fmt: skip
    assert_clean_failure(result, "train.offload_embedding", "lora.enabled: true")


def test_a_captured_step_where_it_cannot_run(tmp_path):
    """On a CPU: refused before the first step, saying why, and the run directory untouched
    by any step."""
    result = run_cli(
        "train", "examples/demo.yaml", "train.cuda_graph=true", "train.max_steps=2",
        f"run.output_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert_clean_failure(result, "train.cuda_graph", "not on a CUDA GPU", "drop train.cuda_graph")
    assert "eval: step" not in result.stdout
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_validate_and_show_a_good_config():
    result = run_cli("config", "validate", "examples/demo.yaml")
    assert result.returncode == 0 and "is valid" in result.stdout
    shown = run_cli("config", "show", "examples/demo.yaml", "train.lr=1e-3")
    assert shown.returncode == 0 and "lr: 0.001" in shown.stdout


@pytest.mark.parametrize("command", [["--help"], ["config", "fields"], ["models"]])
def test_help_commands(command):
    result = run_cli(*command)
    assert result.returncode == 0
    assert result.stdout.strip()


def test_generate_from_a_directory_that_is_no_run(tmp_path):
    result = run_cli("generate", str(tmp_path), "--prompt", "hi")
    assert_clean_failure(
        result, "is neither a run directory (no config.yaml) nor a model directory"
    )


def test_data_inspect_on_a_bad_file_names_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "i", "output": "o"}\n{"instruction": 5, "output": "o"}\n')
    result = run_cli(
        "data", "inspect", "--data", str(bad), "--format", "alpaca", "--tokenizer", "demo"
    )
    assert_clean_failure(result, f'{bad}:2: field "instruction" must be a string')


def test_data_inspect_json_and_preview():
    result = run_cli("data", "inspect", "examples/demo.yaml", "--json")
    assert result.returncode == 0, result.stderr

    assert json.loads(result.stdout)["kept"] == 20000
    preview = run_cli("data", "preview", "examples/demo.yaml", "-n", "2")
    assert preview.returncode == 0 and preview.stdout.count("⟦") == 2


def test_export_errors_are_clean(tmp_path):
    assert_clean_failure(
        run_cli("export", "merge", str(tmp_path), "--out", str(tmp_path / "m")),
        "neither a finished run",
    )
    assert_clean_failure(
        run_cli("export", "gguf", "--base", str(tmp_path / "nope"), "--out", str(tmp_path / "x")),
        "no config.json",
    )
    assert not (tmp_path / "m").exists() and not (tmp_path / "x").exists()


def test_doctor_reads_stdin_and_names_missing_files(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tuneforge", "doctor", "oom", "-", "--json"],
        input="torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.00 GiB. GPU 0 has a "
        "total capacity of 63.98 GiB of which 0.50 GiB is free. Of the allocated memory 55.00 GiB "
        "is allocated by PyTorch, and 7.00 GiB is reserved by PyTorch but unallocated.",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert '"kind": "fragmentation"' in result.stdout
    assert_clean_failure(run_cli("doctor", "log", str(tmp_path / "absent.log")), "no such file")


def test_simple_mistakes_get_a_message_not_a_traceback(tmp_path):
    assert_clean_failure(run_cli("plan", "examples/demo.yaml", "--gpus", "0"), "--gpus")
    assert_clean_failure(
        run_cli("train", "examples/demo.yaml", "run.output_dir=/proc/tuneforge-run"),
        "run.output_dir: cannot write the run directory /proc/tuneforge-run",
    )
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer_config.json").write_text("{}")
    assert_clean_failure(
        run_cli("data", "preview", "examples/demo.yaml", f"tokenizer.path={tokenizer}"),
        f"{tokenizer} has no tokenizer.json",
    )
    one_process = tmp_path / "one"
    assert_clean_failure(
        run_cli(
            "train", "examples/demo.yaml", "parallel.strategy=fsdp", f"run.output_dir={one_process}"
        ),
        "parallel.strategy=fsdp needs processes started by torchrun",
    )
    assert not one_process.exists()


@pytest.mark.parametrize("command", ["config validate", "plan", "train"])
def test_an_unknown_catalog_shape_is_named_not_a_traceback(command, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        *command.split(), "examples/demo.yaml", "model.name=no-such-shape",
        f"run.output_dir={run_dir}",
    )  # fmt: skip
    assert_clean_failure(result, "unknown model shape 'no-such-shape'", "llama-3-8b")
    assert not run_dir.exists()


def test_a_held_out_file_problem_names_data_eval(tmp_path):
    empty = tmp_path / "eval.jsonl"
    empty.write_text("")
    result = run_cli("config", "validate", "examples/demo.yaml", f"data.eval.0.path={empty}")
    assert_clean_failure(result, f"data.eval: {empty}: the file is empty")


def test_a_zero_slurm_time_limit_is_refused(tmp_path):
    result = run_cli("slurm", "examples/demo.yaml", "--time", "0", f"run.output_dir={tmp_path}/r")
    assert_clean_failure(result, "--time: '0' is no time")


def test_fp8_is_refused_on_a_machine_without_fp8_before_the_run_directory_exists(tmp_path):
    """`config validate` says the configuration is valid and this machine cannot run it, in the
    words `train` refuses it with."""
    settings = ["precision.fp8=e4m3", "model.dtype=bfloat16", "lora.enabled=true"]
    validated = run_cli("config", "validate", "examples/demo.yaml", *settings)
    assert validated.returncode == 2
    said = "precision.fp8 needs a GPU with FP8 tensor cores"
    assert said in validated.stdout and "valid, but this machine cannot run it" in validated.stdout
    run_dir = tmp_path / "run"
    result = run_cli("train", "examples/demo.yaml", *settings, f"run.output_dir={run_dir}")
    assert_clean_failure(result, said)
    assert not run_dir.exists()


def test_preview_names_a_conversation_the_template_cannot_render(tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
        '{"messages": [{"role": "user", "content": "<tool>"}, {"role": "assistant", "content": "ok"}]}\n'
    )
    template = (
        "{% for m in messages %}{% if '<tool>' in m['content'] %}"
        "{{ raise_exception('this template has no tool role') }}{% endif %}"
        "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        f"extends: {REPO / 'examples' / 'demo.yaml'}\n"
        f"tokenizer:\n  chat_template: {json.dumps(template)}\n"
        f"data:\n  train:\n    - path: {data}\n"
    )
    result = run_cli("data", "preview", str(config))
    assert_clean_failure(result, f"{data}:2: the chat template cannot render", "no tool role")
    assert result.stdout.count("⟦") == 1  # the first record is shown


def test_preview_shows_every_source(tmp_path):
    lines = (REPO / "tuneforge" / "assets" / "demo_data" / "eval.jsonl").read_text().splitlines()
    for name, part in (("first", lines[:5]), ("second", lines[5:10])):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(part) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(
        f"extends: {REPO / 'examples' / 'demo.yaml'}\n"
        f"data:\n  train:\n    - path: {tmp_path / 'first.jsonl'}\n"
        f"    - path: {tmp_path / 'second.jsonl'}\n"
    )
    result = run_cli("data", "preview", str(config), "-n", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("first.jsonl:") == 2 and result.stdout.count("second.jsonl:") == 2


LIGHT = """
import sys
from tuneforge.cli import main
sys.argv = ["tuneforge", *sys.argv[1:]]
try:
    main()
except SystemExit as stop:
    heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    print("exit", stop.code, "heavy", ",".join(heavy) or "none")
"""


@pytest.mark.parametrize(
    "command",
    [
        ["train", "/nonexistent.yaml"],
        ["plan", "/nonexistent.yaml"],
        ["config", "validate", "/nonexistent.yaml"],
        ["export", "merge", "--out", "/tmp/never", "/nonexistent"],
        ["export", "gguf", "--out", "/tmp/never.gguf", "/nonexistent"],
        ["data", "inspect", "--data", "/nonexistent.jsonl"],
        ["generate", "/nonexistent", "--prompt", "hi"],
        ["chat", "/nonexistent"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_mistake_in_the_arguments_is_reported_before_torch_is_imported(command):
    """Bad input is answered in well under a second, not after the seconds torch takes."""
    result = subprocess.run(
        [sys.executable, "-c", LIGHT, *command], capture_output=True, text=True, timeout=120,
        cwd=REPO,
    )  # fmt: skip
    assert "exit 2 heavy none" in result.stdout, (result.stdout, result.stderr[-2000:])
