"""The tool's cases, verdict lines, report.md and exit code. `python -m harness.logs BASELINE
SUBJECT` pairs the runs, judges each pair (the loss per step, and the printed lr per step where
both logs print one), prints one line a case and writes report.md; exit 0 when every case
passed, 1 when one failed, had no partner or a bad input, 2 for unusable arguments."""

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.logs", description=__doc__)
    parser.add_argument("baseline", nargs=1, help="baseline log or folder (PyTorch, Megatron, "
                                                  "InfiniTrain, harness session)")
    parser.add_argument("subject", nargs=1, help="the runs to judge: a log or a folder")
    parser.add_argument("--pairing", help='JSON {"<section or file name>": "<model>_<case>"}')
    parser.add_argument("-o", "--output", default="report.md", help="report.md path")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        pairing = read_pairing(args.pairing) if args.pairing else {}
        baseline, subject = read_paths(args.baseline), read_paths(args.subject)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cases = pair(baseline, subject, pairing)
    for c in cases:
        print(c.line())
    out = Path(args.output)
    if out.is_dir():
        out = out / "report.md"
    try:
        out.write_text(report_md(cases, args.baseline, args.subject))
    except OSError as e:
        print(f"error: {out}: {e}; expected a writable report path", file=sys.stderr)
        return 2
    print(f"report: {out}")
    return 0 if cases and all(c.status == PASSED for c in cases) else 1
