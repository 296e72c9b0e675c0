"""The markdown sections of one session's report, each a list of lines (GitHub pipe tables,
which render both in a file viewer and in a GitHub job summary; tables and the failures' diffs
are written by harness.compare.render, the renderer pytest's failure text shares)."""

from __future__ import annotations

import math

from harness.compare import render
from harness.compare.render import gradient_markdown, loss_markdown
from harness.results.reading import Session
from harness.results.records import STATUSES
from harness.results.values import NA, g, md_escape, number, percent, section, tolerance_text, whole

from .case_view import (
    BUNDLED,
    CaseView,
    environment_facts,
    foreign_only,
    is_foreign,
    session_trainers,
    status_counts,
    trainer_of,
)
from .plots import verdict_link
from .throughput import LayoutGroup
from .trace import NOTE as TRACE_NOTE
from .trace import trace_lines, traced_elsewhere, traces_of

STATUS_MARK = {"passed": "✅ passed", "failed": "❌ failed", "skipped": "⏭ skipped",
               "error": "💥 error"}


def table(rows: list[list], headers: list[str]) -> list[str]:
    return render.table(rows, headers, render.MARKDOWN)


def header(session: Session, views: list[CaseView]) -> list[str]:
    h = session.header
    facts = environment_facts(session.records)
    started = h.get("started_at") or min((r["started_at"] for r in session.records
                                          if r.get("started_at")), default=None)
    finished = h.get("finished_at")
    if not finished:
        last = max((r["finished_at"] for r in session.records if r.get("finished_at")),
                   default=None)
        finished = last
        if h.get("started_at"):  # a header that never got its end: killed, or still running
            finished = (f"{last} (the last result; the session's end was not recorded)" if last
                        else "not recorded (the session did not finish)")
    devices = sorted({str(r.get("device")) for r in session.records if r.get("device")})
    trainer = h.get("trainer") if isinstance(h.get("trainer"), dict) else {}
    if not devices and trainer.get("device"):  # no record yet: the header says
        devices = [str(trainer["device"])]
    # torch and gloo are the bundled trainer's: a session of foreign trainers only (InfiniTrain's
    # binaries) names its trainer and build instead.
    bundled = not foreign_only(session.records, h)
    gloo = any(not is_foreign(r) and str(r.get("device")) == "cpu" for r in session.records) \
        or (bundled and not session.records)

    def listed(key: str) -> str:
        if not facts[key] and h.get(key):  # no run recorded it: the session header's value
            return str(h[key])
        return ", ".join(facts[key]) if facts[key] else "not recorded"

    lines = [f"# Harness report: session {session.label}", ""]
    rows = [("when", f"{started or 'not recorded'} → {finished or 'not recorded'}")]
    if trainer or not bundled:
        rows.append(("trainer", trainer_text(trainer, session_trainers(session.records, h),
                                             devices)))
    if bundled:
        rows.append(("torch", listed("torch")
                     + (f" (CUDA {listed('cuda')})" if facts["cuda"] else "")))
    rows += [
        ("device", _device_text(devices, facts["device_name"], gloo)),
        ("driver", h.get("driver") or _driver_text(devices, listed("driver"))),
        ("host", listed("host")),
        ("config", h.get("config_path") or "not recorded"),
        ("git commit", _commit(h)),
        ("results", ", ".join(str(p) for p in session.paths)),
    ]
    if isinstance(h.get("collected"), list):
        rows.append(("collected", f"{len(h['collected'])} case(s)"))
    kept = disk_kept(session)
    if kept:
        rows.append(("disk kept", kept))
    if isinstance(h.get("args"), list):
        rows.append(("pytest arguments", " ".join(str(a) for a in h["args"]) or "(none)"))
    shown = {"driver", "config_path", "git_commit", "git_dirty", "started_at", "finished_at",
             "format", "session", "collected", "torch", "args", "trainer"}
    rows += [(k, v) for k, v in h.items() if k not in shown and isinstance(v, (str, int, float))]
    lines += [f"- **{k}**: {md_escape(v)}" for k, v in rows]
    return lines + [""]


def trainer_text(fact: dict, names: list[str], devices: list[str]) -> str:
    """"infinitrain (build infinitrain-3f2a..., /path/build), device cpu": the session header's
    `trainer`; without one (older sessions) the records' trainers, build not recorded."""
    def described(name: str, version, build_dir) -> str:
        what = "version" if name == BUNDLED else "build"  # the bundled one: a source hash
        build = [f"{what} {version}" if version else None, str(build_dir) if build_dir else None]
        build = [b for b in build if b]
        if build:
            return f"{name} ({', '.join(build)})"
        if name == BUNDLED:
            return f"{name} (the bundled PyTorch trainer)"
        return f"{name} (build not recorded)"

    if fact.get("name"):
        text = described(str(fact["name"]), fact.get("version"), fact.get("build_dir"))
        others = [n for n in names if n != str(fact["name"])]
        if others:
            text += f"; records also name {', '.join(others)}"
        device = fact.get("device") or ", ".join(devices)
    else:
        text = ", ".join(described(n, None, None) for n in names) or "not recorded"
        device = ", ".join(devices)
    return text + (f", device {device}" if device else "")


def _device_text(devices: list[str], names: list[str], gloo: bool = True) -> str:
    """"cuda: NVIDIA H100"; on CPU what a device slot is, not "cpu: cpu" (for the bundled
    trainer a gloo process; a foreign trainer's slots are its own)."""
    if not devices:
        return "not recorded"
    parts = []
    for device in devices:
        if device == "cpu":
            parts.append("CPU (each device slot a gloo process)" if gloo else "CPU")
        else:
            named = [n for n in names if n != "cpu"]
            parts.append(f"{device}: {', '.join(named)}" if named else device)
    return "; ".join(parts)


def _driver_text(devices: list[str], recorded: str) -> str:
    if recorded != "not recorded":
        return recorded
    if devices and all(d == "cpu" for d in devices):
        return "none needed (CPU session)"
    return ("not recorded (nvidia-smi was not found where the session ran; "
            "`--about driver=VERSION` adds it)")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def disk_kept(session: Session) -> str | None:
    """What the session's case folders hold on disk, and what the dump policy removed."""
    records = [r for r in session.records if isinstance(r.get("disk_bytes"), (int, float))]
    if not records:
        return None
    kept = sum(r["disk_bytes"] for r in records)
    dumps = [section(r, "dumps") for r in records]
    removed = sum(d.get("removed_bytes") or 0 for d in dumps)
    kept_dumps = sum(1 for d in dumps if d.get("kept"))
    policy = ", ".join(sorted({str(d.get("policy")) for d in dumps if d.get("policy")}))
    return (f"{_size(kept)} in {len(records)} case folder(s) "
            f"({kept_dumps} gradient dump(s) kept; {_size(removed)} of dumps removed "
            f"after the diff; keep-dumps {policy or 'not recorded'})")


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _commit(h: dict) -> str:
    commit = h.get("git_commit")
    if not commit:
        return "not recorded"
    return str(commit) + (" (with uncommitted changes)" if h.get("git_dirty") else "")


def summary(views: list[CaseView], session: Session) -> list[str]:
    rows = status_counts(views, session.unrecorded)
    totals = {s: sum(r[s] for r in rows) for s in (*STATUSES, "unrecorded", "total")}
    headers = ["tag", "model", *STATUSES]
    show_unrecorded = totals["unrecorded"] > 0
    if show_unrecorded:
        headers.append("not recorded")
    headers.append("total")
    body = [[r["tag"], r["model"], *(r[s] for s in STATUSES),
             *([r["unrecorded"]] if show_unrecorded else []), r["total"]] for r in rows]
    body.append(["**all**", "", *(f"**{totals[s]}**" for s in STATUSES),
                 *([f"**{totals['unrecorded']}**"] if show_unrecorded else []),
                 f"**{totals['total']}**"])
    verdict = ("**all recorded cases passed**" if totals["passed"] == len(views) and views
               else f"**{totals['failed']} failed, {totals['error']} errored**"
               if totals["failed"] or totals["error"] else "no failures")
    return ["## Summary", "", f"{plural(len(views), 'case')} recorded: {verdict}.", "",
            *table(body, headers), ""]


def diff_cell(record: dict, key: str) -> str:
    """"max |diff| / tolerance", with a ✗ and what broke when the comparison failed."""
    diff = section(record, key)
    if diff.get("compared") is False:  # the trainer cannot give them: say why, never "passed"
        return f"not compared: {diff.get('reason') or 'no reason recorded'}"
    if not diff:
        compared = section(record, "compare").get(key)
        return "not compared" if compared is False else NA
    tol = section(diff, "tolerance") or section(section(record, "tolerances"), key)
    text = f"{g(diff.get('max_abs_diff'))} ({tolerance_text(tol)})"
    if diff.get("ok") is False:
        problems = []
        if key == "loss":
            if diff.get("mismatched"):
                problems.append(f"{diff['mismatched']}/{diff.get('compared', '?')} steps")
            if diff.get("nonfinite_steps"):
                problems.append("NaN/inf")
            if diff.get("missing_steps"):
                problems.append(f"{len(diff['missing_steps'])} steps missing")
        else:
            if diff.get("mismatched"):
                problems.append(f"{diff['mismatched']}/{diff.get('parameters', '?')} params")
            for what in ("missing", "extra", "shape_errors"):
                if diff.get(what):
                    problems.append(f"{len(diff[what])} {what.replace('_', ' ')}")
        text += " ✗ " + ", ".join(problems or ["out of tolerance"])
    return text


def margin_cell(record: dict, key: str) -> str:
    """The scale-free verdict's margin: "threshold / worst" (x), with the worst value, and the
    parameter (gradients) or step (loss) it was found at; ✗ when below 1 (failed)."""
    rel = section(section(record, key), "relative")
    if not rel:
        return NA
    margin = number(rel.get("margin"))
    worst, threshold = rel.get("worst"), rel.get("threshold")
    if key == "gradients":
        where = f" at {rel['worst_parameter']}" if rel.get("worst_parameter") else ""
    else:
        where = f" at step {rel['worst_step']}" if rel.get("worst_step") is not None else ""
    mark = "" if rel.get("ok", True) else "✗ "
    shown = "∞" if margin is not None and margin == float("inf") else g(margin)
    return f"{mark}{shown}× ({g(worst)} vs {g(threshold)}{where})"


HARNESS_MEMORY_LABEL = "peak MB (CPU: process RSS)"
FOREIGN_MEMORY_LABEL = "peak MB (trainer's own figure)"
NO_FIGURE = "—"  # a foreign trainer's 0 MB: its CPU build measures nothing
INFINITRAIN_CPU_ZERO = "InfiniTrain's CPU build reports peak used: 0 MB"


def memory_cell(v: CaseView) -> str:
    """The peak MB cell: a foreign trainer's 0 (InfiniTrain's CPU build prints
    `peak used: 0 MB`) is no measurement, shown as NO_FIGURE with the table's footnote."""
    if is_foreign(v.record) and v.peak_memory_mb == 0:
        return NO_FIGURE
    return whole(v.peak_memory_mb)


def _memory_header_and_note(views: list[CaseView]) -> tuple[str, str]:
    bundled = [v for v in views if not is_foreign(v.record)]
    foreign = [v for v in views if is_foreign(v.record)]
    on_cpu = any(str(v.record.get("device")) == "cpu" for v in bundled)
    harness_note = (" Peak MB: on CUDA the allocator's peak; on CPU the process's peak resident "
                    "memory (ru_maxrss), mostly the torch runtime (~300 MB), not the model."
                    if on_cpu else " Peak MB: the CUDA allocator's peak (max_memory_allocated).")
    if not foreign:
        return (HARNESS_MEMORY_LABEL if on_cpu else "peak MB"), harness_note
    names = sorted({trainer_of(v.record) for v in foreign})
    note = (f" Peak MB of {', '.join(names)}: the trainer's own figure, as it prints it "
            "(InfiniTrain: the `peak used` of its step lines), not measured by the harness.")
    zeros = [v for v in foreign if memory_cell(v) == NO_FIGURE]
    if zeros:
        infinitrain_cpu = any(trainer_of(v.record) == "infinitrain"
                              and str(v.record.get("device")) == "cpu" for v in zeros)
        note += (f" {NO_FIGURE}: the trainer reported 0 MB, no figure"
                 + (f" ({INFINITRAIN_CPU_ZERO})." if infinitrain_cpu else "."))
    if not bundled:
        return FOREIGN_MEMORY_LABEL, note
    label = ("peak MB (CPU: process RSS; other trainers: their own figure)" if on_cpu
             else "peak MB (other trainers: their own figure)")
    return label, harness_note.replace(" Peak MB:", f" Peak MB of the bundled trainer "
                                                   f"({BUNDLED}):", 1) + note


def cases_table(views: list[CaseView]) -> list[str]:
    memory_label, memory_note = _memory_header_and_note(views)
    headers = ["case", "layout", "DP", "TP", "PP", "VPP", "schedule", "dtype",
               "loss max |Δ| (atol, rtol)", "grad max |Δ| (atol, rtol)",
               "loss margin: threshold / max |Δ|/max(|loss|,1)",
               "grad margin: threshold / max ‖Δ‖/‖ref‖", "tokens/s",
               memory_label, "wall s", "status"]
    rows = [[f"`{v.name}`", v.layout, v.dp,
             f"{v.tp}{'+SP' if v.sequence_parallel else ''}", v.pp, v.vpp, v.schedule,
             v.dtype, diff_cell(v.record, "loss"), diff_cell(v.record, "gradients"),
             margin_cell(v.record, "loss"), margin_cell(v.record, "gradients"),
             whole(v.tokens_per_s), memory_cell(v), g(v.wall_s),
             STATUS_MARK.get(v.status, v.status)] for v in views]
    note = ("Layout: layers per stage (`3,5`), or per chunk in global order as `stage:layers` "
            "when stages hold several chunks. Wall time: the launched run, from start to exit. "
            "Margin: how many times below its threshold the scale-free verdict's worst value "
            "is (> 1 passes, ✗ below 1 fails); a case fails when either the element-wise "
            "check (every element within `atol + rtol·|ref|`) or the scale-free one fails."
            + memory_note)
    return ["## Cases", "", note, "", *table(rows, headers), "", *calibration_lines(views)]


def calibration_lines(views: list[CaseView], named: int = 8) -> list[str]:
    """Which scale-free thresholds the cases were judged with (the record's `calibration`):
    one line per calibration file, per calibration not used (its problem) and per default,
    naming its cases; nothing when every case used the defaults with nothing to report."""
    groups: dict[tuple, list[str]] = {}
    for v in views:
        c = v.record.get("calibration")
        if isinstance(c, dict):
            t = section(c, "thresholds")
            key = (c.get("file"), c.get("problem"), c.get("gradients_noise"),
                   c.get("loss_noise"), t.get("loss"), t.get("gradients"))
            groups.setdefault(key, []).append(v.name)
    oracle = fp64_lines(views)
    if not any(file or problem for file, problem, *_ in groups):
        return oracle
    lines = ["Scale-free thresholds (docs/verdicts.md, Calibration):", ""]
    for (file, problem, grad_noise, loss_noise, loss, grads), names in groups.items():
        text = (f"calibrated by `{file}` (gradient noise {g(grad_noise)}, loss noise "
                f"{g(loss_noise)}): " if file else "the defaults: ")
        text += f"loss {g(loss)}, gradients {g(grads)}"
        if problem:
            text += f"; ⚠ {md_escape(problem)}"
        shown = ", ".join(f"`{n}`" for n in names[:named])
        more = f" and {len(names) - named} more" if len(names) > named else ""
        lines.append(f"- {text} ({plural(len(names), 'case')}: {shown}{more})")
    return [*lines, "", *oracle]


def fp64_lines(views: list[CaseView], named: int = 20) -> list[str]:
    """A calibration session's float64 oracle (the record's `calibration.fp64_ratio`): a line
    per case, the largest ratio first; nothing when no case has one."""
    found = []
    for v in views:
        ratio = section(v.record, "calibration").get("fp64_ratio")
        if isinstance(ratio, dict):
            worst = max((x for x in (number(ratio.get("gradients")), number(ratio.get("loss")))
                         if x is not None), default=-1.0, key=lambda x: math.inf if x != x else x)
            found.append((worst, v.name, ratio))
    if not found:
        return []
    found.sort(key=lambda item: (-item[0], item[1]))
    lines = ["Float64 oracle (calibration session; docs/verdicts.md, Calibration): the "
             "fp64 ratio |run − fp64| / |ref − fp64|, the worst parameter's ‖run − fp64‖ / "
             "‖ref − fp64‖ and the worst step's loss; of order 1: the case differs from its "
             "reference by another rounding order only; orders of magnitude above 1: a bug.", ""]
    for _worst, name, ratio in found[:named]:
        parameter = ratio.get("gradients_parameter")
        at = f" at `{md_escape(parameter)}`" if parameter else ""
        lines.append(f"- `{name}`: gradients {g(ratio.get('gradients'))}{at}, loss "
                     f"{g(ratio.get('loss'))}")
    if len(found) > named:
        lines.append(f"- and {len(found) - named} more")
    return [*lines, ""]


VERDICT_NOTE = ("One point per parameter: its scale-free gradient error ‖got − ref‖ / ‖ref‖ "
                "(log scale) at its layer, coloured and marked by kind (ln_* norms, attention, "
                "MLP, embedding / head), over the case's pipeline chunks (shaded, labelled by "
                "stage); red dashed: the threshold; grey dashed: the calibrated noise floor, "
                "when calibrated; circled red: over the threshold.")


def _verdict_picture(v: CaseView) -> list[str]:
    link = verdict_link(v.record)
    return [f"![scale-free gradient error per parameter of {v.name}]({link})", ""] if link else []


def closest_passing(views: list[CaseView]) -> list[str]:
    """The verdict pictures of the passing cases (the closest to its threshold of each tag and
    model): how much room the passing layouts left."""
    pictured = [v for v in views if v.status == "passed" and verdict_link(v.record)]
    if not pictured:
        return []
    lines = ["## Closest passing case per group", "",
             "The passing case of each tag and model whose worst gradient came nearest its "
             "threshold. " + VERDICT_NOTE, ""]
    for v in pictured:
        lines += [f"### `{v.name}`: {margin_cell(v.record, 'gradients')}", "",
                  *_verdict_picture(v)]
    return lines


def failures(views: list[CaseView], plot_links: dict[str, str]) -> list[str]:
    """Each failed or errored case's text and pictures, then the closest passing pictures."""
    bad = [v for v in views if v.status in ("failed", "error")]
    if not bad:
        return closest_passing(views)
    lines = ["## Failures", ""]
    if any(verdict_link(v.record) for v in bad):
        lines += [f"Gradient pictures: {VERDICT_NOTE}", ""]
    if any(traces_of(v.record) for v in bad):
        lines += [TRACE_NOTE, ""]
    for v in bad:
        lines += [f"### `{v.name}`: {v.status}", ""]
        record = v.record
        if record.get("reason"):
            lines += [f"> {md_escape(record['reason'])}", ""]
        lines += (_crash_lines(record) + loss_markdown(section(record, "loss"))
                  + gradient_markdown(section(record, "gradients")))
        lines += _verdict_picture(v)
        if v.name in plot_links:
            lines += [f"![gradient error of {v.name}]({plot_links[v.name]})", ""]
        lines += trace_lines(record, v.name)
        lines += _log_lines(record)
        errors = [e for e in record.get("errors") or [] if e]
        if errors:
            lines += ["<details><summary>full message</summary>", "", "```text",
                      *"\n\n".join(str(e) for e in errors).replace("```", "'''").splitlines(),
                      "```", "", "</details>", ""]
    return lines + closest_passing(views)


def module_traces(views: list[CaseView]) -> list[str]:
    """The module traces of the cases the Failures section does not show (a passing case
    traced under `all`); a failed or errored case's traces are in its own section."""
    shown = {v.name for v in views if v.status in ("failed", "error")}
    return traced_elsewhere([v.record for v in views], shown)


def _crash_lines(record: dict) -> list[str]:
    parts = []
    if record.get("timed_out"):
        parts.append("timed out")
    if record.get("returncode") not in (None, 0):
        parts.append(f"exit code {record['returncode']}")
    if record.get("failing_rank") is not None:
        parts.append(f"rank {record['failing_rank']} failed first")
    return [f"- **run**: {', '.join(parts)}", ""] if parts else []


def _log_lines(record: dict) -> list[str]:
    logs = section(record, "logs")
    lines = []
    if record.get("output_dir"):
        lines.append(f"- **run folder**: `{record['output_dir']}`")
    if logs.get("launcher_stdout"):
        lines.append(f"- **launcher log**: `{logs['launcher_stdout']}`"
                     + (f", `{logs['launcher_stderr']}`" if logs.get("launcher_stderr") else ""))
    ranks = section(logs, "ranks")
    failing = record.get("failing_rank")
    shown = {str(failing): ranks[str(failing)]} if str(failing) in ranks else ranks
    for rank, paths in sorted(shown.items()):
        if paths:
            lines.append(f"- **rank {rank} log**: " + ", ".join(f"`{p}`" for p in paths))
    return (lines + [""]) if lines else ["- **logs**: not recorded", ""]


CPU_THROUGHPUT_WARNING = (
    "> **On CPU these numbers say little**: every device slot is a gloo process sharing the "
    "machine's cores (and other users' load), so layout differences measured here need not "
    "hold on GPUs; `docs/benchmarks.md` has measured comparisons.")
# The same for a foreign trainer's CPU build (no gloo: its device slots are its own).
FOREIGN_CPU_THROUGHPUT_WARNING = (
    "> **On CPU these numbers say little**: the runs share the machine's cores (and other "
    "users' load), so layout differences measured here need not hold on GPUs.")


def throughput(groups: list[LayoutGroup]) -> list[str]:
    from harness.results.noise import judge, spread_text

    if not groups:
        return []
    lines = ["## Layout throughput", "",
             "Cases of one model and parallelism that differ only in their pipeline layout. "
             "Spread: two standard errors of the mean step time over the timed steps; a "
             "difference is called faster or slower only when it is outside the band of the "
             "two spreads, otherwise it is within noise.", ""]
    on_cpu = [m for g_ in groups for m in g_.members if str(m.record.get("device")) == "cpu"]
    if any(not is_foreign(m.record) for m in on_cpu):
        lines += [CPU_THROUGHPUT_WARNING, ""]
    elif on_cpu:
        lines += [FOREIGN_CPU_THROUGHPUT_WARNING, ""]
    for group in groups:
        base = group.baseline
        note = (f"relative to the uniform layout `{base.layout}`" if group.baseline_kind == "uniform"
                else f"this group has no uniform case (add one without a layout flag): "
                     f"relative to the fastest, `{base.layout}`, which says nothing about the "
                     f"uniform layout")
        rows = []
        for m in group.members:
            # Measured and predicted step time (harness.report.throughput.predictions).
            times = [g(number(m.record.get("step_time_ms"))),
                     g(group.predicted_ms[m.name]) if m.name in group.predicted_ms else NA]
            if m is base:
                rows.append([f"`{m.name}`", m.layout, m.vpp, whole(m.tokens_per_s),
                             spread_text(m.record), "1.000", "–", "–",
                             group.baseline_kind, *times, m.status])
                continue
            j = judge(base.record, m.record, group.ratio(m))
            rows.append([f"`{m.name}`", m.layout, m.vpp, whole(m.tokens_per_s),
                         spread_text(m.record), f"{j.ratio:.3f}", percent(j.ratio),
                         j.band_text, j.verdict, *times, m.status])
        lines += [f"### {group.title}", "", f"tokens/s {note}. Predicted step time: the layout "
                  f"model's, from {group.costs_source}, scaled through the baseline's measured one.", "",
                  *table(rows, ["case", "layout", "VPP", "tokens/s", "spread", "ratio",
                                "change", "noise band", "verdict", "step ms", "predicted step ms",
                                "status"]), ""]
    return lines


def skipped(views: list[CaseView]) -> list[str]:
    skips = [v for v in views if v.status == "skipped"]
    if not skips:
        return []
    rows = [[f"`{v.name}`", v.record.get("reason") or NA] for v in skips]
    return ["## Skipped", "", *table(rows, ["case", "reason"]), ""]


def problems(session: Session) -> list[str]:
    """What the results file did not hold: bad lines, cases with no record, duplicates."""
    lines = []
    if session.unrecorded:
        lines += [f"- **{len(session.unrecorded)} case(s) have no result** (the session was "
                  "interrupted, or their worker died):",
                  *(f"  - `{name}`" for name in session.unrecorded)]
    if session.bad_lines:
        lines.append(f"- **{len(session.bad_lines)} unreadable line(s)** skipped:")
        lines += [f"  - `{b.path}` line {b.number}: {b.problem}" for b in session.bad_lines]
    lines += [f"- {md_escape(note)}" for note in session.notes]
    return ["## Completeness", "", *lines, ""] if lines else []
