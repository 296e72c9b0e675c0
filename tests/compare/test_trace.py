"""harness.compare.trace: two module-level traces compared in the partner's execution order
(every rank's forward, then the backward in reverse rank order) to the first diverging module
and the last that matched; the threshold atol + rtol * max |partner| at its boundary; NaN,
shapes no slice explains, TP column pieces, pipeline microbatches, a pipeline stage's local
layer names; what is unpaired and why; the files removed or kept; cost; the record's dict.
Both traces are written here in InfiniTrain's format (tests/contracts/test_trace.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.compare.trace import (Naming, TraceThresholds, compare_traces, not_traced,
                                   walk_order)
from harness.contracts.trace import TraceError, pairing_of, read_trace
from tests.contracts.test_trace import STAMP, log_line, write_rank

TH = TraceThresholds(1e-6, 1e-4, "test thresholds")
NAMES = ["h.0.ln_1", "h.0.attn", "h.0.mlp", "h.1.ln_1", "h.1.attn"]
SHAPE = (2, 3, 4)


def calls(seed: int = 0, names=NAMES, shape=SHAPE):
    """A model's forward outputs in order, then their gradients in reverse order."""
    rng = np.random.default_rng(seed)
    forward = [(n, "forward", rng.standard_normal(shape).astype(np.float32)) for n in names]
    backward = [(n, "backward", (rng.standard_normal(shape) * 1e-3).astype(np.float32))
                for n in reversed(names)]
    return forward + backward


def changed(calls_, module, phase, how):
    return [(m, p, how(a.copy()) if (m, p) == (module, phase) else a) for m, p, a in calls_]


def sides(tmp_path, run_calls, partner_calls=None):
    """`run/<stamp>` and `partner/<stamp>` (rank 0 each); returns the two path folders."""
    run, partner = tmp_path / "run", tmp_path / "partner"
    write_rank(run / STAMP, 0, run_calls)
    write_rank(partner / STAMP, 0, run_calls if partner_calls is None else partner_calls)
    return run, partner


def compare(run, partner, naming=None, thresholds=TH, **kw):
    kw.setdefault("remove", False)
    return compare_traces(run, partner, naming or Naming(), thresholds, step=3,
                          partner="reference", **kw)


def files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def size(*folders):
    return sum(p.stat().st_size for f in folders for p in f.rglob("*") if p.is_file())


# ----------------------------------------------------------------------- match / diverge

def test_identical_traces_match(tmp_path):
    run, partner = sides(tmp_path, calls())
    diff = compare(run, partner)
    assert diff.ok and diff.status == "matched" and diff.first_diverging is None
    assert len(diff.modules) == 2 * len(NAMES) and all(m.ok for m in diff.modules)
    assert all(m.max_abs == 0.0 and m.pieces == 1 and m.rank == 0 for m in diff.modules)
    assert [m.order for m in diff.modules] == list(range(2 * len(NAMES)))
    assert diff.last_matched == diff.modules[-1]
    assert diff.unpaired_run == () and diff.unpaired_partner == ()
    assert diff.line().startswith(f"every module matched at step 3 ({2 * len(NAMES)} tensors "
                                  f"against the reference; worst ")


def test_a_planted_change_names_the_module_and_the_one_before(tmp_path):
    good = calls()
    run, partner = sides(tmp_path, changed(good, "h.0.mlp", "forward", lambda a: a * 1.01), good)
    diff = compare(run, partner)
    assert not diff.ok and diff.status == "diverged"
    first, last = diff.first_diverging, diff.last_matched
    assert (first.module, first.phase, first.index, first.rank) == ("h.0.mlp", "forward", 0, 0)
    assert (last.module, last.phase) == ("h.0.attn", "forward")
    assert first.max_abs > first.threshold and first.ratio > 1
    # only that tensor was changed: everything else still agrees
    assert [m.label for m in diff.modules if not m.ok] == ["h.0.mlp forward"]
    line = diff.line()
    assert line.startswith("first diverging: h.0.mlp forward (rank 0): max |d| ")
    assert "; last that matched: h.0.attn forward, 0" in line


def test_a_change_in_the_first_module_has_none_matched_before_it(tmp_path):
    good = calls()
    run, partner = sides(tmp_path, changed(good, "h.0.ln_1", "forward", lambda a: a + 1), good)
    diff = compare(run, partner)
    assert diff.first_diverging.label == "h.0.ln_1 forward" and diff.last_matched is None
    assert diff.line().endswith("; none matched before it")


def test_a_backward_change_is_found_after_every_forward(tmp_path):
    good = calls()
    run, partner = sides(tmp_path, changed(good, "h.0.attn", "backward", lambda a: -a), good)
    diff = compare(run, partner)
    assert diff.first_diverging.label == "h.0.attn backward"
    assert diff.last_matched.label == "h.0.mlp backward"


def _boundary(tmp_path, top: np.float32):
    """ref's largest |value| 2.0 at [0, 0] made `top` in the run: |d| = top - 2; the bound is
    atol + rtol * max |ref| = 0.25 + 0.125 * 2 = 0.5 exactly (all binary fractions)."""
    ref = np.array([[2.0, 1.0], [0.5, -1.0]], np.float32)
    got = ref.copy()
    got[0, 0] = top
    run, partner = sides(tmp_path, [("m", "forward", got)], [("m", "forward", ref)])
    return compare(run, partner, thresholds=TraceThresholds(0.25, 0.125, "boundary"))


def test_max_abs_exactly_at_the_bound_passes(tmp_path):
    diff = _boundary(tmp_path, np.float32(2.5))
    (m,) = diff.modules
    assert (m.max_abs, m.max_ref, m.threshold) == (0.5, 2.0, 0.5)
    assert m.ok and diff.ok and m.ratio == 1.0  # fails if <= became <, or rtol were dropped


def test_max_abs_just_above_the_bound_fails(tmp_path):
    # the bound from max |partner| (2.0), not max |run| (2.5, which would allow 0.5625)
    diff = _boundary(tmp_path, np.nextafter(np.float32(2.5), np.float32(3)))
    (m,) = diff.modules
    assert m.max_abs > 0.5 and m.threshold == 0.5 and not m.ok and not diff.ok


def test_thresholds_are_checked():
    for atol, rtol in ((-1, 0), (0, math.inf), (math.nan, 0), (True, 0), ("1", 0)):
        with pytest.raises(ValueError, match="expected a finite number >= 0"):
            TraceThresholds(atol, rtol, "x")
    assert TraceThresholds(0, 0, "x").bound(5.0) == 0


# -------------------------------------------------------------------------------- NaN

def test_nan_in_the_run_diverges_with_a_note(tmp_path):
    good = calls()

    def nan(a):
        a[0, 0, 0] = np.nan
        return a
    run, partner = sides(tmp_path, changed(good, "h.0.attn", "forward", nan), good)
    assert "[NaN:1 Inf:0] <- ERROR" in (run / STAMP / "precision_check_rank_0.log").read_text()
    diff = compare(run, partner)
    first = diff.first_diverging
    assert first.label == "h.0.attn forward" and first.max_abs == math.inf and not first.ok
    assert "NaN 1, Inf 0 in the run's tensor" == first.note
    assert diff.last_matched.label == "h.0.ln_1 forward"
    assert "max |d| inf" in diff.line() and "NaN 1" in diff.line()
    record = json.loads(json.dumps(diff.to_dict(), allow_nan=False))
    assert record["first_diverging"]["max_abs"] == "inf"
    assert record["first_diverging"]["ratio"] == "inf"


def test_nan_on_both_sides_at_the_same_place_agrees(tmp_path):
    def nan(a):
        a[1, 2, 3] = np.nan
        a[0, 1, 2] = np.inf
        return a
    both = changed(calls(), "h.0.attn", "forward", nan)
    run, partner = sides(tmp_path, both, both)
    diff = compare(run, partner)
    assert diff.ok
    attn = next(m for m in diff.modules if m.label == "h.0.attn forward")
    assert attn.max_abs == 0.0 and math.isfinite(attn.max_ref) and attn.note is None


def test_nan_in_the_partner_only_diverges(tmp_path):
    good = calls()

    def nan(a):
        a[0, 0, 1] = np.nan
        return a
    run, partner = sides(tmp_path, good, changed(good, "h.1.ln_1", "forward", nan))
    first = compare(run, partner).first_diverging
    assert first.label == "h.1.ln_1 forward" and first.max_abs == math.inf
    assert "partner" in first.note


def test_a_nan_at_another_place_than_the_partners_diverges(tmp_path):
    good = calls()

    def at(i):
        def nan(a):
            a[0, 0, i] = np.nan
            return a
        return nan
    run, partner = sides(tmp_path, changed(good, "h.0.mlp", "forward", at(0)),
                         changed(good, "h.0.mlp", "forward", at(1)))
    assert compare(run, partner).first_diverging.label == "h.0.mlp forward"


# ------------------------------------------------------------------------------ shapes

def test_a_shape_no_slice_explains_diverges_naming_both(tmp_path):
    good = calls()
    wide = [(m, p, np.zeros((2, 3, 5), np.float32) if (m, p) == ("h.0.attn", "forward") else a)
            for m, p, a in good]
    run, partner = sides(tmp_path, wide, good)
    diff = compare(run, partner)
    first = diff.first_diverging
    assert first.label == "h.0.attn forward" and first.max_abs == math.inf and not first.ok
    assert "(2, 3, 5)" in first.note and "(2, 3, 4)" in first.note
    assert first.note.count("h.0.attn_forward.npy") == 2
    assert diff.last_matched.label == "h.0.ln_1 forward"
    assert diff.unpaired_run == () and diff.unpaired_partner == ()
    json.dumps(diff.to_dict(), allow_nan=False)


def test_a_log_whose_shape_is_not_its_files_is_a_trace_error(tmp_path):
    good = calls()
    run, partner = sides(tmp_path, good)
    np.save(run / STAMP / "rank_0" / "h.0.attn_forward.npy", np.zeros((4, 6), np.float32))
    with pytest.raises(TraceError, match=r"h.0.attn_forward.npy: shape \(4, 6\)"):
        compare(run, partner)


# ------------------------------------------------------------------- TP / microbatches

TP_NAMES = ["h.0.ln_1", "h.0.attn.c_attn", "h.0.attn.c_proj"]


def _tp(tmp_path, second=lambda whole: whole[:, 4:]):
    """A partner's c_attn output of (4, 8); run ranks 0 and 1 each hold 4 of its columns (the
    other modules whole on both)."""
    rng = np.random.default_rng(7)
    whole = {n: rng.standard_normal((4, 8)).astype(np.float32) for n in TP_NAMES}
    partner = tmp_path / "partner"
    write_rank(partner / STAMP, 0, [(n, "forward", whole[n]) for n in TP_NAMES])
    run = tmp_path / "run"
    for rank, part in ((0, whole["h.0.attn.c_attn"][:, :4]),
                       (1, second(whole["h.0.attn.c_attn"]))):
        write_rank(run / STAMP, rank, [(n, "forward", part if n == "h.0.attn.c_attn"
                                        else whole[n]) for n in TP_NAMES])
    return compare(run, partner)


def test_tp_column_pieces_match_their_slices(tmp_path):
    diff = _tp(tmp_path)
    assert diff.ok and len(diff.modules) == 3
    attn = diff.modules[1]
    assert attn.module == "h.0.attn.c_attn" and attn.pieces == 2 and attn.max_abs == 0.0
    assert "columns" in attn.note and "of 8" in attn.note
    assert all(m.pieces == 2 for m in diff.modules)  # the whole ones: both ranks compared
    assert diff.unpaired_run == () and diff.unpaired_partner == ()


def test_a_wrong_tp_piece_fails_at_its_rank(tmp_path):
    diff = _tp(tmp_path, second=lambda whole: whole[:, 4:] * np.float32(1.01))
    first = diff.first_diverging
    assert (first.module, first.rank) == ("h.0.attn.c_attn", 1) and not first.ok
    assert diff.last_matched.module == "h.0.ln_1"


def test_two_tp_ranks_holding_the_same_piece_fail(tmp_path):
    """Rank 1 holds rank 0's columns (a shard offset bug): each piece is some slice of the
    partner's, but the partner's columns 4:8 are held by no rank."""
    diff = _tp(tmp_path, second=lambda whole: whole[:, :4])
    assert not diff.ok
    assert diff.first_diverging.module == "h.0.attn.c_attn"


def test_pipeline_microbatches_are_each_compared_with_their_rows(tmp_path):
    rng = np.random.default_rng(3)
    whole = {n: rng.standard_normal((4, 6)).astype(np.float32) for n in ("h.0", "h.1")}
    partner_calls = [("h.0", "forward", whole["h.0"]), ("h.1", "forward", whole["h.1"])]
    run_calls = [("h.0", "forward", whole["h.0"][:2]), ("h.1", "forward", whole["h.1"][:2]),
                 ("h.0", "forward", whole["h.0"][2:]), ("h.1", "forward", whole["h.1"][2:])]
    run, partner = sides(tmp_path, run_calls, partner_calls)
    assert (run / STAMP / "rank_0" / "h.0_1_forward.npy").is_file()
    diff = compare(run, partner)
    assert diff.ok and [m.label for m in diff.modules] == ["h.0 forward", "h.1 forward"]
    assert all(m.pieces == 2 and m.max_abs == 0 and "rows" in m.note for m in diff.modules)
    assert diff.unpaired_run == ()


def test_a_wrong_microbatch_fails(tmp_path):
    rng = np.random.default_rng(3)
    whole = rng.standard_normal((4, 6)).astype(np.float32)
    run, partner = sides(tmp_path, [("h.0", "forward", whole[:2]),
                                    ("h.0", "forward", whole[2:] + np.float32(0.1))],
                         [("h.0", "forward", whole)])
    assert not compare(run, partner).ok


def _pp(tmp_path):
    """Run ranks 0 and 1 (stages of one layer each, named from 0); the partner one rank with
    both layers, under global names."""
    rng = np.random.default_rng(5)
    out = {n: rng.standard_normal((2, 4)).astype(np.float32) for n in ("f0", "f1", "b0", "b1")}
    run = tmp_path / "run"
    write_rank(run / STAMP, 0, [("transformer.h.0", "forward", out["f0"]),
                                ("transformer.h.0", "backward", out["b0"])])
    write_rank(run / STAMP, 1, [("transformer.h.0", "forward", out["f1"]),
                                ("transformer.h.0", "backward", out["b1"])])
    partner = tmp_path / "partner"
    write_rank(partner / STAMP, 0, [("transformer.h.0", "forward", out["f0"]),
                                    ("transformer.h.1", "forward", out["f1"]),
                                    ("transformer.h.1", "backward", out["b1"]),
                                    ("transformer.h.0", "backward", out["b0"])])
    return run, partner


def test_a_stage_local_layer_is_paired_with_its_global_layer(tmp_path):
    run, partner = _pp(tmp_path)
    diff = compare(run, partner, Naming(stage_layers={0: (0,), 1: (1,)}))
    assert diff.ok
    assert [(m.label, m.rank) for m in diff.modules] == [
        ("transformer.h.0 forward", 0), ("transformer.h.1 forward", 1),
        ("transformer.h.1 backward", 1), ("transformer.h.0 backward", 0)]
    assert diff.unpaired_run == () and diff.unpaired_partner == ()


def test_without_the_stage_layers_the_stages_do_not_pair(tmp_path):
    run, partner = _pp(tmp_path)
    diff = compare(run, partner, Naming())
    # rank 1's h.0 (the global h.1) is compared with the partner's h.0, and fails
    assert (diff.first_diverging.label, diff.first_diverging.rank) == ("transformer.h.0 forward", 1)
    assert "transformer.h.1 forward: the run has no such tensor" in diff.unpaired_partner


def test_stage_layers_and_the_foreign_prefix_together(tmp_path):
    run, partner = _pp(tmp_path)
    bundled = tmp_path / "bundled"
    for path in (partner / STAMP).rglob("*"):  # the bundled trainer's names: no prefix
        if path.is_file():
            target = bundled / path.relative_to(partner).as_posix().replace("transformer.", "")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
            if target.suffix == ".log":
                target.write_text(path.read_text().replace("transformer.", ""))
    diff = compare(run, bundled, Naming(pairing_of("gpt2"), {0: (0,), 1: (1,)}))
    assert diff.ok and [(m.label, m.rank) for m in diff.modules] == [
        ("h.0 forward", 0), ("h.1 forward", 1), ("h.1 backward", 1), ("h.0 backward", 0)]


# --------------------------------------------------------------------------- the walk

def test_walk_order_is_forward_by_rank_then_backward_in_reverse(tmp_path):
    root = tmp_path / STAMP
    for rank in (0, 1, 2):
        write_rank(root, rank, [(f"s{rank}.a", "forward", np.ones(2)),
                                (f"s{rank}.b", "forward", np.ones(2)),
                                (f"s{rank}.b", "backward", np.ones(2)),
                                (f"s{rank}.a", "backward", np.ones(2))])
    traces = [read_trace(root, r) for r in (2, 0, 1)]
    assert [(e.module, e.phase) for e in walk_order(traces)] == [
        ("s0.a", "forward"), ("s0.b", "forward"), ("s1.a", "forward"), ("s1.b", "forward"),
        ("s2.a", "forward"), ("s2.b", "forward"),
        ("s2.b", "backward"), ("s2.a", "backward"), ("s1.b", "backward"),
        ("s1.a", "backward"), ("s0.b", "backward"), ("s0.a", "backward")]


def test_the_comparison_walks_the_partners_ranks_in_that_order(tmp_path):
    out = {k: np.full(3, i, np.float32) for i, k in enumerate(("f0", "f1", "b0", "b1"))}
    rank_calls = {0: [("h.0", "forward", out["f0"]), ("h.0", "backward", out["b0"])],
                  1: [("h.1", "forward", out["f1"]), ("h.1", "backward", out["b1"])]}
    for side in ("run", "partner"):
        for rank, c in rank_calls.items():
            write_rank(tmp_path / side / STAMP, rank, c)
    diff = compare(tmp_path / "run", tmp_path / "partner")
    assert [(m.label, m.rank) for m in diff.modules] == [
        ("h.0 forward", 0), ("h.1 forward", 1), ("h.1 backward", 1), ("h.0 backward", 0)]


# ----------------------------------------------------------------------------- unpaired

def test_the_unpaired_on_each_side_are_listed_with_reasons(tmp_path):
    good = calls()
    extra = np.ones(SHAPE, np.float32)
    run, partner = sides(tmp_path, good + [("x.run_only", "forward", extra)],
                         good + [("y.partner_only", "backward", extra),
                                 ("y.partner_only", "backward", extra)])
    diff = compare(run, partner)
    assert diff.ok and len(diff.modules) == 2 * len(NAMES)
    assert diff.unpaired_run == ("x.run_only forward (rank 0): the partner has no such tensor",)
    assert diff.unpaired_partner == ("y.partner_only backward: the run has no such tensor",
                                     "y.partner_only backward#1: the run has no such tensor")
    record = diff.to_dict()
    assert record["unpaired"] == {"run": list(diff.unpaired_run),
                                  "partner": list(diff.unpaired_partner)}


def test_infinitrain_only_modules_are_unpaired_with_the_facts_why(tmp_path):
    good = calls()
    pairing = pairing_of("gpt2")
    first_stage = np.ones(SHAPE, np.float32)
    run_calls = [("transformer." + m, p, a) for m, p, a in good]
    run_calls.insert(1, ("TransformerFirstStage", "forward", first_stage))
    run_calls.append(("CrossEntropyLoss", "backward", np.float32(1)))
    run, partner = sides(tmp_path, run_calls, good)
    diff = compare(run, partner, Naming(pairing=pairing))
    assert diff.ok and len(diff.modules) == 2 * len(NAMES)
    assert [m.module for m in diff.modules[:2]] == ["h.0.ln_1", "h.0.attn"]
    why = {f.subject: f"{f.why} ({f.source})" for f in pairing.facts}
    assert diff.unpaired_run == (
        f"TransformerFirstStage forward (rank 0): {why['TransformerFirstStage']}",
        f"CrossEntropyLoss backward (rank 0): {why['CrossEntropyLoss']}")
    assert diff.unpaired_partner == ()


# ----------------------------------------------------------------- files, cost, record

def test_remove_deletes_the_tensors_and_keeps_the_logs(tmp_path):
    run, partner = sides(tmp_path, calls())
    compare(run, partner, remove=True)
    for side in (run, partner):
        assert files(side) == [f"{STAMP}/precision_check_rank_0.log"]


def test_without_remove_every_file_stays(tmp_path):
    run, partner = sides(tmp_path, calls())
    before = files(run), files(partner)
    compare(run, partner, remove=False)
    assert (files(run), files(partner)) == before


def test_a_cached_partner_keeps_its_tensors(tmp_path):
    run, partner = sides(tmp_path, calls())
    before = files(partner)
    compare(run, partner, remove=True, remove_partner=False)
    assert files(partner) == before
    assert files(run) == [f"{STAMP}/precision_check_rank_0.log"]


def test_keep_first_keeps_exactly_the_first_diverging_and_last_matched_pairs(tmp_path):
    good = calls()
    run, partner = sides(tmp_path, changed(good, "h.1.ln_1", "forward", lambda a: a * 2), good)
    diff = compare(run, partner, remove=True, keep_first=True)
    assert diff.first_diverging.label == "h.1.ln_1 forward"
    assert diff.last_matched.label == "h.0.mlp forward"
    kept = [f"{STAMP}/precision_check_rank_0.log", f"{STAMP}/rank_0/h.0.mlp_forward.npy",
            f"{STAMP}/rank_0/h.1.ln_1_forward.npy"]
    assert files(run) == kept and files(partner) == kept


def test_cost(tmp_path):
    good = calls()
    run, partner = sides(tmp_path, good)
    peak = size(run, partner)
    diff = compare(run, partner, remove=True)
    cost = diff.cost
    assert set(cost) == {"seconds", "peak_bytes", "tensors", "bytes_read", "kept_bytes"}
    assert cost["peak_bytes"] == peak
    assert cost["tensors"] == 2 * len(good)
    assert cost["bytes_read"] == 2 * sum(a.nbytes for _, _, a in good)
    assert cost["kept_bytes"] == size(run, partner) > 0  # the logs
    assert 0 <= cost["seconds"] < 60


def test_the_record_is_json_with_the_documented_fields(tmp_path):
    good = calls()

    def inf(a):
        a[0, 0, 0] = np.inf
        return a
    run, partner = sides(tmp_path, changed(good, "h.0.mlp", "backward", inf), good)
    record = compare(run, partner).to_dict()
    text = json.dumps(record, allow_nan=False)
    assert json.loads(text) == record
    assert set(record) == {"status", "reason", "step", "partner", "line", "first_diverging",
                           "last_matched", "modules", "unpaired", "thresholds", "cost"}
    assert (record["status"], record["reason"], record["step"], record["partner"]) == \
        ("diverged", None, 3, "reference")
    assert record["thresholds"] == {"atol": 1e-6, "rtol": 1e-4, "source": "test thresholds"}
    entry = record["first_diverging"]
    assert set(entry) == {"module", "phase", "index", "rank", "order", "shape", "max_abs",
                          "max_ref", "threshold", "ratio", "ok", "pieces", "note"}
    assert (entry["module"], entry["phase"], entry["max_abs"], entry["ok"]) == \
        ("h.0.mlp", "backward", "inf", False)
    assert entry["shape"] == list(SHAPE) and "Inf 1" in entry["note"]
    assert record["modules"][entry["order"]] == entry
    assert record["last_matched"]["module"] == "h.1.ln_1"


def test_not_traced():
    record = not_traced("skipped", "no trace for this backend", 2, "pytorch baseline")
    assert record["status"] == "skipped" and record["reason"] == "no trace for this backend"
    assert record["modules"] == [] and record["unpaired"] == {"run": [], "partner": []}
    json.dumps(record, allow_nan=False)
    with pytest.raises(ValueError):
        not_traced("matched", "x", 1, "reference")


def test_a_folder_that_is_no_trace_is_a_trace_error(tmp_path):
    run, partner = sides(tmp_path, calls())
    with pytest.raises(TraceError):
        compare(tmp_path / "absent", partner)
    (run / STAMP / "precision_check_rank_0.log").write_text(
        log_line("h.0.ln_1_forward", np.ones(2)).replace("tensor[0]", "tensor") + "\n")
    with pytest.raises(TraceError, match=r"precision_check_rank_0.log:1"):
        compare(run, partner)
