"""The site's generated tables, pulled in from the code that generates them.

A page shows a generated table between a begin and an end marker comment. The Markdown in
`docs/` holds a copy (GitHub shows it; the tests keep it current); the site never shows that
copy: when mkdocs builds a page (`on_page_markdown`), every registered table of that page is
generated afresh from its source and put between its markers. A registered table whose page or
markers are missing is a warning, so `mkdocs build --strict` fails on it.

    python docs/_hooks/generated_tables.py --check   # exit 1 naming each stale copy
    python docs/_hooks/generated_tables.py --write   # rewrite the copies in docs/
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

LOG = logging.getLogger("mkdocs.hooks.generated_tables")
WRITE = "python docs/_hooks/generated_tables.py --write"


@dataclass(frozen=True)
class GeneratedTable:
    """One generated table: the page that shows it, its markers, and what generates it."""

    name: str
    page: str  # relative to docs/
    begin: str  # how the begin marker line starts (the rest of that line is kept as written)
    end: str  # the end marker line
    generate: Callable[[], str]  # the text between the two marker lines, newline-ended

    def __post_init__(self):
        if not self.begin.startswith("<!--") or not self.end.startswith("<!--"):
            raise ValueError(f"table {self.name!r}: markers must be HTML comments, "
                             f"got {self.begin!r} / {self.end!r}")

    def span(self, text: str) -> tuple[int, int] | None:
        """Where the generated text stands in a page: after the begin marker's line, up to the
        end marker; None when either marker is missing or they are out of order."""
        start = text.find(self.begin)
        if start < 0:
            return None
        inner = text.find("\n", start)
        stop = text.find(self.end, inner)
        return None if inner < 0 or stop < 0 else (inner + 1, stop)

    def splice(self, text: str) -> str | None:
        where = self.span(text)
        return None if where is None else text[:where[0]] + self.generate() + text[where[1]:]


def _lines(generate: Callable[[], list[str]]) -> Callable[[], str]:
    """A table given as lines, set off by a blank line on each side."""
    return lambda: "\n" + "\n".join(generate()) + "\n\n"


def _inner(block: Callable[[], str]) -> Callable[[], str]:
    """The text between the markers of a generator that writes the markers too."""
    def generate() -> str:
        text = block()
        return text[text.index("\n") + 1:text.rindex("\n") + 1]
    return generate


def _coverage() -> str:
    from harness.trainer.coverage import DEFAULT_CONFIG, plan_config, render
    return render(plan_config(DEFAULT_CONFIG))


def _package_maps():
    # The package-map generator lives in tests/ (its test owns it). Put on the path here, at the
    # call: mkdocs restores sys.path once a hook module is loaded.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import tests.test_package_maps
    return tests.test_package_maps


def _package_map() -> str:
    return _package_maps().package_map()


def _layers() -> str:
    return _package_maps().layers_block()


def _record_fields() -> str:
    from harness.results.result_record import doc_block
    return doc_block()


def _programs() -> list[str]:
    from harness.contracts.programs import program_table
    return program_table()


def _flag_roles() -> list[str]:
    from harness.contracts.flags import foreign_role_table
    return foreign_role_table()


def _semantics() -> list[str]:
    from harness.contracts.semantics import fact_table
    return fact_table()


def _mixtral_facts() -> list[str]:
    from harness.contracts.mixtral_facts import fact_table
    return fact_table()


def _pairing() -> list[str]:
    from harness.contracts.trace import pairing_table
    return pairing_table()


def _marked(name: str) -> tuple[str, str]:
    return f"<!-- generated:{name} ", f"<!-- end generated:{name} -->"


TABLES: tuple[GeneratedTable, ...] = (
    GeneratedTable("coverage", "coverage.md", "<!-- coverage:begin", "<!-- coverage:end -->",
                   _coverage),
    GeneratedTable("package-map", "design.md", "<!-- package-map:begin",
                   "<!-- package-map:end -->", _inner(_package_map)),
    GeneratedTable("layers", "design.md", "<!-- layers:begin", "<!-- layers:end -->",
                   _inner(_layers)),
    GeneratedTable("result-record-fields", "results_format.md", "<!-- result-record-fields:",
                   "<!-- end of result-record-fields -->", _inner(_record_fields)),
    GeneratedTable("programs", "infinitrain_branches.md", *_marked("programs"),
                   _lines(_programs)),
    GeneratedTable("flag-roles", "infinitrain_branches.md", *_marked("flag-roles"),
                   _lines(_flag_roles)),
    GeneratedTable("baseline-semantics", "infinitrain_baseline.md",
                   *_marked("baseline-semantics"), _lines(_semantics)),
    GeneratedTable("mixtral-semantics", "infinitrain_baseline.md",
                   *_marked("mixtral-semantics"), _lines(_mixtral_facts)),
    GeneratedTable("pairing", "traces.md", *_marked("pairing"), _lines(_pairing)),
)


def stale(docs: Path = DOCS) -> list[str]:
    """One line per table whose copy in docs/ is not what its source generates now."""
    problems = []
    for table in TABLES:
        path = docs / table.page
        text = path.read_text() if path.is_file() else None
        fresh = None if text is None else table.splice(text)
        if fresh is None:
            problems.append(f"{path}: no {table.begin!r} ... {table.end!r} block for the "
                            f"generated table {table.name!r}")
        elif fresh != text:
            problems.append(f"{path}: the generated table {table.name!r} is out of date: "
                            f"run {WRITE}")
    return problems


def write(docs: Path = DOCS) -> list[Path]:
    """Rewrite every stale copy; the pages changed."""
    changed = []
    for table in TABLES:
        path = docs / table.page
        text = path.read_text()
        fresh = table.splice(text)
        if fresh is None:
            raise SystemExit(f"{path}: no {table.begin!r} ... {table.end!r} block for the "
                             f"generated table {table.name!r}")
        if fresh != text:
            path.write_text(fresh)
            changed.append(path)
    return changed


# ---------------------------------------------------------------------- mkdocs hooks

_seen: set[str] = set()


def on_pre_build(config) -> None:
    _seen.clear()


def on_page_markdown(markdown: str, page, config, files) -> str:
    for table in TABLES:
        if table.page != page.file.src_uri:
            continue
        _seen.add(table.name)
        fresh = table.splice(markdown)
        if fresh is None:
            LOG.warning("%s: no %r ... %r block for the generated table %r", table.page,
                        table.begin, table.end, table.name)
            continue
        markdown = fresh
    return markdown


def on_post_build(config) -> None:
    for table in TABLES:
        if table.name not in _seen:
            LOG.warning("the generated table %r belongs on %s, which the site does not build",
                        table.name, table.page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python docs/_hooks/generated_tables.py",
                                     description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="exit 1 naming each stale copy")
    action.add_argument("--write", action="store_true", help="rewrite the copies in docs/")
    args = parser.parse_args(argv)
    if args.write:
        for path in write():
            print(path)
        return 0
    problems = stale()
    print("\n".join(problems) or "every generated table is current")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
