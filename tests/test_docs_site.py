"""The documentation site: `mkdocs build --strict` passes, and fails on what it is there to catch.

The plants build a copy of `docs/` and `mkdocs.yml` with one thing broken each (a link to a page
that is not there, an anchor that is not there, a page left out of the navigation, a navigation
entry with no page, a generated table without its markers) and expect the build to fail naming
it; a stale copy of a generated table is what the site must not show. The last tests hold the
pages to the measurements' rule: a figure a page quotes links to its section of
docs/benchmarks.md (which has the machine, the date and the command), or stands right above the
command that makes it.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HOOK = DOCS / "_hooks" / "generated_tables.py"


def _hook():
    spec = importlib.util.spec_from_file_location("generated_tables", HOOK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(root / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _copy(tmp_path: Path) -> Path:
    """A checkout's docs and site config, built the same way (the hook's generators import
    the installed harness, and tests/ for the package map, from the checkout)."""
    root = tmp_path / "checkout"
    shutil.copytree(DOCS, root / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    # the hook finds the package-map generator in the tests/ beside its docs/
    (root / "tests").symlink_to(ROOT / "tests")
    (root / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")
    return root


def test_the_site_builds_strict_with_every_page_and_the_tables_from_their_sources(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    pages = sorted(p.stem for p in DOCS.glob("*.md"))
    built = {p.stem: (tmp_path / "site" / ("" if p.stem == "index" else p.stem) / "index.html")
             for p in DOCS.glob("*.md")}
    assert pages and all(built[name].is_file() for name in pages), built
    from harness.contracts.programs import program_table

    row = program_table()[2].split("|")[2].strip()  # a fact's name, as the page shows it
    assert row.strip("`") in built["infinitrain_branches"].read_text()


def _plant(root: Path, page: str, old: str, new: str) -> None:
    path = root / page
    text = path.read_text()
    assert old in text, (page, old)
    path.write_text(text.replace(old, new, 1))


PLANTS = {
    "a link to a page that is not there": (
        "docs/index.md", "[Run the harness](harness_guide.md)",
        "[Run the harness](harness_guides.md)", "harness_guides.md"),
    "an anchor that is not there": (
        "docs/index.md", "pipeline_layout_guide.md#workflow-profile-suggest-run",
        "pipeline_layout_guide.md#workflow-profile-suggest-and-run", "workflow-profile-suggest-and-run"),
    "a page left out of the navigation": (
        "mkdocs.yml", "      - Module traces: traces.md\n", "", "traces.md"),
    "a navigation entry with no page": (
        "mkdocs.yml", "  - Bisect: bisect.md", "  - Bisect: bisects.md", "bisects.md"),
    "a generated table without its markers": (
        "docs/traces.md", "<!-- end generated:pairing -->", "", "pairing"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_break_fails_the_build_naming_it(plant, tmp_path):
    root = _copy(tmp_path)
    page, old, new, named = PLANTS[plant]
    assert _build(root, tmp_path / "clean").returncode == 0  # the copy builds before the plant
    _plant(root, page, old, new)
    done = _build(root, tmp_path / "site")
    assert done.returncode != 0, f"{plant}: the strict build passed"
    assert named in done.stdout + done.stderr, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_stale_copy_of_a_generated_table_is_not_what_the_site_shows(tmp_path):
    from harness.contracts.trace import pairing_table

    root = _copy(tmp_path)
    row = pairing_table()[2]
    _plant(root, "docs/traces.md", row + "\n", "")
    assert row not in (root / "docs" / "traces.md").read_text()
    done = _build(root, tmp_path / "site")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    cell = row.split("|")[2].strip().strip("`")
    assert html.escape(cell, quote=False) in (tmp_path / "site" / "traces" / "index.html").read_text()
    hook = _hook()
    assert any("'pairing' is out of date" in line for line in hook.stale(root / "docs"))


def test_the_copies_in_docs_are_the_generated_tables():
    assert _hook().stale() == []


# ---------------------------------------------------------------------- figures and commands

# A measured figure: a duration or a size with its unit, with a word of measuring within a few
# words of it ("took 12 s", "about 1 s on the 2-core machine", "peak 655 MB"). A duration that
# is a setting ("SIGKILL after 5 s", "1 MiB blocks") has none and is not a figure.
FIGURE = re.compile(r"(?<![\w.`-])\d+(?:[.,]\d+)?\s?(?:ms|s|min|minutes|seconds|MB|MiB|GB|GiB)"
                    r"(?![\w-])")
MEASURING = re.compile(r"\b(?:took|takes|taking|measured|wall|median|ran|runs in|pass(?:es|ed)? in|"
                       r"about|peak|load|cost|costs|faster|slower|per run|a run|a step)\b|~")
NEAR = 60  # characters either side of a figure
CODE_SPAN = re.compile(r"`[^`]*`")
COMMAND_SPAN = re.compile(r"`(?:python|pytest|bash|torchrun|CI=true)\b[^`]*`")
MEASUREMENT_LINK = re.compile(r"\]\((?:docs/)?benchmarks(?:_changelog)?\.md#[\w-]+\)")


def _quotes_a_figure(block: str) -> bool:
    text = CODE_SPAN.sub("`code`", block)
    return any(MEASURING.search(text[max(0, m.start() - NEAR):m.end() + NEAR])
               for m in FIGURE.finditer(text))


def figures_without_command(text: str) -> list[str]:
    """The paragraphs (and tables, list items) of a page that quote a measured figure with
    neither a link to its section of the measurements nor its command: in the paragraph, or
    as the code block or paragraph right below it."""
    blocks = [b for b in re.split(r"\n\s*\n", text) if b.strip()]
    bad = []
    for i, block in enumerate(blocks):
        if block.startswith(("    ", "```", "<!--")) or not _quotes_a_figure(block):
            continue
        if MEASUREMENT_LINK.search(block) or COMMAND_SPAN.search(block):
            continue
        following = next((b for b in blocks[i + 1:] if not b.startswith("<!--")), "")
        if following.startswith(("    ", "```")) or COMMAND_SPAN.search(following):
            continue
        bad.append(block.strip().splitlines()[0][:100])
    return bad


def test_the_rule_catches_a_figure_without_its_command():
    assert figures_without_command("The suite took 18 min on 2 cores.\n") == [
        "The suite took 18 min on 2 cores."]
    assert figures_without_command("It took 18 min ([CI](benchmarks.md#ci-wall-time)).\n") == []
    assert figures_without_command("It took 18 min:\n\n    python -m pytest -n 2\n") == []
    assert figures_without_command("Run with `--timeout 30 s` and `-n 2`.\n") == []
    assert figures_without_command("It took 18 min (`python -m pytest -n 2`).\n") == []
    assert figures_without_command("Each is killed by SIGKILL after 5 s.\n") == []


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(
    p for p in DOCS.glob("*.md") if not p.name.startswith("benchmarks"))], ids=lambda p: p.name)
def test_no_page_quotes_a_figure_without_its_command(page):
    assert figures_without_command(page.read_text()) == []
