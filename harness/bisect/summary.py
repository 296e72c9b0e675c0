"""What a finished bisect says: the first bad commit with the case's failure text, the skipped
commits and why, and the cost (commits judged, from the cache, builds, sessions, wall time)."""

from __future__ import annotations

from dataclasses import dataclass

FAILURE_LINES = 40  # of the first bad commit's failure text


@dataclass(frozen=True)
class Cost:
    judged: int
    cached: int
    builds: int
    sessions: int
    skipped: int
    wall_s: float

    @classmethod
    def of(cls, entries: list[dict], wall_s: float) -> "Cost":
        judged = [e for e in entries if e.get("outcome") in ("good", "bad", "skip")]
        return cls(judged=len({e["sha"] for e in judged}),
                   cached=len({e["sha"] for e in judged if e.get("cached")}),
                   builds=sum(bool(e.get("built")) for e in judged),
                   sessions=sum(bool(e.get("session")) for e in judged),
                   skipped=len({e["sha"] for e in judged if e["outcome"] == "skip"}),
                   wall_s=wall_s)

    def line(self) -> str:
        return (f"commits judged: {self.judged} ({self.cached} from the cache, "
                f"{self.skipped} skipped); builds: {self.builds}; sessions: {self.sessions}; "
                f"wall time {self.wall_s:.1f} s")


def judged(entries: list[dict]) -> dict[str, dict]:
    """sha -> the last verdict entry of that commit."""
    return {e["sha"]: e for e in entries if e.get("outcome") in ("good", "bad", "skip")}


def first_bad_lines(entry: dict) -> list[str]:
    lines = [f"first bad commit: {entry['sha']} {entry['subject']}", f"  {entry['line']}"]
    failure = (entry.get("failure") or "").splitlines()
    if failure and failure[0] == entry["line"]:  # the record's reason is its first line
        failure = failure[1:]
    if failure:
        shown = failure[:FAILURE_LINES]
        lines += ["  failure text:"] + [f"    {line}" for line in shown]
        if len(failure) > len(shown):
            lines.append(f"    ... ({len(failure) - len(shown)} more lines)")
    session = entry.get("session_dir")
    if session:
        lines.append(f"  session: {session} (python -m harness.report {session})")
    return lines


def skipped_lines(entries: list[dict]) -> list[str]:
    return [f"skipped {e['sha'][:12]} {e['subject']!r}: {e['line']}"
            for e in judged(entries).values() if e["outcome"] == "skip"]
