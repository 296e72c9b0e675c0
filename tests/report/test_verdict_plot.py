"""The verdict picture (harness.report.plots.verdict_figure) on planted bugs: the points it
draws (one per parameter, at its layer and stage, by kind), the layout's chunk boundaries
under them, and which cases get a picture in report.md (every failing case, the closest
passing one per tag and model; none without compared gradients).

Records: tests/report/records.case, with `gradients.per_parameter` and `gradients.relative` as
the runner writes them (shape copied from a real `-m basic --gpus 2 -k gpt2` session: GPT-2,
8 layers, 100 parameters in name order, threshold 1e-5 in float32)."""

from __future__ import annotations

import math
import re

import pytest

from harness.report import build, read_session
from harness.report import plots
from harness.report.plots import (
    Bound,
    chosen,
    noise_floor,
    stage_bounds,
    verdict_figure,
    verdict_points,
)

from .records import case, write

THRESHOLD = 1e-5
NOISE = 3e-8  # what a correct layout's float32 gradients differ by: the reduction order
_BLOCK = ("attn.c_attn.bias", "attn.c_attn.weight", "attn.c_proj.bias", "attn.c_proj.weight",
          "ln_1.bias", "ln_1.weight", "ln_2.bias", "ln_2.weight", "mlp.c_fc.bias",
          "mlp.c_fc.weight", "mlp.c_proj.bias", "mlp.c_proj.weight")


def gpt2_names(layers: int = 8, prefix: str = "") -> list[str]:
    names = [f"h.{i}.{p}" for i in range(layers) for p in _BLOCK]
    names += ["ln_f.bias", "ln_f.weight", "wpe.weight", "wte.weight"]
    return [prefix + n for n in sorted(names)]


def _row(name: str, error: float, k: int) -> dict:
    ref = 0.01 * (1 + k % 7)
    diff = error * ref
    return {"name": name, "ref_norm": ref, "got_norm": ref + diff, "diff_norm": diff,
            "relative_error": error if math.isfinite(error) else "inf",
            "max_abs_diff": diff / 4, "mismatched": int(diff / 4 > 1e-5)}


def gradients(errors: dict[str, float], threshold: float = THRESHOLD) -> dict:
    """`gradients` as the runner writes it, from each parameter's scale-free error."""
    rows = [_row(n, e, k) for k, (n, e) in enumerate(errors.items())]
    worst = max(rows, key=lambda r: (float(r["relative_error"]), r["name"]))
    failed = sorted((r["name"] for r in rows if not float(r["relative_error"]) <= threshold),
                    key=lambda n: (-errors[n], n))
    w = float(worst["relative_error"])
    return {"tolerance": {"atol": 1e-5, "rtol": 0}, "parameters": len(rows),
            "mismatched": sum(1 for r in rows if r["mismatched"]), "elements": 113984,
            "mismatched_elements": sum(r["mismatched"] for r in rows),
            "max_abs_diff": max(r["max_abs_diff"] for r in rows), "missing": [], "extra": [],
            "shape_errors": [], "worst": [], "per_layer": [],
            "elementwise_ok": not any(r["mismatched"] for r in rows),
            "relative": {"threshold": threshold, "worst": w,
                         "worst_parameter": worst["name"], "worst_stage": "?",
                         "margin": threshold / w if w else "inf", "failed": failed,
                         "ok": not failed},
            "per_parameter": rows, "ok": not failed}


def noise(names: list[str], scale: float = NOISE) -> dict[str, float]:
    """A correct run's errors: small, varied, a few exactly 0."""
    return {n: 0.0 if k % 9 == 0 else scale * (1 + (k * 37 % 11) / 5)
            for k, n in enumerate(names)}


def record_with(errors: dict[str, float], case_id="pp2", status=None, tag="pipeline_layout",
                model="gpt2", **kwargs) -> dict:
    grads = gradients(errors)
    status = status or ("passed" if grads["ok"] else "failed")
    record = case(tag, model, case_id, status, **kwargs)
    record["gradients"] = grads
    if status == "failed":
        record["reason"] = f"{record['name']}: the run differs from the single-device reference"
    return record


# ---------------------------------------------------------------------- planted bugs


def test_a_stage_scaled_by_1e4_is_exactly_the_points_on_that_stage():
    """(a) every gradient on stage 1 of PP 2 scaled by 1 + 1e-4: the layers of stage 1, the
    final norm and GPT-2's tied wte (its lm-head use is on stage 1) go over; nothing else."""
    names = gpt2_names()
    errors = noise(names)
    record = case("pipeline_layout", "gpt2", "pp2", "failed", chunks=[(0, 0, 4), (1, 4, 8)])
    points_before = verdict_points({**record, "gradients": gradients(errors)})
    planted = {p.name for p in points_before if 1 in p.stages}
    for name in planted:
        errors[name] = 1e-4 * (1 + len(name) % 3 / 10)
    record["gradients"] = gradients(errors)

    points = verdict_points(record)
    assert len(points) == 100
    over = {p.name for p in points if p.error > THRESHOLD}
    assert over == planted == {*(n for n in names if re.match(r"h\.[4-7]\.", n)),
                               "ln_f.bias", "ln_f.weight", "wte.weight"}
    assert over == set(record["gradients"]["relative"]["failed"])
    by_name = {p.name: p for p in points}
    assert {by_name[n].stage for n in over - {"wte.weight"}} == {1}
    assert by_name["wte.weight"].stages == (0, 1)  # tied: on both ends
    assert by_name["wpe.weight"].stage == 0 and by_name["wpe.weight"].error <= THRESHOLD
    assert {p.stage for p in points if p.error <= THRESHOLD} == {0}
    # model order: embedding (-1), layers 0..7, final norm (8)
    assert [p.layer_index for p in points] == sorted(p.layer_index for p in points)
    assert {by_name[n].layer_index for n in ("wte.weight", "wpe.weight")} == {-1}
    assert by_name["h.5.mlp.c_fc.weight"].layer_index == 5
    assert by_name["ln_f.weight"].layer_index == 8
    assert stage_bounds(record) == [Bound(0, 0, 0, 4), Bound(1, 0, 4, 8)]


def test_b_one_layer_off_is_one_column_of_points():
    names = gpt2_names()
    errors = noise(names)
    planted = {n for n in names if n.startswith("h.5.")}
    errors.update({n: 3e-3 for n in planted})
    record = record_with(errors, chunks=[(0, 0, 3), (1, 3, 8)])
    assert record["status"] == "failed"
    points = verdict_points(record)
    over = [p for p in points if p.error > THRESHOLD]
    assert {p.name for p in over} == planted and len(over) == 12
    assert {p.layer_index for p in over} == {5} and {p.stage for p in over} == {1}
    assert {p.kind for p in over} == {"ln", "attn", "mlp"}
    assert stage_bounds(record) == [Bound(0, 0, 0, 3), Bound(1, 0, 3, 8)]


def test_c_every_norm_off_is_one_kind_of_marker():
    names = gpt2_names()
    errors = noise(names)
    planted = {n for n in names if re.search(r"(^|\.)ln_", n)}
    errors.update({n: 5e-4 for n in planted})
    record = record_with(errors, chunks=[(0, 0, 2), (1, 2, 4), (0, 4, 6), (1, 6, 8)], vpp=2)
    points = verdict_points(record)
    over = {p.name for p in points if p.error > THRESHOLD}
    assert over == planted and len(planted) == 8 * 4 + 2
    assert {p.kind for p in points if p.name in over} == {"ln"}
    assert all(p.error > THRESHOLD for p in points if p.kind == "ln")
    assert {p.kind for p in points} == {"ln", "attn", "mlp", "embedding/head"}
    # VPP 2: each stage holds two chunks, in global order
    assert stage_bounds(record) == [Bound(0, 0, 0, 2), Bound(1, 0, 2, 4), Bound(0, 1, 4, 6),
                                    Bound(1, 1, 6, 8)]
    by_name = {p.name: p for p in points}
    assert by_name["h.3.ln_1.weight"].stage == 1 and by_name["h.4.ln_1.weight"].stage == 0


def test_foreign_names_llama_head_and_nonfinite():
    """InfiniTrain's `transformer.` names locate as ours; LLaMA's lm_head has its own slot after
    the final norm; a NaN run's parameter is inf (over any threshold)."""
    names = [f"transformer.h.{i}.{p}" for i in range(4)
             for p in ("ln_1.weight", "attn.c_attn.weight", "mlp.c_fc.weight")]
    names += ["transformer.wte.weight", "transformer.ln_f.weight", "lm_head.weight"]
    errors = noise(names)
    errors["transformer.h.2.mlp.c_fc.weight"] = math.inf
    record = record_with(errors, model="llama3", pp=2, chunks=[(0, 0, 2), (1, 2, 4)])
    record["layout"]["num_layers"] = 4
    by_name = {p.name: p for p in verdict_points(record)}
    assert by_name["transformer.h.2.mlp.c_fc.weight"].error == math.inf
    assert (by_name["transformer.h.2.mlp.c_fc.weight"].stage,
            by_name["transformer.h.2.mlp.c_fc.weight"].layer_index) == (1, 2)
    assert by_name["transformer.wte.weight"].stages == (0,)  # LLaMA: not tied
    assert (by_name["transformer.ln_f.weight"].layer_index, by_name["lm_head.weight"].layer_index,
            by_name["lm_head.weight"].stage) == (4, 5, 1)
    assert by_name["lm_head.weight"].kind == "embedding/head"
    assert by_name["transformer.ln_f.weight"].kind == "ln"


# ---------------------------------------------------------------------- the figure


def _drawn(monkeypatch):
    """Keep the figure verdict_figure saves, to read what it drew."""
    captured = {}
    real = plots._save

    def keep(fig, path):
        captured["axes"] = fig.axes[0]
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return captured


def test_figure_draws_threshold_noise_floor_and_stages(tmp_path, monkeypatch):
    names = gpt2_names()
    errors = noise(names)
    errors.update({n: 1e-4 for n in names if n.startswith("h.6.")})
    record = record_with(errors, chunks=[(0, 0, 4), (1, 4, 8)])
    record["calibration"] = {"gradients_noise": 2e-7, "runs": 3}
    assert noise_floor(record) == 2e-7
    captured = _drawn(monkeypatch)
    png = verdict_figure(record, tmp_path / "v.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axis = captured["axes"]
    levels = {line.get_ydata()[0] for line in axis.get_lines()
              if len(set(line.get_ydata())) == 1 and len(line.get_xdata()) == 2}
    assert {THRESHOLD, 2e-7} <= levels
    labels = axis.get_legend_handles_labels()[1]
    assert "threshold 1e-05" in labels and "calibrated noise floor 2e-07" in labels
    assert "over the threshold (12)" in labels
    texts = [t.get_text() for t in axis.texts]
    assert texts.count("stage 0") == 1 and texts.count("stage 1") == 1
    boundaries = [line.get_xdata()[0] for line in axis.get_lines()
                  if len(set(line.get_xdata())) == 1 and len(line.get_ydata()) == 2]
    assert boundaries == [3.5]  # between layer 3 (stage 0) and layer 4 (stage 1)
    assert "exactly 0" in [t.get_text() for t in axis.get_yticklabels()]
    # one scatter point per parameter, per kind (the red rings drawn on top, 12 of them)
    offsets = [len(c.get_offsets()) for c in axis.collections]
    assert sum(offsets[:-1]) == 100 and offsets[-1] == 12

    del record["calibration"]  # no calibration (yet): no second line, no error
    captured.clear()
    verdict_figure(record, tmp_path / "v2.png")
    assert not any("noise" in label for label in captured["axes"].get_legend_handles_labels()[1])


@pytest.mark.parametrize("grads", [None, {}, {"compared": False, "reason": "no dumps"},
                                   {"per_parameter": []},
                                   {"relative": {"threshold": 1e-5}, "worst": []}])
def test_no_compared_gradients_draws_nothing(tmp_path, grads):
    record = case("basic", "gpt2", "single", "failed", pp=1, gradients=grads)
    assert verdict_points(record) == [] and stage_bounds(record) == [Bound(0, 0, 0, 8)]
    assert verdict_figure(record, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
    assert chosen([record]) == []
    assert stage_bounds({"name": "x", "layout": None}) == []


# ---------------------------------------------------------------------- in report.md


def session_records() -> list[dict]:
    names = gpt2_names()
    failing_errors = noise(names)
    failing_errors.update({n: 2e-4 for n in names if re.match(r"h\.[4-7]\.", n)})

    def scaled(s):
        return noise(names, NOISE * s)

    return [
        record_with(scaled(1), "pp2", chunks=[(0, 0, 4), (1, 4, 8)]),
        record_with(scaled(5), "pp2-partition-3-5", chunks=[(0, 0, 3), (1, 3, 8)]),  # closest
        record_with(failing_errors, "pp2-costs-L4.5", chunks=[(0, 0, 6), (1, 6, 8)]),
        record_with(scaled(2), "pp2-vpp2", vpp=2,
                    chunks=[(0, 0, 2), (1, 2, 4), (0, 4, 6), (1, 6, 8)]),
        record_with(scaled(3), "single", tag="basic", pp=1),
        record_with(scaled(7), "dp2", tag="basic", pp=1, dp=2),  # closest of basic/gpt2
        case("basic", "llama3", "tp2", pp=1, tp=2,
             gradients={"compared": False, "reason": "the trainer writes no dumps"}),
        case("basic", "gpt2", "pp4-dp4", "skipped", pp=4, dp=4),
        case("basic", "llama3", "tp4", "error", pp=1, tp=4, loss=None, gradients=None,
             reason="basic/llama3/tp4: ReferenceError: the reference run failed"),
    ]


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start:end if end >= 0 else None]


def test_report_pictures_the_failing_case_and_the_closest_passing_per_group(tmp_path):
    records = session_records()
    results = write(tmp_path / "results.jsonl", records)
    report = build(read_session([results]), tmp_path / "out" / "report.md")
    text = report.markdown
    pictures = sorted(p.name for p in (tmp_path / "out").glob("report-verdict-*.png"))
    assert pictures == ["report-verdict-basic-gpt2-dp2.png",
                        "report-verdict-pipeline_layout-gpt2-pp2-costs-L4.5.png",
                        "report-verdict-pipeline_layout-gpt2-pp2-partition-3-5.png"]
    for name in pictures:
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    links = re.findall(r"!\[scale-free gradient error per parameter of ([^\]]+)\]\(([^)]+)\)",
                       text)
    assert sorted(link for _, link in links) == pictures
    # the failing case's picture next to its failure text
    failure = _section(text, "### `pipeline_layout/gpt2/pp2-costs-L4.5`: failed")
    assert "(report-verdict-pipeline_layout-gpt2-pp2-costs-L4.5.png)" in failure
    assert "the run differs from the single-device reference" in failure
    # the errored case (no gradients compared) and the skipped one: text, no picture
    assert "report-verdict" not in _section(text, "### `basic/llama3/tp4`: error")
    closest = _section(text, "## Closest passing case per group")
    assert "The passing case of each tag and model" in closest
    for name in ("pipeline_layout/gpt2/pp2-partition-3-5", "basic/gpt2/dp2"):
        block = _section(text, f"### `{name}`:")
        assert "report-verdict-" + name.replace("/", "-") + ".png" in block
    assert "`pipeline_layout/gpt2/pp2`:" not in text  # a passing case not the closest
    assert "basic/llama3/tp2" not in "".join(n for n, _ in links)


def test_no_plots_no_pictures(tmp_path):
    results = write(tmp_path / "results.jsonl", session_records())
    report = build(read_session([results]), tmp_path / "out" / "report.md", with_plots=False)
    assert "report-verdict" not in report.markdown
    assert "## Closest passing case per group" not in report.markdown
    assert not list((tmp_path / "out").glob("*.png"))


def test_a_session_where_nothing_compared_gradients_has_no_picture(tmp_path):
    records = [case("basic", "gpt2", "single", pp=1),  # records.case: no per_parameter
               case("basic", "gpt2", "pp2", "failed", gradients=None)]
    results = write(tmp_path / "results.jsonl", records)
    report = build(read_session([results]), tmp_path / "out" / "report.md")
    assert not list((tmp_path / "out").glob("report-verdict-*.png"))
    assert "report-verdict" not in report.markdown
    assert "Gradient pictures:" not in report.markdown
