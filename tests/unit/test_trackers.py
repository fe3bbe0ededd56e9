"""Experiment trackers read back through their own formats: MLflow's local file store (its own
client) and a W&B offline run (its records, W&B's protobuf schema) hold the run's configuration
and the numbers of every metrics line at its step; a missing package is refused before the run
directory is touched."""

import sys
from pathlib import Path

import pytest

from tests.helpers import QUIET_DEMO, train_demo
from tuneforge.config import load_config
from tuneforge.errors import TuneforgeError
from tuneforge.train.trackers import MLFLOW_ID, WANDB_ID, require_packages

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = [
    "train.max_steps=3",
    "train.tokens_per_micro_batch=256",
    *QUIET_DEMO,
    "logging.project=tracked",
]


def tracked_run(run_dir: Path, *extra: str) -> list[dict]:
    return [r for r in train_demo(run_dir, [*OVERRIDES, *extra]) if "loss" in r]


def test_mlflow_holds_the_config_and_every_metrics_line(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    records = tracked_run(tmp_path / "run", "logging.report_to=[mlflow]")
    client = mlflow.tracking.MlflowClient((tmp_path / "run" / "mlruns").resolve().as_uri())
    run = client.get_run((tmp_path / "run" / MLFLOW_ID).read_text())
    assert client.get_experiment(run.info.experiment_id).name == "tracked"
    assert run.data.params["train.lr"] == "0.003" and run.data.params["model.name"] == "demo-tiny"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(r["step"], r["loss"]) for r in records]


def wandb_records(run_file: Path):
    """The protobuf records of a W&B run file: LevelDB's log format (32 KiB blocks, each record
    a checksum, a length, a kind and its bytes; long records in pieces) after W&B's header."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    position, pending = 7, b""
    while position + 7 <= len(data):
        if (left := 32768 - position % 32768) < 7:
            position += left
            continue
        length, kind = (
            int.from_bytes(data[position + 4 : position + 6], "little"),
            data[position + 6],
        )
        piece = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = piece if kind in (1, 2) else pending + piece
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb_offline_holds_the_config_and_every_metrics_line(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import json

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    records = tracked_run(tmp_path / "run", "logging.report_to=[wandb]")
    run_id = (tmp_path / "run" / WANDB_ID).read_text()
    (run_file,) = (tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    config, losses = {}, []
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            assert record.run.project == "tracked"
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
        elif kind == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            losses.append((items["_step"], items["loss"]))
    assert config["train"]["lr"] == 0.003 and config["model"]["name"] == "demo-tiny"
    assert losses == [(r["step"], r["loss"]) for r in records]


def test_a_missing_tracker_package_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    config = load_config(REPO / "examples" / "demo.yaml", ["logging.report_to=[mlflow]"])
    with pytest.raises(
        TuneforgeError, match=r"report_to needs the mlflow package.*tuneforge\[mlflow\]"
    ):
        require_packages(config)


@pytest.mark.parametrize(
    ("overrides", "module", "said"),
    [
        (["model.quantize=nf4"], "bitsandbytes", "model.quantize: needs the bitsandbytes package"),
        (["logging.report_to=[wandb]"], "wandb", "tuneforge[wandb]"),
        (["precision.fp8=e4m3", "precision.fp8_implementation=torchao", "model.dtype=bfloat16"],
         "torchao",
         "pip install torchao"),
    ],
)  # fmt: skip
def test_missing_optional_packages_are_found_before_any_work(
    tmp_path, monkeypatch, overrides, module, said
):
    """`config validate` names them; `train` refuses before tokenising or making its run
    directory."""
    from typer.testing import CliRunner

    from tuneforge.cli.main import app
    from tuneforge.train.loop import Trainer

    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    lora = ["lora.enabled=true"] if "model.quantize=nf4" in overrides else []
    arguments = [*overrides, *lora, f"run.output_dir={tmp_path / 'run'}"]
    result = CliRunner().invoke(
        app, ["config", "validate", str(REPO / "examples" / "demo.yaml"), *arguments]
    )
    assert result.exit_code == 2 and said in result.output.replace("\n", " "), result.output
    trainer = Trainer(load_config(REPO / "examples" / "demo.yaml", arguments))
    with pytest.raises(TuneforgeError, match=said.replace("[", "\\[").replace("]", "\\]")):
        trainer.setup()
    assert not (tmp_path / "run").exists()


def test_trackers_that_could_not_log_are_refused_at_start(tmp_path, monkeypatch):
    """W&B online without a key, and an MLflow server that does not answer (checked with a
    short timeout, not MLflow's minutes of retries), stop the run before any work."""
    import socket
    import time

    from tuneforge.train.trackers import check_trackers

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    wandb = load_config(REPO / "examples" / "demo.yaml", ["logging.report_to=[wandb]"])
    with pytest.raises(TuneforgeError, match=r"wandb has no API key.*WANDB_MODE=offline"):
        check_trackers(wandb, {})
    check_trackers(wandb, {"WANDB_MODE": "offline"})
    check_trackers(wandb, {"WANDB_API_KEY": "x" * 40})
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password secret\n")
    (tmp_path / ".netrc").chmod(0o600)
    check_trackers(wandb, {})

    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    mlflow = load_config(REPO / "examples" / "demo.yaml", ["logging.report_to=[mlflow]"])
    start = time.perf_counter()
    with pytest.raises(TuneforgeError, match=r"MLFLOW_TRACKING_URI=http://127.0.0.1:\d+ does not"):
        check_trackers(mlflow, {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"})
    assert time.perf_counter() - start < 10
    check_trackers(mlflow, {})  # logs into the run directory
