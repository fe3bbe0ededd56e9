"""`tuneforge compare` on run directories written here: the gaps between smoothed curves, the
held-out figures, speed and memory, what else differs, and its errors."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from tuneforge.cli.main import app
from tuneforge.errors import TuneforgeError
from tuneforge.runs.compare import compare_runs, smooth


def write_run(directory, losses, evals, seed=0, precision=None, speed=1000.0):
    directory.mkdir(parents=True)
    config = {
        "model": {"dtype": "bfloat16"},
        "train": {"seed": seed},
        "run": {"name": directory.name},
    }
    config["precision"] = precision or {"fp8": None, "fp4": None}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [{"step": step, "eval_loss": value} for step, value in evals]
    lines += [
        {
            "step": step,
            "loss": loss,
            "tokens_per_s": speed * (0.1 if step <= 3 else 1.0),
            "mem_peak_gib": 10.0 + step / 100,
        }
        for step, loss in enumerate(losses, start=1)
    ]
    (directory / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    return directory


def test_smoothing_is_the_debiased_moving_average():
    assert smooth([2.0, 4.0], 0.5) == [2.0, pytest.approx((0.25 * 2 + 0.5 * 4) / 0.75)]
    assert smooth([1.0, 5.0, 3.0], 0.0) == [1.0, 5.0, 3.0]


def test_a_run_two_percent_above_the_reference_shows_a_two_percent_gap(tmp_path):
    losses = [3.0 / (1 + 0.1 * step) + 0.05 * (-1) ** step for step in range(40)]
    reference = write_run(tmp_path / "bf16", losses, [(0, 3.0), (40, 1.5)])
    fp8 = write_run(
        tmp_path / "fp8",
        [1.02 * loss for loss in losses],
        [(0, 3.0), (20, 1.4), (40, 1.53)],
        precision={"fp8": "e4m3", "fp8_scaling": "rowwise", "fp8_base_weights": True},
        speed=1400.0,
    )
    first, second = compare_runs([reference, fp8])
    assert first.mean_gap == pytest.approx(0.0) and first.precision == "bfloat16"
    assert second.precision == "fp8 e4m3 rowwise, base in FP8 only"
    assert second.mean_gap == pytest.approx(0.02) and second.max_gap == pytest.approx(0.02)
    assert second.final_eval_loss == 1.53 and second.best_eval_loss == 1.4
    assert second.eval_gap == pytest.approx(0.02) and second.eval_gap_step == 40
    assert second.tokens_per_s == 1400.0  # the warm-up steps are left out
    assert second.speedup == pytest.approx(1.4)
    assert second.peak_gib == pytest.approx(10.4)
    assert second.differs_in == []


def test_a_run_stopped_sooner_is_compared_at_the_last_step_both_evaluated(tmp_path):
    reference = write_run(tmp_path / "bf16", [3.0, 2.0, 1.5, 1.2], [(2, 1.6), (4, 1.2)])
    short = write_run(tmp_path / "fp4", [3.0, 2.1, 1.6], [(2, 1.68), (3, 1.5)])
    summary = compare_runs([reference, short])[1]
    assert summary.eval_gap == pytest.approx(0.05) and summary.eval_gap_step == 2
    assert summary.final_eval_loss == 1.5 and summary.final_eval_step == 3
    result = CliRunner().invoke(
        app, ["compare", str(reference), str(short)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0 and "(+5.0% at step 2)" in result.output


def test_other_differences_are_named_and_the_cli_writes_json_and_a_plot(tmp_path):
    reference = write_run(tmp_path / "a", [3.0, 2.0, 1.5, 1.2], [(4, 1.3)])
    other = write_run(tmp_path / "b", [3.1, 2.1, 1.6, 1.3], [(4, 1.4)], seed=1)
    assert compare_runs([reference, other])[1].differs_in == ["train.seed"]
    image = tmp_path / "ab.png"
    result = CliRunner().invoke(
        app, ["compare", str(reference), str(other), "--json", "--out", str(image)]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["reference"] == "a" and document["runs"][1]["differs_in"] == ["train.seed"]
    assert image.stat().st_size > 10_000
    table = CliRunner().invoke(app, ["compare", str(reference), str(other)])
    assert "b also differs from a in 1 settings: train.seed" in table.output
    assert document["runs"][1]["speedup"] == 1.0


def test_a_directory_without_metrics_is_named(tmp_path):
    with pytest.raises(TuneforgeError, match=r"has no metrics\.jsonl"):
        compare_runs([tmp_path])
    with pytest.raises(TuneforgeError, match="smoothing"):
        compare_runs([tmp_path], smoothing=1.0)


def test_a_run_given_twice_is_refused_not_counted_twice(tmp_path):
    run = write_run(tmp_path / "a", [2.0, 1.0], [(2, 1.5)])
    with pytest.raises(TuneforgeError, match="is given twice"):
        compare_runs([run, tmp_path / "." / "a"])


def test_runs_of_one_precision_are_grouped_and_gaps_judged_against_the_references_spread(
    tmp_path,
):
    from tuneforge.runs.compare import read_runs
    from tuneforge.runs.compare_groups import group_by_precision

    fp8 = {"fp8": "e4m3", "fp8_scaling": "rowwise", "fp8_base_weights": True}
    fp4 = {"fp4": "e2m1", "fp4_recipe": "nvfp4", "fp4_param": True}
    losses = [3.0, 2.0, 1.5, 1.2]
    runs = [
        write_run(tmp_path / "bf16-s0", losses, [(2, 1.60), (4, 1.00)], seed=0),
        write_run(tmp_path / "bf16-s1", losses, [(2, 1.64), (4, 1.04)], seed=1),
        write_run(tmp_path / "bf16-s2", losses, [(2, 1.56), (4, 0.96)], seed=2),
        write_run(tmp_path / "fp8-s0", losses, [(2, 1.52), (4, 0.95)], precision=fp8),
        write_run(tmp_path / "fp8-s1", losses, [(2, 1.48), (4, 0.93)], seed=1, precision=fp8),
        write_run(tmp_path / "fp4-s0", losses[:3], [(2, 1.70)], precision=fp4),
        write_run(tmp_path / "rounded-s0", losses, [(2, 1.58), (4, 0.99)]),
    ]
    config = yaml.safe_load((runs[-1] / "config.yaml").read_text())
    config["model"]["path"] = "/models/rounded"
    (runs[-1] / "config.yaml").write_text(yaml.safe_dump(config))
    groups = group_by_precision(read_runs(runs))
    assert [(g.precision, len(g.runs)) for g in groups] == [
        ("bfloat16", 3),
        ("fp8 e4m3 rowwise, base in FP8 only", 2),
        ("fp4 nvfp4 (emulated, packed)", 1),
        ("bfloat16, model.path=/models/rounded", 1),
    ]
    bf16, fp8_group, fp4_group, rounded = groups
    assert all(group.step == 2 for group in groups)  # the FP4 run stopped before step 4
    assert bf16.mean_eval == pytest.approx(1.60) and bf16.spread == pytest.approx(0.08 / 1.60)
    assert (bf16.low_eval, bf16.high_eval) == (1.56, 1.64)
    assert fp8_group.gap == pytest.approx(-0.0625) and fp8_group.within_spread is False
    assert fp4_group.gap == pytest.approx(0.0625) and fp4_group.spread is None
    assert rounded.gap == pytest.approx(-0.0125) and rounded.within_spread is True
    assert bf16.mean_final_loss == pytest.approx(compare_runs(runs)[0].final_loss)
    result = CliRunner().invoke(app, ["compare", *map(str, runs)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "held-out at step 2: mean" in result.output and "-6.2% (beyond)" in result.output
    document = json.loads(CliRunner().invoke(app, ["compare", *map(str, runs), "--json"]).output)
    assert [group["runs"] for group in document["groups"]][1] == ["fp8-s0", "fp8-s1"]


def objective_run(directory, objective, losses, evals, extra=None, exact=None):
    """A run of `objective` whose `loss` is `losses`; `extra`: more metrics per step (and
    `eval_` ones at the evaluations)."""
    directory.mkdir(parents=True)
    config = {"model": {"dtype": "bfloat16"}, "train": {"objective": objective}}
    if objective == "dpo":
        config["dpo"] = {"loss": "sigmoid"}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [
        {"step": step, "loss": loss, **{k: v[step - 1] for k, v in (extra or {}).items()}}
        for step, loss in enumerate(losses, start=1)
    ]
    for step, value in evals:
        record = {"step": step, "eval_loss": value}
        record |= {f"eval_{k}": v[step - 1] for k, v in (extra or {}).items()}
        record |= {"eval_accuracy": exact} if exact is not None else {}
        lines.append(record)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return directory


def test_runs_of_different_objectives_are_compared_by_their_cross_entropy(tmp_path):
    """A DPO pair loss is not set beside an SFT cross-entropy: the SFT run and the distilled
    one are compared by their cross-entropy, the DPO run by exact match only, and it is said."""
    sft = objective_run(tmp_path / "sft", "sft", [2.0, 1.0, 0.5, 0.4], [(4, 0.5)], exact=0.88)
    dpo = objective_run(tmp_path / "dpo", "dpo", [0.69, 0.5, 0.4, 0.3], [(4, 0.3)], exact=0.89)
    ce = [2.2, 1.1, 0.55, 0.44]
    distill = objective_run(
        tmp_path / "distill", "distill", [5.0, 3.0, 2.0, 1.0], [(4, 1.0)],
        extra={"ce_loss": ce, "kd_loss": [8.0, 5.0, 3.0, 1.5]}, exact=0.87,
    )  # fmt: skip
    first, second, third = compare_runs([sft, dpo, distill], smoothing=0.0)
    assert [s.objective for s in (first, second, third)] == [
        "sft",
        "dpo sigmoid",
        "distill forward_kl",
    ]
    assert {s.compared_by for s in (first, second, third)} == {"cross-entropy"}
    assert second.final_loss is None and second.mean_gap is None and second.eval_gap is None
    assert second.final_eval_loss is None and second.final_exact_match == 0.89
    assert third.final_loss == 0.44 and third.eval_gap == pytest.approx(0.44 / 0.5 - 1)
    assert third.mean_gap == pytest.approx(0.1)
    output = (
        CliRunner()
        .invoke(app, ["compare", str(sft), str(dpo), str(distill)], env={"COLUMNS": "250"})
        .output
    )
    assert "optimise different objectives" in output and "DPO sigmoid loss per pair" in output
    assert "cross-entropy (last)" in output and "89.0%" in output
    same = compare_runs([sft, sft])
    assert same[1].compared_by == "loss" and same[1].final_loss is not None


def test_the_table_shows_the_last_loss_beside_the_smoothed_one_and_every_difference(tmp_path):
    reference = write_run(tmp_path / "a", [3.0, 2.0, 1.5, 0.1], [(4, 1.3)])
    other = write_run(tmp_path / "b", [3.1, 2.1, 1.6, 0.2], [(4, 1.4)])
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["train"] |= {f"knob_{i}": i for i in range(11)}
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    summary = compare_runs([reference, other])[1]
    assert summary.last_loss == 0.2 and summary.final_loss > 0.5
    output = (
        CliRunner()
        .invoke(app, ["compare", str(reference), str(other)], env={"COLUMNS": "250"})
        .output
    )
    assert f"{summary.final_loss:.4f} (0.2000)" in output
    assert "in 11 settings" in output and "train.knob_9" in output


def test_plot_labels_each_loss_by_what_it_is(tmp_path):
    from tuneforge.runs.plot import plot_runs

    sft = objective_run(tmp_path / "sft", "sft", [2.0, 1.0, 0.5], [(3, 0.5)])
    dpo = objective_run(tmp_path / "dpo", "dpo", [0.69, 0.5, 0.4], [(3, 0.3)])
    result = CliRunner().invoke(app, ["plot", str(sft), str(dpo), "--out", str(tmp_path / "both")])
    assert result.exit_code == 0, result.output
    assert f"written {tmp_path / 'both.png'}" in result.output.replace("\n", "")
    assert (tmp_path / "both.png").read_bytes()[:4] == b"\x89PNG"
    from tuneforge.runs.files import read_run_metrics
    from tuneforge.runs.plot import figure_of

    runs, configs = {}, {}
    for run in (sft, dpo):
        runs[run.name], configs[run.name] = read_run_metrics(run)
    axes = figure_of(runs, configs).axes
    titles = [(axis.get_title(), axis.get_ylabel()) for axis in axes]
    assert ("training loss (sft)", "cross-entropy, nats per supervised token") in titles
    assert ("training loss (dpo sigmoid)", "DPO sigmoid loss per pair") in titles
    assert plot_runs([sft], tmp_path / "x.svg").suffix == ".svg"


@pytest.mark.parametrize("command", ["plot", "compare"])
def test_bad_outputs_and_metrics_files_are_named_not_tracebacks(tmp_path, command):
    run = objective_run(tmp_path / "run", "sft", [2.0, 1.0], [])

    def invoke(name):
        """The command's outcome; a TuneforgeError is what `tuneforge` prints as a message."""
        arguments = [command, str(run), "--out", str(tmp_path / name)]
        result = CliRunner().invoke(app, arguments, env={"COLUMNS": "200"})
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            assert isinstance(result.exception, TuneforgeError), result.exception
            return 1, str(result.exception)
        return result.exit_code, result.output

    code, said = invoke("x.txt")
    assert code == 1 and ".txt is not an image format" in said
    assert not (tmp_path / "x.txt").exists()
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 3, "loss"')  # a run killed while writing its last line
    code, said = invoke("a.png")
    assert code == 0 and (tmp_path / "a.png").is_file(), said
    lines = '{"step": 1, "loss": 1.0}\nnot json\n{"step": 2, "loss": 0.5}\n'
    (run / "metrics.jsonl").write_text(lines)
    code, said = invoke("b.png")
    assert code == 1 and "metrics.jsonl, line 2: not a JSON record" in said
    (run / "metrics.jsonl").write_text("")
    code, said = invoke("c.png")
    assert code == 1 and "is empty: the run has logged no step yet" in said


def test_runs_that_sample_replies_show_their_reward(tmp_path):
    """GRPO's held-out reward at the end, or where it never evaluated, its training reward's
    mean over the last ten steps."""
    evaluated = write_run(tmp_path / "a", [0.0] * 12, [(6, -0.5), (12, -0.75)])
    trained = write_run(tmp_path / "b", [0.0] * 12, [])
    for run in (evaluated, trained):
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for line in lines:
            if "eval_loss" in line:
                line["eval_reward"] = -line["eval_loss"]
            else:
                line["reward"] = line["step"] / 12
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    first, second = compare_runs([evaluated, trained])
    assert first.final_reward == 0.75
    assert second.final_reward == pytest.approx(sum(range(3, 13)) / 10 / 12)
    output = (
        CliRunner()
        .invoke(app, ["compare", str(evaluated), str(trained)], env={"COLUMNS": "250"})
        .output
    )
    assert "reward" in output and "0.7500" in output and f"{second.final_reward:.4f}" in output


def test_the_table_into_a_pipe_is_as_wide_as_its_cells(tmp_path):
    """Into a pipe or a file (no terminal) an 80-column default would cut every cell to "…"."""
    reference = write_run(tmp_path / "a-long-run-name", [3.0, 2.0, 1.5, 0.1], [(4, 1.3)])
    other = write_run(tmp_path / "b-long-run-name", [3.1, 2.1, 1.6, 0.2], [(4, 1.4)])
    result = CliRunner().invoke(app, ["compare", str(reference), str(other)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    table = [line for line in result.output.splitlines() if line.startswith(("┃", "│"))]
    assert table and not any("…" in line for line in table), result.output
    assert "gap mean/max" in table[0] and "b-long-run-name (4)" in result.output


def test_a_metrics_file_cut_short_is_read_with_a_warning(tmp_path, caplog):
    from tuneforge.runs.files import read_metrics

    file = tmp_path / "metrics.jsonl"
    file.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    with caplog.at_level("WARNING"):
        assert read_metrics(file) == [{"step": 1, "loss": 1.0}]
    assert "its last line is cut short" in caplog.text and str(file) in caplog.text
