"""Reading the report's pipe tables back in tests."""

from __future__ import annotations


def row(markdown: str, *cells: str) -> list[str]:
    """The one table row whose first cells are `cells`, stripped."""
    rows = [[c.strip() for c in line.strip("|").split(" | ")]
            for line in markdown.splitlines() if line.startswith("| ")]
    (found,) = [r for r in rows if r[:len(cells)] == list(cells)]
    return found
