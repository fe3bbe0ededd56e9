from pathlib import Path

import pytest

from tests.helpers import issues_of
from tuneforge.config import ConfigError, dump_config, load_config

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    write(tmp_path / "data" / "train.jsonl", '{"messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp_path / "tok").mkdir()
    return tmp_path


MINIMAL = """\
model:
  name: demo-tiny
tokenizer:
  path: tok
data:
  train:
    - path: data/train.jsonl
train:
  max_steps: 10
"""


def test_minimal_config_resolves_paths_against_the_file(data_dir):
    config = load_config(write(data_dir / "run.yaml", MINIMAL))
    assert config.data.train[0].path == data_dir / "data" / "train.jsonl"
    assert config.tokenizer.path == data_dir / "tok"
    assert config.train.max_steps == 10
    assert config.run.directory == Path("runs/run")


def test_env_interpolation_types_whole_values_and_keeps_quoted_strings(data_dir, monkeypatch):
    monkeypatch.setenv("STEPS", "25")
    monkeypatch.setenv("NAME", "exp")
    text = MINIMAL.replace(
        "max_steps: 10", "max_steps: ${STEPS}\n  lr: ${LR:1.5e-4}\n  seed: '${STEPS}'"
    )
    text += "run:\n  name: ${NAME}-${MISSING_TAG:v1}\n"
    config = load_config(write(data_dir / "run.yaml", text))
    assert config.train.max_steps == 25
    assert config.train.lr == pytest.approx(1.5e-4)
    assert config.run.name == "exp-v1"


def test_quoted_interpolation_stays_a_string_and_plain_one_is_typed(data_dir, monkeypatch):
    monkeypatch.setenv("NUM", "123")
    quoted = load_config(write(data_dir / "a.yaml", MINIMAL + "run:\n  name: '${NUM}'\n"))
    assert quoted.run.name == "123"
    # Unquoted, the substituted text is typed as YAML types it: an int, which is no run name.
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "b.yaml", MINIMAL + "run:\n  name: ${NUM}\n"))
    assert "valid string" in issues_of(raised.value)["run.name"]


def test_unset_variable_without_default_names_variable_file_and_line(data_dir, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    file = write(
        data_dir / "run.yaml", MINIMAL.replace("max_steps: 10", "max_steps: ${NOT_SET_ANYWHERE}")
    )
    with pytest.raises(ConfigError) as raised:
        load_config(file)
    text = str(raised.value)
    assert "NOT_SET_ANYWHERE" in text
    assert f"{file}:9" in text


def test_extends_deep_merges_and_lists_replace(data_dir):
    write(
        data_dir / "presets" / "base.yaml",
        MINIMAL.replace("path: tok", "path: ../tok").replace(
            "data/train.jsonl", "../data/train.jsonl"
        )
        + "lora:\n  rank: 8\n  target_modules: [q_proj, v_proj, o_proj]\n",
    )
    child = write(
        data_dir / "child.yaml",
        "extends: presets/base.yaml\ntrain:\n  lr: 1e-3\nlora:\n  target_modules: [k_proj]\n",
    )
    config = load_config(child)
    assert config.train.max_steps == 10  # kept from the preset
    assert config.train.lr == pytest.approx(1e-3)  # set by the child
    assert config.lora.rank == 8
    assert config.lora.target_modules == ["k_proj"]  # lists replace
    assert config.data.train[0].path == data_dir / "data" / "train.jsonl"  # relative to the preset


def test_dotted_overrides_are_typed(data_dir):
    file = write(data_dir / "run.yaml", MINIMAL)
    config = load_config(
        file, ["train.lr=2e-4", "lora.rank=32", "lora.target_modules=[q_proj]", "run.name=x"]
    )
    assert config.train.lr == pytest.approx(2e-4)
    assert config.lora.rank == 32
    assert config.lora.target_modules == ["q_proj"]
    assert config.run.name == "x"


def test_every_error_is_reported_at_once_with_path_location_and_fix(data_dir):
    text = MINIMAL.replace("max_steps: 10", "max_stpes: 10\n  lr: -1\n  schedule: cosin")
    text += "lora:\n  rank: many\n"
    file = write(data_dir / "run.yaml", text)
    with pytest.raises(ConfigError) as raised:
        load_config(file)
    found = issues_of(raised.value)
    assert "did you mean 'max_steps'" in found["train.max_stpes"]
    assert f"{file}:9" in found["train.max_stpes"]
    assert "greater than 0" in found["train.lr"] and f"{file}:10" in found["train.lr"]
    assert "'cosine'" in found["train.schedule"]
    assert "whole number" in found["lora.rank"]
    assert len(raised.value.issues) >= 4


def test_unknown_section_and_missing_section(data_dir):
    text = MINIMAL.replace("train:\n  max_steps: 10\n", "trian:\n  max_steps: 10\n")
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "run.yaml", text))
    found = issues_of(raised.value)
    assert "did you mean 'train'" in found["trian"]
    assert "required section is missing" in found["train"]


def test_missing_input_file_is_reported(data_dir):
    text = MINIMAL.replace("data/train.jsonl", "data/nope.jsonl")
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "run.yaml", text))
    assert "no such file or directory" in issues_of(raised.value)["data.train.0.path"]


def test_yaml_syntax_error_names_the_line(data_dir):
    file = write(data_dir / "run.yaml", MINIMAL + "lora:\n  rank: [1, 2\n")
    with pytest.raises(ConfigError) as raised:
        load_config(file)
    (issue,) = raised.value.issues
    assert "YAML syntax error" in issue.message
    assert issue.location.startswith(f"{file}:")


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_precision_rules(data_dir):
    text = MINIMAL + "precision:\n  fp8: hybrid\n  fp4: e2m1\n"
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "a.yaml", text))
    assert "mutually exclusive" in issues_of(raised.value)["precision.fp4"]

    text = MINIMAL + "precision:\n  fp4_param: true\n  fp4_param_gather: true\n"
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "b.yaml", text))
    found = issues_of(raised.value)
    assert "fp4_param requires fp4" in found["precision.fp4_param"]
    assert "precision.fp4_param_gather" not in found  # fp4_param is set, so this rule holds

    text = MINIMAL + "precision:\n  fp8_implementation: torchao\n"
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "t.yaml", text))
    assert "requires fp8" in issues_of(raised.value)["precision.fp8_implementation"]

    text = MINIMAL + "precision:\n  fp4: e2m1\n  fp4_param_gather: true\n"
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "c.yaml", text))
    assert "requires fp4_param" in issues_of(raised.value)["precision.fp4_param_gather"]

    ok = load_config(
        write(data_dir / "d.yaml", MINIMAL + "precision:\n  fp4: e2m1\n  fp4_param: true\n")
    )
    assert ok.precision.fp4_param


def test_cross_field_rules_run_alongside_field_errors(data_dir):
    text = MINIMAL.replace("max_steps: 10", "max_steps: 10\n  lr: 1e-4\n  min_lr: 1e-3")
    text += "lora:\n  rank: 0\nparallel:\n  zero_stage: 2\n  reshard_after_forward: true\n"
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "run.yaml", text))
    found = issues_of(raised.value)
    assert {"train.min_lr", "lora.rank", "parallel.reshard_after_forward"} <= set(found)


def test_evaluation_steps_take_their_older_name_once(data_dir):
    text = MINIMAL.replace("max_steps: 10", "max_steps: 10\n  eval_steps: 4")
    text = text.replace("data:\n", "data:\n  eval_fraction: 0.5\n")
    assert load_config(write(data_dir / "old.yaml", text)).eval.every_steps == 4
    same = load_config(write(data_dir / "same.yaml", text + "eval:\n  every_steps: 4\n"))
    assert same.eval.every_steps == 4
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "both.yaml", text + "eval:\n  every_steps: 5\n"))
    found = issues_of(raised.value)
    assert "contradicts eval.every_steps=5" in found["train.eval_steps"]
    no_data = MINIMAL + "eval:\n  every_steps: 5\n"
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "no_data.yaml", no_data))
    assert "data.eval is empty" in issues_of(raised.value)["eval.every_steps"]


def test_kept_blocks_need_checkpointing(data_dir):
    text = MINIMAL.replace("max_steps: 10", "max_steps: 10\n  keep_activations: 2")
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "run.yaml", text))
    assert "train.activation_checkpointing" in issues_of(raised.value)["train.keep_activations"]
    text = text.replace(
        "keep_activations: 2", "keep_activations: 2\n  activation_checkpointing: full"
    )
    assert load_config(write(data_dir / "ok.yaml", text)).train.keep_activations == 2


def test_model_needs_exactly_one_source(data_dir):
    text = MINIMAL.replace("name: demo-tiny", "dtype: float32")
    with pytest.raises(ConfigError, match=r"exactly one of model\.name and model\.path"):
        load_config(write(data_dir / "run.yaml", text))


def test_resolved_config_round_trips(data_dir):
    config = load_config(write(data_dir / "run.yaml", MINIMAL), ["train.lr=3e-4"])
    again = load_config(write(data_dir / "resolved.yaml", dump_config(config)))
    assert again == config


@pytest.mark.parametrize(
    "example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_example_validates(example, tmp_path, monkeypatch):
    from tests.helpers import save_tiny_llama, save_tiny_reward_llama

    save_tiny_llama(tmp_path / "model")
    save_tiny_reward_llama(tmp_path / "reward")
    monkeypatch.setenv("MODEL_DIR", str(tmp_path / "model"))
    monkeypatch.setenv("DEMO_SFT", str(tmp_path / "model"))  # the SFT demo's model, elsewhere
    monkeypatch.setenv("DEMO_REWARD", str(tmp_path / "reward"))  # the reward demo's model
    monkeypatch.setenv("DATA", str(REPO / "tuneforge" / "assets" / "demo_data" / "train.jsonl"))
    load_config(example)


def test_configuration_reference_is_current():
    from tuneforge.config.help import fields_markdown

    assert (REPO / "docs" / "config.md").read_text() == fields_markdown(), (
        "regenerate docs/config.md"
    )


def test_every_field_has_help_text():
    from tuneforge.config.help import field_rows

    missing = [path for path, _type, _default, help_text in field_rows() if not help_text.strip()]
    assert not missing


def test_source_rules_point_at_the_source_line(data_dir):
    write(data_dir / "data" / "meta.json", "{}")
    text = MINIMAL.replace(
        "    - path: data/train.jsonl",
        "    - path: data/train.jsonl\n      metadata: data/meta.json",
    )
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "run.yaml", text))
    found = issues_of(raised.value)
    assert "only applies to format mlperf" in found["data.train.0.metadata"]
    assert "run.yaml:8" in found["data.train.0.metadata"]


def test_a_captured_step_refuses_what_it_cannot_replay(data_dir):
    text = MINIMAL.replace(
        "max_steps: 10",
        "max_steps: 10\n  cuda_graph: true\n  activation_checkpointing: full\n"
        "  offload_checkpoints: true",
    )
    text += "parallel:\n  strategy: ddp\nmodel:\n  name: demo-tiny\n  attention: sdpa\n"
    text = text.replace("model:\n  name: demo-tiny\ntokenizer", "tokenizer", 1)
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "run.yaml", text))
    messages = [str(issue) for issue in raised.value.issues if issue.path == "train.cuda_graph"]
    assert any("host memory (offload_checkpoints)" in m for m in messages)
    assert any("parallel.strategy ddp" in m for m in messages)
    assert any("attention sdpa" in m for m in messages)
    ok = MINIMAL.replace("max_steps: 10", "max_steps: 10\n  cuda_graph: true")
    assert load_config(write(data_dir / "ok.yaml", ok)).train.cuda_graph


def test_checkpoints_that_would_never_be_written_are_said_by_validate():
    from typer.testing import CliRunner

    from tuneforge.cli.main import app
    from tuneforge.config import advisories

    never = load_config(
        REPO / "examples" / "demo.yaml", ["train.max_steps=10", "checkpoint.save_steps=10"]
    )
    assert "no periodic checkpoint will be written" in advisories(never)[0]
    fine = load_config(
        REPO / "examples" / "demo.yaml", ["train.max_steps=10", "checkpoint.save_steps=5"]
    )
    assert advisories(fine) == []
    result = CliRunner().invoke(
        app,
        [
            "config",
            "validate",
            str(REPO / "examples" / "demo.yaml"),
            "train.max_steps=10",
            "checkpoint.save_steps=30",
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0 and "checkpoint.save_steps=30 is not below" in result.output


def test_the_precision_ab_examples_differ_only_in_precision(tmp_path, monkeypatch):
    import shutil

    for file in (REPO / "examples" / "precision-ab").glob("*.yaml"):
        shutil.copy(file, tmp_path)
    (tmp_path / "data").mkdir()
    for name in ("train", "eval"):
        shutil.copy(
            REPO / "tuneforge" / "assets" / "demo_data" / f"{name}.jsonl", tmp_path / "data"
        )
    (tmp_path / "pretrained").mkdir()
    (tmp_path / "pretrained" / "config.json").write_text("{}\n")
    monkeypatch.setenv("AB_BASE", str(tmp_path / "pretrained"))
    tokenizer = f"tokenizer.path={REPO / 'tuneforge' / 'assets' / 'demo_tokenizer'}"
    configs = {
        name: load_config(tmp_path / f"{name}.yaml", [tokenizer]).model_dump(mode="json")
        for name in ("bf16", "fp8", "fp4")
    }
    for name in ("fp8", "fp4"):
        differing = {key for key, value in configs[name].items() if value != configs["bf16"][key]}
        assert differing == {"run", "precision"}
    assert configs["bf16"]["model"]["path"] == str(tmp_path / "pretrained")
    assert configs["fp8"]["precision"]["fp8"] == "e4m3"
    assert configs["fp4"]["precision"]["fp4_param"] is True
    pretrain = load_config(REPO / "examples" / "precision-ab" / "pretrain.yaml")
    assert pretrain.model.name == "llama-3.2-1b" and not pretrain.lora.enabled


def test_an_fp4_all_gather_that_cannot_happen_is_said():
    from tuneforge.config import advisories

    settings = ["lora.enabled=true", "precision.fp4=e2m1", "precision.fp4_param=true"]
    quiet = load_config(REPO / "examples" / "demo.yaml", settings)
    gather = [*settings, "precision.fp4_param_gather=true"]
    sharded = load_config(REPO / "examples" / "demo.yaml", [*gather, "parallel.strategy=fsdp"])
    replicated = load_config(REPO / "examples" / "demo.yaml", [*gather, "parallel.strategy=ddp"])
    assert advisories(quiet) == advisories(sharded) == []
    assert "fp4_param_gather has no effect with parallel.strategy=ddp" in advisories(replicated)[0]


def test_preference_training_needs_pairs_packed_whole_and_a_reference_it_can_have(data_dir):
    dpo = MINIMAL.replace("  max_steps: 10\n", "  max_steps: 10\n  objective: dpo\n")
    text = dpo.replace(
        "    - path: data/train.jsonl\n", "    - path: data/train.jsonl\n  packing: none\n"
    )
    text += "dpo:\n  reference: adapters_off\nlora:\n  enabled: false\n"
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "dpo.yaml", text))
    found = issues_of(raised.value)
    assert "format openai has none" in found["data.train.0.format"]
    assert "packed whole" in found["data.packing"]
    assert "needs LoRA" in found["dpo.reference"]
    pairs = dpo.replace(
        "    - path: data/train.jsonl\n", "    - path: data/train.jsonl\n      format: preference\n"
    )
    config = load_config(write(data_dir / "pairs.yaml", pairs))
    assert config.train.objective == "dpo" and config.dpo.loss == "sigmoid"
    assert config.dpo.reference == "auto" and config.dpo.beta == 0.1


def test_kto_reads_labelled_or_paired_records_and_only_kto_reads_labels():
    demo = REPO / "examples" / "demo.yaml"
    with pytest.raises(ConfigError) as raised:
        load_config(demo, ["train.objective=kto", "kto.reference=adapters_off"])
    found = issues_of(raised.value)
    assert "format openai has no label" in found["data.train.0.format"]
    assert "set format: unpaired" in found["data.train.0.format"]
    assert "needs LoRA" in found["kto.reference"]
    data = REPO / "tuneforge" / "assets" / "demo_data"

    def records(format_: str) -> list[str]:
        return [
            f"data.train=[{{path: {data / 'pairs_train.jsonl'}, format: {format_}}}]",
            f"data.eval=[{{path: {data / 'pairs_eval.jsonl'}, format: {format_}}}]",
        ]

    with pytest.raises(ConfigError) as raised:
        load_config(demo, records("unpaired"))
    assert "does not read the label" in issues_of(raised.value)["data.train.0.format"]
    with pytest.raises(ConfigError) as raised:
        load_config(demo, [*records("unpaired"), "train.objective=dpo"])
    assert "trains on pairs" in issues_of(raised.value)["data.train.0.format"]
    for format_ in ("unpaired", "preference"):
        config = load_config(demo, ["train.objective=kto", *records(format_)])
        assert config.kto.beta == 0.1 and config.kto.reference == "auto"


def test_a_precomputed_reference_needs_a_reference_loss_and_a_cached_teacher_its_top_k():
    demo = REPO / "examples" / "demo.yaml"
    with pytest.raises(ConfigError) as raised:
        load_config(demo, ["train.objective=dpo", "dpo.loss=simpo", "dpo.reference=precomputed"])
    assert "reference-free" in issues_of(raised.value)["dpo.reference"]
    teacher = ["train.objective=distill", "distill.teacher.name=demo-tiny"]
    with pytest.raises(ConfigError) as raised:
        load_config(demo, [*teacher, "distill.teacher_logits=cached"])
    assert "distill.top_k" in issues_of(raised.value)["distill.teacher_logits"]
    config = load_config(demo, [*teacher, "distill.teacher_logits=cached", "distill.top_k=32"])
    assert config.distill.teacher_logits == "cached" and config.distill.top_k == 32


def test_label_smoothing_is_refused_where_the_loss_has_none():
    pairs = REPO / "tuneforge" / "assets" / "demo_data" / "pairs_train.jsonl"
    demo = REPO / "examples" / "demo.yaml"
    dpo = [
        "train.objective=dpo",
        f"data.train=[{{path: {pairs}, format: preference}}]",
        "data.eval=[]",
        "eval.every_steps=null",
        "eval.num_samples=0",
    ]
    with pytest.raises(ConfigError) as raised:
        load_config(demo, [*dpo, "dpo.loss=ipo", "dpo.label_smoothing=0.1"])
    assert "ipo has none" in issues_of(raised.value)["dpo.label_smoothing"]
    assert load_config(demo, [*dpo, "dpo.label_smoothing=0.1"]).dpo.label_smoothing == 0.1


def test_a_run_or_adapter_directory_given_as_a_model_is_named_with_what_to_give(tmp_path):
    """distill.teacher (or model.path) pointed at a run or an adapter: the field and the fix,
    at load time, before any data is read."""
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    (run / "final" / "config.json").write_text("{}\n")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}\n")
    demo = REPO / "examples" / "demo.yaml"
    teacher = ["train.objective=distill"]
    with pytest.raises(ConfigError) as raised:
        load_config(demo, [*teacher, f"distill.teacher.path={run}"])
    found = issues_of(raised.value)["distill.teacher.path"]
    assert "is a run directory" in found and str(run / "final") in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        load_config(demo, [*teacher, f"distill.teacher.path={adapter}"])
    assert "is an adapter" in issues_of(raised.value)["distill.teacher.path"]
    assert "tuneforge export merge" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        load_config(demo, ["model.name=null", f"model.path={tmp_path}"])
    assert "has no config.json" in issues_of(raised.value)["model.path"]


def test_a_model_name_and_path_from_two_files_are_each_shown_where_they_are_set(data_dir):
    """An `extends` file sets model.name, the config sets model.path: both places named."""
    from tests.helpers import save_tiny_llama

    save_tiny_llama(data_dir / "model")
    base = write(data_dir / "base.yaml", MINIMAL)
    child = write(
        data_dir / "child.yaml", f"extends: base.yaml\nmodel:\n  path: {data_dir / 'model'}\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_config(child)
    said = str(raised.value)
    assert "model.name (demo-tiny) is set, and model.path too" in said
    assert f"{base}:" in said and f"{child}:" in said


def test_a_teacher_given_as_one_string_is_a_directory_a_hub_id_or_a_catalog_name(data_dir):
    """`distill: {teacher: DIR}`: a relative directory resolves against the config file, as
    `teacher.path` does; a hub id stays one; a name without a slash is a catalog shape."""
    from tests.helpers import save_tiny_llama

    save_tiny_llama(data_dir / "teacher")
    config_file = write(
        data_dir / "distill.yaml",
        MINIMAL.replace("max_steps: 10", "max_steps: 10\n  objective: distill")
        + "distill: {teacher: ./teacher}\n",
    )
    assert load_config(config_file).distill.teacher.path == (data_dir / "teacher").resolve()
    named = load_config(config_file, ["distill.teacher=demo-tiny"]).distill.teacher
    assert named.name == "demo-tiny" and named.path is None
    with pytest.raises(ConfigError) as raised:
        load_config(config_file, ["distill.teacher=./missing"])
    assert "distill.teacher.path" in issues_of(raised.value)


def test_an_override_replaces_a_value_before_its_variable_is_read(data_dir, monkeypatch):
    monkeypatch.delenv("UNSET_MODEL", raising=False)
    text = MINIMAL.replace("name: demo-tiny", "path: ${UNSET_MODEL}")
    with pytest.raises(ConfigError) as raised:
        load_config(write(data_dir / "run.yaml", text))
    assert list(issues_of(raised.value)) == ["model.path"]  # the variable, said once
    assert "UNSET_MODEL is not set" in issues_of(raised.value)["model.path"]
    config = load_config(data_dir / "run.yaml", ["model.path=null", "model.name=demo-tiny"])
    assert config.model.name == "demo-tiny"


def test_an_override_names_a_list_item_by_its_index(data_dir):
    (data_dir / "other.jsonl").write_text((data_dir / "data" / "train.jsonl").read_text())
    config = load_config(
        write(data_dir / "run.yaml", MINIMAL), [f"data.train.0.path={data_dir / 'other.jsonl'}"]
    )
    assert config.data.train[0].path == data_dir / "other.jsonl"
    with pytest.raises(ConfigError, match=r"data\.train is a list of 1 item; 'x' is none"):
        load_config(data_dir / "run.yaml", ["data.train.x.path=a"])
