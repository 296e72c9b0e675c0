"""The gradient figure's bars: one per layer from the record's `per_layer` summary when present
(every layer shows, not only the worst parameters), else one per `worst` parameter."""

from __future__ import annotations

from harness.report.plots import gradient_bars, gradient_figure
from harness.report.case_view import view

from .records import diverged, passing_session


def test_bars_per_layer_when_the_record_has_them(tmp_path):
    record = diverged(passing_session()[3])
    record["gradients"]["per_layer"] = [
        {"layer": "embedding", "stage": "0+1", "max_abs_diff": 2e-6, "mismatched": 0,
         "parameters": 2},
        *({"layer": i, "stage": "0" if i < 6 else "1", "max_abs_diff": 1e-7 * (i + 1),
           "mismatched": int(i in (5, 6)), "parameters": 12} for i in range(8)),
        {"layer": "final_norm", "stage": "1", "max_abs_diff": 0.0, "mismatched": 0,
         "parameters": 2}]
    kind, bars = gradient_bars(record["gradients"])
    assert kind == "layer"
    assert [b.label for b in bars] == ["embedding", *(f"layer {i}" for i in range(8)), "final_norm"]
    assert [b.stage for b in bars[6:8]] == ["0", "1"]  # layers 5 and 6
    assert [b.bad for b in bars].count(True) == 2 and bars[-1].value == 0.0
    assert gradient_figure(view(record), tmp_path / "g.png").stat().st_size > 0


def test_bars_per_worst_parameter_in_older_records():
    record = diverged(passing_session()[3])
    kind, bars = gradient_bars(record["gradients"])
    assert kind == "parameter"
    assert [b.label.split("\n")[0] for b in bars] == [  # embedding first, then by layer
        "wte.weight", "h.5.attn.c_proj.weight", "h.6.mlp.c_fc.weight"]
    assert gradient_bars({}) == ("parameter", [])


def test_sixteen_plus_runs_each_get_their_own_colour_and_marker(tmp_path):
    """18 runs: 18 distinct colours, each with a marker; every run in the legend; zeros on a
    labelled 'exactly 0' row, not silently at 1e-12."""
    from matplotlib.colors import to_hex

    from harness.report.plots import loss_figure, series_styles
    from harness.report.case_view import view

    from .records import case

    styles = series_styles(18)
    assert len({to_hex(s["color"]) for s in styles}) == 18
    assert len({(to_hex(s["color"]), s["marker"]) for s in series_styles(45)}) == 45
    views = [view(case("pipeline_layout", "gpt2", f"case-{i:02d}")) for i in range(18)]
    views[3].record["losses"] = list(views[3].record["reference_losses"])  # exactly equal
    png = tmp_path / "loss.png"
    import matplotlib.pyplot as plt

    captured = {}
    real_save = plt.Figure.savefig

    def keep(fig, *args, **kwargs):
        captured["fig"] = fig
        return real_save(fig, *args, **kwargs)

    plt.Figure.savefig = keep
    try:
        assert loss_figure("gpt2", views, png) == png
    finally:
        plt.Figure.savefig = real_save
    top, bottom = captured["fig"].axes
    labels = [t.get_text() for t in bottom.get_legend().get_texts()]
    assert [l for l in labels if l.startswith("case-")] == [f"case-{i:02d} (passed)"
                                                            for i in range(18)]
    assert "exactly 0" in [t.get_text() for t in bottom.get_yticklabels()]
    assert len([l for l in top.get_lines() if l.get_marker() not in (None, "None", "")]) == 18
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
