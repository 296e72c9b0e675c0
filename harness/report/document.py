"""Assemble the report: sections in reading order, plots written beside the markdown and
linked by relative path (so the folder can be moved or uploaded as one artifact)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.results.reading import Session

from . import baseline, markdown, plots, trace_plot
from .case_view import CaseView, view
from .session_diff import compare
from .session_diff_markdown import comparison as comparison_section
from .throughput import layout_groups


@dataclass
class Report:
    markdown: str
    path: Path
    images: list[Path] = field(default_factory=list)


def build(session: Session, path: Path, previous: Session | None = None,
          with_plots: bool = True, since_last_week: list[str] = ()) -> Report:
    """Write the report of `session` to `path` (and its PNGs beside it); `previous` adds the
    comparison against an earlier session, `since_last_week` the history's section of that
    name (harness.history.render.since_section; empty when nothing changed)."""
    path = Path(path)
    views = [view(r) for r in session.records]
    images: list[Path] = []
    loss_links, grad_links, divergence_links = {}, {}, {}
    if with_plots:
        loss_links, grad_links = _plots(views, path, images)
        divergence_links = _divergence_plots(session.records, path, images)

    lines = markdown.header(session, views)
    lines += markdown.problems(session)
    lines += markdown.summary(views, session)
    lines += list(since_last_week)
    if previous is not None:
        old = [view(r) for r in previous.records]
        lines += comparison_section(compare(old, views, previous.label, session.label,
                                            previous.header, session.header))
    lines += baseline.section(session.records, divergence_links)
    lines += markdown.failures(views, grad_links)
    lines += markdown.module_traces(views)
    lines += markdown.cases_table(views)
    lines += markdown.throughput(layout_groups(views))
    if loss_links:
        lines += ["## Loss against the reference", ""]
        for model, link in loss_links.items():
            lines += [f"![{model} loss per step]({link})", ""]
    lines += markdown.skipped(views)
    text = "\n".join(lines).rstrip() + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return Report(text, path, images)


def _plots(views: list[CaseView], path: Path, images: list[Path]):
    stem = path.stem
    loss_links = _per_model(views, "loss", plots.loss_figure, path, images)
    # the verdict pictures: each failing case's, and the closest passing case of each group
    images.extend(plots.draw_verdicts([v.record for v in views], path.parent, stem).values())
    # the module trace pictures: every trace (and baseline trace) that compared modules
    images.extend(trace_plot.draw_traces([v.record for v in views], path.parent, stem).values())
    grad_links: dict[str, str] = {}
    for v in views:
        if v.status in ("failed", "error"):
            png = path.with_name(f"{stem}-gradients-{plots.slug(v.name)}.png")
            if plots.gradient_figure(v, png):
                images.append(png)
                grad_links[v.name] = png.name
    return loss_links, grad_links


def _divergence_plots(records: list[dict], path: Path, images: list[Path]) -> dict[str, str]:
    """model -> the file name of its divergence-from-the-baseline plot, for the models with a
    judged baseline."""
    checked = [d for d in map(baseline.divergence, records) if d is not None]
    return _per_model(checked, "baseline", plots.divergence_figure, path, images)


def _per_model(items: list, kind: str, draw, path: Path, images: list[Path]) -> dict[str, str]:
    """model -> the file name of its `kind` figure (`draw(model, its items, png)`, None when
    it has nothing to draw), for each model among `items` (each with a `.model`)."""
    links: dict[str, str] = {}
    for model in sorted({item.model for item in items}):
        png = path.with_name(f"{path.stem}-{kind}-{plots.slug(model)}.png")
        if draw(model, [item for item in items if item.model == model], png):
            images.append(png)
            links[model] = png.name
    return links
