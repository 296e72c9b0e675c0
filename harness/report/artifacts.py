"""`python -m harness.report.artifacts SESSION DEST`: copy the failing and errored cases' run
folders (logs, run.json, steps.jsonl, layout.txt) into DEST for upload, without their gradient
dumps (a 124M-parameter model dumps ~0.5 GB per case; the diff summary is in the record).

The layout under DEST mirrors the session's: `cases/<tag>/<model>/<id>/...`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from harness.results.reading import NoResults, read_session, resolve

SKIPPED_DIRS = {"gradients"}


def failing_folders(results: Path) -> list[Path]:
    session = read_session([results])
    folders = []
    for record in session.records:
        out = record.get("output_dir")
        if record["status"] in ("failed", "error") and out and Path(out).is_dir():
            folders.append(Path(out))
    return folders


def copy_failing(results: Path, dest: Path) -> list[Path]:
    """Copy each failing case's folder (less gradient dumps) under dest; returns the copies."""
    copies = []
    for folder in failing_folders(results):
        try:
            relative = folder.relative_to(results.parent)
        except ValueError:  # a folder outside the session (another output root): keep its tail
            relative = Path(*folder.parts[-4:])
        target = dest / relative
        shutil.copytree(folder, target, dirs_exist_ok=True,
                        ignore=lambda _dir, names: [n for n in names if n in SKIPPED_DIRS])
        copies.append(target)
    return copies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.report.artifacts",
                                description="Copy failing cases' logs (no gradients) for upload.")
    p.add_argument("session", help="results file or session folder")
    p.add_argument("dest", help="destination folder")
    args = p.parse_args(argv)
    try:
        results = resolve(args.session)
    except NoResults as error:
        print(f"harness.report.artifacts: {error}", file=sys.stderr)
        return 2
    copies = copy_failing(results, Path(args.dest))
    print(f"copied {len(copies)} failing case folder(s) to {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
