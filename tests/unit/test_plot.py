"""`tuneforge plot`: what each panel draws, with its units, from the runs' metrics."""

import json


def test_plot_draws_several_runs(tmp_path):
    import matplotlib.image

    from tuneforge.runs.files import read_metrics
    from tuneforge.runs.plot import figure_of, plot_runs

    for name, scale in (("a", 1.0), ("b", 2.0)):
        run = tmp_path / name
        run.mkdir()
        records = [
            {"step": s, "loss": scale / s, "tokens_per_s": 100.0 * s, "mem_reserved_gib": 1.5}
            for s in range(1, 6)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = plot_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "curves")
    assert out == tmp_path / "curves.png"
    image = matplotlib.image.imread(out)  # a readable PNG, as wide as its three panels
    assert image.shape[1] == 3 * 5 * 120 and image.std() > 0
    records = {name: read_metrics(tmp_path / name / "metrics.jsonl") for name in ("a", "b")}
    axes = figure_of(records).axes
    loss = {line.get_label(): list(line.get_ydata()) for line in axes[0].lines}
    assert loss == {"a": [1.0 / s for s in range(1, 6)], "b": [2.0 / s for s in range(1, 6)]}
    assert [line.get_label() for line in axes[1].lines] == ["a", "b"]  # tokens/s


def test_plot_panels_carry_their_units_and_say_when_held_out_loss_is_two_points():
    from tuneforge.runs.plot import figure_of

    records = [{"step": s, "loss": 1.0 / s, "mem_reserved_gib": 2.0, "mem_peak_gib": 1.5}
               for s in range(1, 6)]  # fmt: skip
    records[0]["eval_loss"], records[-1]["eval_loss"] = 1.2, 0.8
    axes = figure_of({"a": records}).axes
    assert [axis.get_ylabel() for axis in axes] == [
        "cross-entropy, nats per supervised token", "cross-entropy, nats per supervised token", "GiB",
    ]  # fmt: skip
    assert "2 evaluations: eval.every_steps for a curve" in axes[1].get_title()
    assert [line.get_label() for line in axes[2].lines] == ["a reserved", "a peak allocated"]
    assert axes[2].get_ylim()[0] == 0  # memory read against zero
    assert axes[1].lines[0].get_marker() == "o"
