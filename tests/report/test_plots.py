"""The gradient figure's bars: one per layer from the record's `per_layer` summary when present
(every layer shows, not only the worst parameters), else one per `worst` parameter."""

from __future__ import annotations

from harness.report.plots import gradient_bars, gradient_figure
from harness.report.summary import view

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
