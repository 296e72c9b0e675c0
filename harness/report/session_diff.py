"""Two sessions side by side, matched by case name (tag/model/id): what newly fails, what newly
passes, what appeared or went away, what got faster or slower (new tokens/s over old, called
only outside the noise band of the two cases' timed steps, harness.results.noise, and at least
SPEED_THRESHOLD), and which session settings differ."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.results.noise import Judgement, judge

from .case_view import CaseView, foreign_only

BAD = ("failed", "error")
SPEED_THRESHOLD = 0.05  # and never under 5%: sessions apart in time see different machine load


@dataclass
class Comparison:
    old_label: str
    new_label: str
    newly_failing: list[tuple[CaseView, CaseView]] = field(default_factory=list)
    newly_passing: list[tuple[CaseView, CaseView]] = field(default_factory=list)
    still_failing: list[tuple[CaseView, CaseView]] = field(default_factory=list)
    other_changes: list[tuple[CaseView, CaseView]] = field(default_factory=list)  # e.g. -> skipped
    added: list[CaseView] = field(default_factory=list)
    removed: list[CaseView] = field(default_factory=list)
    speed: list[tuple[CaseView, CaseView, float]] = field(default_factory=list)  # new/old
    settings: list[tuple[str, str, str]] = field(default_factory=list)  # (what, old, new)

    def judgement(self, old: CaseView, new: CaseView, ratio: float) -> Judgement:
        return judge(old.record, new.record, ratio, floor=SPEED_THRESHOLD)

    def _called(self, verdict: str) -> list[tuple[CaseView, CaseView, float]]:
        return [s for s in self.speed if self.judgement(*s).verdict == verdict]

    @property
    def faster(self) -> list[tuple[CaseView, CaseView, float]]:
        return self._called("faster")

    @property
    def slower(self) -> list[tuple[CaseView, CaseView, float]]:
        return self._called("slower")

    @property
    def unjudged(self) -> list[tuple[CaseView, CaseView, float]]:
        """Changes of at least SPEED_THRESHOLD that are within noise or have no spread."""
        called = {id(s) for s in self.faster + self.slower}
        return [s for s in self.speed
                if id(s) not in called and abs(s[2] - 1) >= SPEED_THRESHOLD]


# The settings `--compare` lists when they differ, by their names in the header's `settings`
# block (harness.runner.settings.Options); each is shown by its flag (--gpus, -n, ...).
COMPARED_SETTINGS = ("slots", "workers", "device", "launcher", "config", "trainer", "marker",
                     "keyword")


def header_settings(header: dict) -> dict[str, str | None] | None:
    """The compared settings of a header, as text (None: not given), from its `settings` block;
    None when it has none (a header written before the block existed: settings_from_args)."""
    block = header.get("settings")
    if not isinstance(block, dict):
        return None
    return {name: None if block.get(name) is None else str(block[name])
            for name in COMPARED_SETTINGS}


def settings_from_args(args: list) -> dict[str, str | None]:
    """Fallback for headers without a `settings` block (written before it existed): the same
    names read from the pytest arguments as given (`--gpus 2` or `--gpus=2`; None: not given,
    where the block has the resolved value)."""
    from harness.runner.settings import flag_of  # the runner package, only when comparing

    def given(flag: str) -> str | None:
        for index, arg in enumerate(map(str, args)):
            if arg == flag and index + 1 < len(args):
                return str(args[index + 1])
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
        return None

    return {name: given(flag_of(name)) for name in COMPARED_SETTINGS}


def _compared(old: dict, new: dict) -> tuple[dict, dict] | None:
    """Both headers' compared settings: from their settings blocks, or from both headers'
    arguments where one lacks the block (a resolved value against one as given would show
    every default as a difference); None where either has neither."""
    blocks = header_settings(old), header_settings(new)
    if None not in blocks:
        return blocks
    old_args, new_args = old.get("args"), new.get("args")
    if isinstance(old_args, list) and isinstance(new_args, list):
        return settings_from_args(old_args), settings_from_args(new_args)
    return None


def settings_differences(old: dict, new: dict, old_records: list[dict],
                         new_records: list[dict]) -> list[tuple[str, str, str]]:
    """Session settings that differ: pytest options (from each header's `settings`, or from
    older headers' arguments), torch (unless neither session ran the bundled trainer), the
    trainer's build (the headers' `trainer`), driver, config, devices and hosts (from the
    records)."""
    diffs = []
    compared = _compared(old, new)
    if compared is not None:
        from harness.runner.settings import flag_of  # the runner package, only when comparing

        for name in COMPARED_SETTINGS:
            a, b = compared[0][name], compared[1][name]
            if a != b:
                diffs.append((flag_of(name), a or "not given", b or "not given"))
    torch_applies = not (foreign_only(old_records, old) and foreign_only(new_records, new))
    for key in ("torch", "driver", "config_path") if torch_applies else ("driver", "config_path"):
        a, b = old.get(key), new.get(key)
        if a and b and a != b:
            diffs.append((key.replace("_", " "), str(a), str(b)))

    old_trainer, new_trainer = (h.get("trainer") if isinstance(h.get("trainer"), dict) else {}
                                for h in (old, new))
    for key, what in (("name", "trainer"), ("version", "trainer build")):
        a, b = old_trainer.get(key), new_trainer.get(key)
        if a and b and a != b:
            diffs.append((what, str(a), str(b)))

    def seen(records, get):
        return ", ".join(sorted({str(v) for v in map(get, records) if v})) or "not recorded"

    for what, get in (("device", lambda r: r.get("device")),
                      ("host", lambda r: (r.get("environment") or {}).get("host"))):
        a, b = seen(old_records, get), seen(new_records, get)
        if a != b:
            diffs.append((what, a, b))
    return diffs


def compare(old: list[CaseView], new: list[CaseView], old_label: str, new_label: str,
            old_header: dict | None = None, new_header: dict | None = None) -> Comparison:
    result = Comparison(old_label, new_label)
    result.settings = settings_differences(old_header or {}, new_header or {},
                                           [v.record for v in old], [v.record for v in new])
    old_by_name = {v.name: v for v in old}
    new_names = {v.name for v in new}
    for case in new:
        before = old_by_name.get(case.name)
        if before is None:
            result.added.append(case)
            continue
        pair = (before, case)
        if case.status in BAD and before.status not in BAD:
            result.newly_failing.append(pair)
        elif case.status == "passed" and before.status in BAD:
            result.newly_passing.append(pair)
        elif case.status in BAD:
            result.still_failing.append(pair)
        elif case.status != before.status:
            result.other_changes.append(pair)
        if case.tokens_per_s and before.tokens_per_s:
            result.speed.append((before, case, case.tokens_per_s / before.tokens_per_s))
    result.removed = [v for v in old if v.name not in new_names]
    result.speed.sort(key=lambda s: s[2])  # slowest-relative first: regressions lead
    return result
