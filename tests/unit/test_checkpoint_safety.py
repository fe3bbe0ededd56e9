"""Checkpoints that cannot run code, that say when they are damaged, and a save that fails with
one clear message (the disk full, a file system gone read-only) leaving the previous one intact."""

import io
import pickle
import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from tuneforge.errors import TuneforgeError
from tuneforge.parallel.distributed import Dist
from tuneforge.runs.checkpoint_dirs import damage, newest_intact
from tuneforge.train.safe_dcp_reader import (
    DamagedCheckpointError,
    SafeLoadPlanner,
    SafeReader,
    UnsafeCheckpointError,
)
from tuneforge.train.save_resume import (
    CheckpointWriteError,
    LoopState,
    load_checkpoint,
    save_checkpoint,
)


class Payload:
    """Unpickled, it creates `marker`: what a crafted file could do with anything it names."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (io.open, (self.marker, "w"))


def tiny():
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def saved(tmp_path, step=1):
    model, optimizer = tiny()
    state = LoopState(step, 10, {"position": 0}, 1.0, 1, {})
    path, _ = save_checkpoint(tmp_path, model, optimizer, state, Dist(), keep_last=3)
    return path


def load(path):
    model, optimizer = tiny()
    return load_checkpoint(path, model, optimizer, Dist())


def quiet_save(content, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(content, checkpoint_id=path)


def test_a_crafted_metadata_file_is_refused_and_runs_nothing(tmp_path):
    path = saved(tmp_path / "run")
    marker = tmp_path / "ran"
    (path / "dcp" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata: refused.*io\.open"):
        load(path)
    assert not marker.exists()
    # the stock reader runs it: the test plants a real payload
    with pytest.raises(CheckpointException), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"x": 0}, checkpoint_id=path / "dcp")
    assert marker.exists()


def test_a_crafted_value_in_the_data_files_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    quiet_save({"lr": Payload(marker), "w": torch.ones(2)}, tmp_path / "ckpt")
    state = {"lr": 0.5, "w": torch.zeros(2)}
    with pytest.raises(CheckpointException) as raised, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(
            state,
            checkpoint_id=tmp_path / "ckpt",
            storage_reader=SafeReader(tmp_path / "ckpt"),
            planner=SafeLoadPlanner(tmp_path / "ckpt"),
        )
    assert "UnsafeCheckpointError" in str(raised.value) and "io.open" in str(raised.value)
    assert not marker.exists()


def test_plain_values_and_the_optimizer_state_come_back_through_the_safe_reader(tmp_path):
    quiet_save({"lr": 0.25, "betas": (0.9, 0.99), "flag": None, "w": torch.arange(3.0)}, tmp_path)
    state = {"lr": 0.0, "betas": (0.0, 0.0), "flag": True, "w": torch.zeros(3)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(
            state,
            checkpoint_id=tmp_path,
            storage_reader=SafeReader(tmp_path),
            planner=SafeLoadPlanner(tmp_path),
        )
    assert state["lr"] == 0.25 and tuple(state["betas"]) == (0.9, 0.99) and state["flag"] is None
    assert torch.equal(state["w"], torch.arange(3.0))

    path = saved(tmp_path / "run", step=4)
    model, optimizer = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert load_checkpoint(path, model, optimizer, Dist()).step == 4
    assert all(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.999)


def test_a_file_cut_short_is_named_and_the_newest_intact_checkpoint_found(tmp_path):
    run = tmp_path / "run"
    first, second = saved(run, step=2), saved(run, step=4)
    assert damage(second) is None and newest_intact(run) == (second, [])
    data = second / "dcp" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:100])
    problem = damage(second)
    assert problem is not None and "dcp/__0_0.distcp holds 100 of its" in problem
    assert newest_intact(run) == (first, [(second, problem)])


def test_garbled_metadata_is_damage_not_an_attack(tmp_path):
    path = saved(tmp_path / "run")
    metadata = path / "dcp" / ".metadata"
    metadata.write_bytes(bytes(len(metadata.read_bytes())))  # same size, zeros
    with pytest.raises(DamagedCheckpointError, match=r"step_1 is damaged \(\.metadata"):
        load(path)


def test_no_room_for_the_checkpoint_stops_before_writing_and_says_so(tmp_path, monkeypatch):
    run = tmp_path / "run"
    previous = saved(run, step=2)
    usage = shutil.disk_usage(run)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=100))
    with pytest.raises(CheckpointWriteError) as raised:
        saved(run, step=4)
    message = str(raised.value)
    assert str(run / "checkpoints") in message and "0.00 GiB free" in message
    assert f"{previous} is intact" in message and "--resume auto" in message
    assert not (run / "checkpoints" / "step_4").exists()
    assert not (run / "checkpoints" / ".step_4.partial").exists()
    assert load(previous).step == 2


def test_a_write_that_fails_half_way_leaves_one_message_and_the_previous_checkpoint(
    tmp_path, monkeypatch
):
    run = tmp_path / "run"
    previous = saved(run, step=2)

    def full_disk(*args, **kwargs):  # what the zip writer raises when the disk fills up
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch.serialization, "_save", full_disk)
    with pytest.raises(CheckpointWriteError) as raised:
        saved(run, step=4)
    message = str(raised.value)
    assert "unexpected pos 704 vs 598" in message and "could not be written" in message
    assert "Traceback" not in message and len(message.splitlines()) == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_2"]
    monkeypatch.undo()
    assert load(previous).step == 2


def test_a_full_disk_while_saving_the_weights_says_so_and_leaves_no_half_directory(
    tmp_path, monkeypatch
):
    from safetensors import SafetensorError

    from tuneforge.runs import outputs

    def fills_the_disk(model, out, *args, **kwargs):
        out.mkdir(parents=True)
        (out / "model-00001-of-00004.safetensors").write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device")

    monkeypatch.setattr(outputs, "save_hf_model", fills_the_disk)
    with pytest.raises(TuneforgeError) as raised:
        outputs.save_base(tmp_path, nn.Linear(2, 2), tokenizer=None)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'base'}: writing the random-init base model failed")
    assert "No space left on device" in message and "GiB free there" in message
    assert not (tmp_path / "base").exists()


def test_a_checkpoint_garbled_in_place_is_kept_aside_and_the_one_before_loaded(tmp_path):
    """Damage the file sizes cannot show (same length, other bytes) is found when loading."""
    from tuneforge.train.save_resume import load_intact

    run = tmp_path / "run"
    first, second = saved(run, step=2), saved(run, step=4)
    data = second / "dcp" / "__0_0.distcp"
    data.write_bytes(bytes(len(data.read_bytes())))
    assert damage(second) is None  # the sizes still match
    model, optimizer = tiny()
    with pytest.raises(DamagedCheckpointError):
        load_intact(second, model, optimizer, Dist(), fall_back=False)
    state, source = load_intact(second, model, optimizer, Dist(), fall_back=True)
    assert (state.step, source) == (2, first)
    assert (run / "checkpoints" / "damaged" / "step_4" / "dcp" / "__0_0.distcp").is_file()
