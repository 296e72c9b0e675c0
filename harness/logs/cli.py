"""The tool's cases, verdict lines, report.md and exit code.

`python -m harness.logs RUNS` judges every InfiniTrain run folder under RUNS on its own: each
case against the recorded run that is its one-device reference (harness.logs.selfcheck), the
same case followed across nights and machines (harness.logs.archive); one line a case,
report.md, and grid.png (cases x nights) and findings.jsonl beside it; exit 0 when no case
failed or was a bad input, 1 when one was.

`python -m harness.logs BASELINE SUBJECT` pairs the runs of two folders by case name, judges
each pair (the loss per step, and the printed lr per step where both logs print one), prints one
line a case and writes report.md; exit 0 when every case passed, 1 when one failed, had no
partner or a bad input.

Either: 2 for unusable arguments."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from harness.compare.baseline import (
    BaselineVerdict,
    LrVerdict,
    bad_pairing,
    judge_baseline,
    judge_lr,
    threshold_text,
)

from harness.cases.load import load_config
from harness.contracts.flags import NO_DECLARED_ROLES, DeclaredRoles, FlagError

from . import archive, selfcheck
from .pairing import read_pairing, resolved
from .readers import BadInput, Reading, RecordedRun, dtype_of, read_paths

PASSED, FAILED, NO_PARTNER, BAD = "PASSED", "FAILED", "NO PARTNER", "BAD INPUT"


@dataclass(frozen=True)
class Case:
    """One row of the report: a subject run and its baseline, or what stands alone."""

    model: str
    case: str | None
    tag: str | None
    dtype: str
    status: str
    baseline: RecordedRun | None = None
    subject: RecordedRun | None = None
    verdict: BaselineVerdict | None = None
    why: str = ""  # for NO PARTNER and BAD INPUT
    lr: LrVerdict | None = None  # where both sides print an lr
    lr_note: str | None = None  # where one side prints an lr and the other none

    @property
    def label(self) -> str:
        name = f"{self.model}/{self.case}" if self.case else f"{self.model}/?"
        return f"{self.tag}/{name}" if self.tag else name

    @property
    def sources(self) -> str:
        return "; ".join(f"{side} {r.source}" for side, r in (("baseline", self.baseline),
                                                              ("subject", self.subject)) if r)

    def line(self) -> str:
        if self.verdict is None or self.verdict.problem:
            why = self.why or (self.verdict.problem if self.verdict else "")
            return f"{self.status} {self.label} {self.dtype}: {why}"
        v = self.verdict
        worst = f"worst {v.max_abs_diff:.1e} at step {v.worst_step} (threshold {v.threshold})"
        loss = f"{len(v.steps)} steps, {worst}" if v.ok else f"{v.lines()[0]}; {worst}"
        return f"{self.status} {self.label} {v.dtype} {loss}{self.lr_text()}"

    def lr_text(self) -> str:
        """The lr's part of the line: `; lr ...`, or nothing where neither side prints one."""
        if self.lr_note:
            return f"; {self.lr_note}"
        lr = self.lr
        if lr is None:
            return ""
        if lr.problem:
            return f"; lr bad pairing: {lr.problem}"
        worst = f"worst lr |diff| {lr.max_abs_diff:.1e} at step {lr.worst_step}"
        if lr.ok:
            return f"; lr {len(lr.steps)} steps within print resolution, {worst}"
        return f"; {lr.lines()[0]}; {worst}"


def _resolved(reading: Reading, pairing) -> tuple[list[RecordedRun], list[BadInput]]:
    paired = resolved(reading, pairing)
    return list(paired.runs), list(paired.bad)


def _duplicates(runs: list[RecordedRun], side: str) -> tuple[list[RecordedRun], list[BadInput]]:
    """Two logs of one (model, case, tag) on one side: both are bad inputs."""
    groups: dict[tuple, list[RecordedRun]] = {}
    for run in runs:
        groups.setdefault((run.model, run.case, run.tag), []).append(run)
    keep, bad = [], []
    for (model, case, tag), group in groups.items():
        if len(group) == 1 or case is None:
            keep += group
            continue
        sources = ", ".join(r.source for r in group)
        bad.append(BadInput(group[0].source, f"two {side} logs for {model}/{case}: {sources}; "
                                             "expected one", model, case, tag))
    return keep, bad


def _fits(a: str | None, b: str | None) -> bool:
    return a is None or b is None or a == b


def pair(baseline: Reading, subject: Reading, pairing=None) -> list[Case]:
    """Every case: judged pairs, the runs with no partner on either side, the bad inputs."""
    pairing = pairing or {}
    base, base_bad = _resolved(baseline, pairing)
    subj, subj_bad = _resolved(subject, pairing)
    base, more = _duplicates(base, "baseline")
    base_bad += more
    subj, more = _duplicates(subj, "subject")
    subj_bad += more
    cases, used = [], set()
    bad_keys = {(b.model, b.case) for b in base_bad + subj_bad if b.case}
    for bad in base_bad + subj_bad:
        side = "baseline" if bad in base_bad else "subject"
        dtype = _dtype_of_case(bad.case)
        cases.append(Case(bad.model or "?", bad.case, bad.tag, dtype, BAD,
                          why=f"{side}: {bad.message}"))
    for run in base:
        if run.case is None:
            used.add(id(run))
            cases.append(Case(run.model, None, run.tag, run.dtype, NO_PARTNER, baseline=run,
                              why=f"no partner: descriptive name, give a pairing "
                                  f"(--pairing FILE with {{\"{run.section}\": "
                                  "\"<model>_<case>\"}): " + run.source))
    for run in subj:
        partners = [b for b in base if b.case is not None and b.key == run.key
                    and _fits(b.tag, run.tag)]
        if len(partners) > 1:
            tagged = [b for b in partners if b.tag == run.tag]
            partners = tagged if len(tagged) == 1 else partners
        used.update(id(b) for b in partners)
        if not partners:
            if run.key in bad_keys:
                continue  # its baseline is a bad input, already a row
            cases.append(Case(run.model, run.case, run.tag, run.dtype, NO_PARTNER,
                              subject=run, why=f"no baseline for the subject {run.source}"))
            continue
        if len(partners) > 1:
            cases.append(Case(run.model, run.case, run.tag, run.dtype, BAD, subject=run,
                              why="several baselines: " + ", ".join(b.source for b in partners)
                                  + "; expected one"))
            continue
        cases.append(judged(partners[0], run))
    for run in base:
        if id(run) not in used and run.key not in bad_keys:
            cases.append(Case(run.model, run.case, run.tag, run.dtype, NO_PARTNER, baseline=run,
                              why=f"no subject for the baseline {run.source}"))
    return sorted(cases, key=lambda c: (c.model, c.case or "", c.tag or "", c.status))


def _dtype_of_case(case: str | None) -> str:
    return dtype_of(case) if case else "?"


def judged(base: RecordedRun, run: RecordedRun) -> Case:
    """The verdict of one pair; another model or dtype is a bad pairing. The printed lr is
    judged beside the loss where both print one (harness.compare.baseline.judge_lr); where one
    prints none, the case says so in one line naming that file."""
    where = f"subject {run.source} against baseline {base.source}"
    lr, lr_note = None, None
    if base.model != run.model or base.dtype != run.dtype:
        verdict = bad_pairing(run.dtype, f"{where}: the baseline is {base.model} {base.dtype}; "
                                         f"expected {run.model} {run.dtype}")
    else:
        verdict = judge_baseline(run.steps, run.losses, base.steps, base.losses, run.dtype,
                                 resolution=selfcheck.loss_resolution(run.dtype, run.losses,
                                                                      base.losses),
                                 where=where)
        if run.lrs and base.lrs:
            lr = judge_lr(run.steps, run.lrs, run.lr_resolutions, base.steps, base.lrs,
                          base.lr_resolutions, where=where)
        elif run.lrs or base.lrs:
            (bare, side), printed = ((run, "subject"), base) if base.lrs else \
                ((base, "baseline"), run)
            lr_note = (f"lr not compared: the {side} {bare.source} prints no lr; expected "
                       f"`lr X` on every step line, as {printed.source} prints")
    if verdict.problem or (lr is not None and lr.problem):
        status = BAD
    else:
        status = PASSED if verdict.ok and (lr is None or lr.ok) else FAILED
    tag = run.tag or base.tag
    return Case(run.model, run.case, tag, run.dtype, status, base, run, verdict,
                why=verdict.problem or (lr.problem if lr else None) or "", lr=lr,
                lr_note=lr_note)


def report_md(cases: Sequence[Case], baseline: Sequence[str], subject: Sequence[str]) -> str:
    counts = {s: sum(c.status == s for c in cases) for s in (PASSED, FAILED, NO_PARTNER, BAD)}
    out = ["# Against a recorded baseline", "",
           f"Baseline: {', '.join(map(str, baseline))}  ", f"Subject: {', '.join(map(str, subject))}",
           "", "| " + " | ".join(f"{k}: {v}" for k, v in counts.items()) + " |",
           "|" + " --- |" * len(counts), "",
           "## Cases", "",
           "| model | case | dtype | steps compared | first diverging step | worst \\|diff\\| "
           "| threshold | lr (worst \\|diff\\|, first diverging step) | status | sources |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in cases:
        v = c.verdict
        compared = len(v.steps) if v and not v.problem else 0
        first = v.first_diverging_step if v and v.first_diverging_step is not None else "-"
        worst = (f"{v.max_abs_diff:.1e} at step {v.worst_step}" if v and not v.problem
                 else "-")
        notes = "; ".join(r.note for r in (c.baseline, c.subject) if r and r.note)
        sources = c.sources + (f" ({notes})" if notes else "")
        out.append(f"| {c.model} | {(c.tag + '/') if c.tag else ''}{c.case or '?'} | {c.dtype} "
                   f"| {compared} | {first} | {worst} | {threshold_text(c.dtype)} "
                   f"| {_cell(_lr_cell(c))} | {c.status} | {_cell(sources)} |")
    for title, status in (("No partner", NO_PARTNER), ("Bad inputs", BAD)):
        out += ["", f"## {title}", ""]
        rows = [c for c in cases if c.status == status]
        out += [f"- {c.label}: {_cell(c.why)}" for c in rows] or ["none"]
    failed = [c for c in cases if c.status == FAILED]
    if failed:
        out += ["", "## Failures", ""]
        for c in failed:
            lines = c.verdict.lines() if not c.verdict.ok else []
            lines += c.lr.lines() if c.lr is not None and not c.lr.ok else []
            out += [f"- {c.label}:"] + [f"  - {line}" for line in lines]
    notes = [c for c in cases if c.lr_note or (c.lr is not None and c.lr.problem)]
    if notes:
        out += ["", "## Learning rate not compared", ""]
        out += [f"- {c.label}: {_cell(c.lr_note or c.lr.problem)}" for c in notes]
    return "\n".join(out) + "\n"


def _lr_cell(c: Case) -> str:
    """The report's lr cell: the worst |diff| and the first diverging step, or why none."""
    if c.lr_note:
        return "not printed by one side"
    if c.lr is None:
        return "-"
    if c.lr.problem:
        return "bad pairing"
    first = c.lr.first_diverging_step
    return (f"{c.lr.max_abs_diff:.1e} at step {c.lr.worst_step}, "
            f"{'none' if first is None else f'step {first}'}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report_path(given: str) -> Path:
    """-o as given: a `.md` file, else a folder (made where missing) with report.md in it."""
    path = Path(given)
    if path.suffix == ".md" and not path.is_dir():
        return path
    return path / "report.md"


def config_cases(path: str) -> dict[str, tuple[dict, int, str]]:
    """A config's cases by `tag/model/id` and, where unique, `model/id`: (flags as written, the
    devices it runs on, where) — the flags of a log with no [COMMAND] line, by its name."""
    config = load_config(path)
    out: dict[str, tuple[dict, int, str]] = {}
    by_short: dict[str, list] = {}
    for case in config.cases:
        entry = (dict(case.args), case.world_size, f"{path} {case.name}")
        out[case.name] = entry
        by_short.setdefault(f"{case.model}/{case.case_id}", []).append(entry)
    out.update({k: v[0] for k, v in by_short.items() if len(v) == 1 and k not in out})
    return out


def self_check(paths: Sequence[str], output: Path, declared: DeclaredRoles,
               config: str | None) -> int:
    """One folder (or several) judged on its own; the lines, report.md, findings.jsonl."""
    reading = read_paths(paths)
    config_args = config_cases(config) if config else None
    rows = archive.judge_reading(reading, declared, config_args)
    if not rows:
        print(f"error: {', '.join(paths)}: no InfiniTrain run log under it; expected "
              "<model>_<case>.log files of a run folder", file=sys.stderr)
        return 2
    others = {r.meta.get("file", r.source): r.kind for r in reading.runs
              if r.kind not in ("infinitrain", "harness")}  # baselines' logs, file -> kind
    notes = [f"{f}: a {kind} log, not a run folder's: not judged here (python -m "
             f"harness.logs BASELINE SUBJECT compares a folder with it)"
             for f, kind in sorted(others.items())]
    rows += archive.empty_run_folders(paths, rows)
    for row in rows:
        print(row.line())
    for note in notes:
        print(f"note: {note}")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        picture = archive.grid_picture(rows, output.with_name("grid.png"))
        output.write_text(archive.report_md(rows, paths, notes,
                                            picture.name if picture else None))
        findings = output.with_name("findings.jsonl")
        archive.write_findings(rows, findings)
    except OSError as e:
        print(f"error: {output}: {e}; expected a writable report path", file=sys.stderr)
        return 2
    print(f"report: {output}")
    print(f"findings: {findings}")
    return 1 if any(r.status in (selfcheck.FAILED, selfcheck.BAD) for r in rows) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.logs",
                                     usage="python -m harness.logs RUNS | BASELINE SUBJECT "
                                           "[options]", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="FOLDER",
                        help="one folder: every run folder under it judged on its own; two: "
                             "a baseline log or folder (PyTorch, Megatron, InfiniTrain, "
                             "harness session) and the runs to judge against it")
    parser.add_argument("--pairing", help='two folders: JSON {"<section or file name>": '
                                          '"<model>_<case>"}')
    parser.add_argument("--config", help="one folder: the config its runner ran "
                                         "(InfiniTrain's scripts/test_config.json): the flags "
                                         "of a log with no [COMMAND] line, by case name")
    parser.add_argument("--flag-role", action="append", default=[], metavar="NAME=ROLE",
                        help="one folder: the role of a flag the flag table does not know")
    parser.add_argument("-o", "--output", default="report.md",
                        help="the report: a .md file, else a folder (made where missing) with "
                             "report.md in it; one folder also writes grid.png and "
                             "findings.jsonl beside it")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if len(args.paths) > 2:
        print(f"error: {len(args.paths)} paths; expected RUNS, or BASELINE SUBJECT",
              file=sys.stderr)
        return 2
    if len(args.paths) == 1:
        try:
            declared = DeclaredRoles.parse(args.flag_role, "--flag-role") \
                if args.flag_role else NO_DECLARED_ROLES
            return self_check(args.paths, report_path(args.output), declared, args.config)
        except (ValueError, FileNotFoundError, FlagError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    try:
        pairing = read_pairing(args.pairing) if args.pairing else {}
        baseline, subject = read_paths(args.paths[:1]), read_paths(args.paths[1:])
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cases = pair(baseline, subject, pairing)
    for c in cases:
        print(c.line())
    out = report_path(args.output)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report_md(cases, args.paths[:1], args.paths[1:]))
    except OSError as e:
        print(f"error: {out}: {e}; expected a writable report path", file=sys.stderr)
        return 2
    print(f"report: {out}")
    return 0 if cases and all(c.status == PASSED for c in cases) else 1
