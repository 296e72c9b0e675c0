"""The history as people read it: `history.md` (per config, per tag x model, one table per case,
newest night first, with when the case last changed status, the plots of its group and the
findings), and the same rows as CSV for a spreadsheet.

Sessions of different configs never share a table or a series: each config is its own part of
the document, and the document says how many there are.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from pathlib import Path

from harness.results.values import slug

from .drawing import Drawers, case_points
from .findings import Finding, all_findings, last_change, since
from .rows import HistoryRow
from .store import History, when

COLUMNS = ("date", "session", "machine", "build", "status", "loss margin", "grad margin",
           "last loss", "tokens/s", "± (2 s.e.)", "step ms", "peak MB")
NA = "–"
# A case's table shows its newest nights: a year of 200 cases in full is 73,000 table lines
# (9.5 MB of markdown, which no reader scrolls and GitHub does not render); the plots and the
# findings always take every night.
TABLE_NIGHTS = 30


def _g(value: float | None, digits: int = 4) -> str:
    if value is None:
        return NA
    if math.isinf(value):
        return "∞"
    return f"{value:.{digits}g}"


def _whole(value: float | None) -> str:
    return NA if value is None or not math.isfinite(value) else f"{value:,.0f}"


def _margin(value: float | None) -> str:
    return NA if value is None else f"{_g(value, 3)}×"


def _status(row: HistoryRow) -> str:
    text = row.status
    if row.baseline and row.baseline != "passed":
        text += f" (baseline {row.baseline})"
    return text


def table_row(row: HistoryRow) -> str:
    spread = (NA if row.tokens_per_s_spread is None
              else f"±{2 * row.tokens_per_s_spread * 100:.1f}%")
    cells = (row.date[:16].replace("T", " "), row.session, row.machine or NA, row.build_label,
             _status(row), _margin(row.loss_margin), _margin(row.gradient_margin),
             _g(row.last_loss, 7), _whole(row.tokens_per_s), spread, _g(row.step_ms, 4),
             _whole(row.peak_memory_mb))
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _change_line(series: list[HistoryRow]) -> str:
    changed = last_change(series)
    if changed is None:
        statuses = sorted({r.status for r in series})
        return (f"Never changed status over {len(series)} night{'s' * (len(series) != 1)} "
                f"({', '.join(statuses)}).")
    before = series[series.index(changed) - 1]
    return (f"Last changed status on {changed.date[:10]} (session {changed.session}, build "
            f"{changed.build_label}): {before.status} → {changed.status}.")


def _findings(title: str, found: list[Finding]) -> list[str]:
    if not found:
        return []
    lines = [title, ""]
    lines += [f"- {f.line}" for f in found]
    return lines + [""]


def since_section(rows: list[HistoryRow], days: float = 7.0, config: str | None = None,
                  found: list[Finding] | None = None) -> list[str]:
    """The nightly report's "Since last week": the findings that started in the last `days`
    (of one config's sessions when given; `found`: those rows' findings when at hand); no
    lines when nothing changed."""
    rows = [r for r in rows if config is None or r.config == config]
    return _findings("## Since last week", since(rows, days, found))


@dataclasses.dataclass
class Rendered:
    """history.md's text, the plots written beside it, and the findings it names."""

    text: str
    images: list[Path]
    found: list[Finding]


def _configs(history: History) -> list[tuple[str, dict[tuple[str, str], dict]]]:
    """Each config's groups, tag x model -> case name -> its rows (oldest first, as the
    history holds them), in the order the document shows them."""
    series: dict[tuple[str, str], list[HistoryRow]] = {}
    for row in history.rows:
        key = (row.config, row.name)
        rows = series.get(key)
        if rows is None:
            series[key] = [row]
        else:
            rows.append(row)
    out = []
    for config in history.configs():
        groups: dict[tuple[str, str], dict[str, list[HistoryRow]]] = {}
        for (of, name), rows in series.items():
            if of == config:
                tag, model, _ = name.split("/")
                groups.setdefault((tag, model), {})[name] = rows
        out.append((config, dict(sorted(groups.items()))))
    return out


def document(history: History, folder: Path, with_plots: bool = True,
             table_nights: int = TABLE_NIGHTS, drawers: Drawers | None = None) -> Rendered:
    """history.md's text, the plots written beside it in `folder`, and the history's findings;
    `table_nights`: the newest nights each case's table shows (0: all; the plots always show
    every night); `drawers`: the processes the plots are drawn in while this one finds the
    findings and writes the tables (drawing.Drawers; none: drawn here, after them)."""
    configs = _configs(history)
    several = len(configs) > 1
    jobs = []  # the figures, in document order: (title, each case's points, path)
    for config, groups in configs if with_plots else ():
        for (tag, model), cases in groups.items():
            stem = slug(f"history-{config}-{tag}-{model}" if several
                        else f"history-{tag}-{model}")
            jobs.append((f"{tag} / {model}",
                         {name: case_points(series) for name, series in cases.items()},
                         folder / f"{stem}.png"))
    # a caller's Drawers ends its own workers; Drawers(1) has none, and draws at finished()
    finished = (drawers or Drawers(1)).draw(jobs)
    found = all_findings(history.rows)
    lines = _lines(history, configs, found, table_nights)
    drawn = [png for _, png in finished()]
    return Rendered(_text(lines, drawn), [png for png in drawn if png is not None], found)


def _text(lines: list, drawn: list[Path | None]) -> str:
    """The document from its lines, each group's figure (`drawn`, in group order; None:
    nothing to draw) linked in its group's place."""
    figures = iter(drawn)
    out = []
    for line in lines:
        if isinstance(line, tuple):  # a group's place for its figure
            png = next(figures, None)
            if png is not None:
                out += [f"![{line[0]}: tokens/s, peak memory and margins over the "
                        f"nights]({png.name})", ""]
        else:
            out.append(line)
    return "\n".join(out).rstrip() + "\n"


def _lines(history: History, configs: list, found: list[Finding],
           table_nights: int) -> list:
    """The document's lines; a group's figure's place as a (title,) tuple."""
    rows = history.rows
    nights = {(r.session, r.date) for r in rows}
    lines: list = ["# Harness history", ""]
    if not rows:
        lines += ["No session has been recorded yet.", ""]
    else:
        lines += [f"{len(nights)} session{'s' * (len(nights) != 1)}, "
                  f"{len({r.name for r in rows})} cases, {rows[0].date[:10]} to "
                  f"{rows[-1].date[:10]}.", ""]
    several = len(configs) > 1
    if several:
        lines += [f"This history holds sessions of {len(configs)} configs; each is kept apart "
                  "(its own tables and series): " + ", ".join(f"`{c}`" for c, _ in configs)
                  + ".", ""]
    if history.notes:
        lines += ["Problems reading the history:", ""]
        lines += [f"- {note}" for note in history.notes] + [""]
    for config, groups in configs:
        mine = [r for r in rows if r.config == config]
        if several:
            lines += [f"## Config `{config}`", ""]
        # a finding is of one config's series (findings._series), so these are mine's own
        theirs = [f for f in found if f.config == config]
        recent = since_section(mine, found=theirs)
        lines += [line.replace("## ", "### ", 1) for line in recent] if several else recent
        lines += _findings("### All findings" if several else "## All findings", theirs)
        depth = "###" if several else "##"
        for (tag, model), cases in groups.items():
            lines += [f"{depth} {tag} / {model}", "", (f"{tag} / {model}",)]
            for name, series in sorted(cases.items()):
                lines += [f"{depth}# `{name}`", "", _change_line(series), "",
                          "| " + " | ".join(COLUMNS) + " |",
                          "|" + "---|" * len(COLUMNS)]
                shown = series[::-1][:table_nights] if table_nights else series[::-1]
                lines += [table_row(r) for r in shown]
                lines.append("")
                if len(shown) < len(series):
                    lines += [f"{len(series) - len(shown)} older nights not shown (every "
                              "night: `python -m harness.history DIR --csv FILE`, or "
                              "`--nights 0`).", ""]
    return lines


CSV_COLUMNS = ("config", "tag", "model", "case", *(f.name for f in
               dataclasses.fields(HistoryRow) if f.name not in ("format", "config")))


def write_csv(rows: list[HistoryRow], path: str | os.PathLike) -> Path:
    """The rows, newest first within each case as in history.md, one line each."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    newest_first = sorted(rows, key=lambda r: (when(r), r.session), reverse=True)
    ordered = sorted(newest_first, key=lambda r: (r.config, r.name))  # stable: newest first
    with open(path, "w", newline="") as stream:
        out = csv.writer(stream)
        out.writerow(CSV_COLUMNS)
        for r in ordered:
            data = r.to_json()
            out.writerow([r.config, r.tag, r.model, r.name.split("/")[2],
                          *("" if data[c] is None else data[c] for c in CSV_COLUMNS[4:])])
    return path
