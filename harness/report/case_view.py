"""From records to the facts a report shows: one CaseView per record (normalized layout,
parallelism, schedule, dtype, headline numbers) and the status counts per tag and model."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from harness.results.records import STATUSES
from harness.results.values import number, section

LAYOUT_FLAGS = ("pipeline_layer_partition", "pipeline_layer_costs", "pipeline_chunk_layout",
                "pipeline_model_parallel_layout", "virtual_pipeline_parallel")


@dataclass(frozen=True)
class CaseView:
    record: dict
    name: str
    tag: str
    model: str
    case_id: str
    status: str
    pp: int
    tp: int
    dp: int
    vpp: int
    sequence_parallel: bool
    schedule: str
    dtype: str
    layout: str  # short: "4,4" (one chunk per stage) or "0:2,1:3,0:2,1:1" (stage:layers per chunk)
    uniform: bool | None  # None: the layout was not recorded
    tokens_per_s: float | None
    peak_memory_mb: float | None
    wall_s: float | None


def view(record: dict) -> CaseView:
    parallel, flags = section(record, "parallel"), section(record, "flags")
    layout = section(record, "layout")
    pp = _int(parallel.get("pp"), _int(flags.get("pipeline_parallel"), 1))
    # A Megatron layout string or a chunk list sets vpp without the flag: the layout knows.
    vpp = _int(layout.get("vpp"), _int(parallel.get("vpp"), 1))
    # "auto": the bundled trainer picks the schedule that fits the layout; another trainer
    # (InfiniTrain) runs its own and does not say which.
    foreign = is_foreign(record)
    schedule = (parallel.get("schedule") or flags.get("pipeline_schedule")
                or (("its own" if foreign else "auto") if pp > 1 else "–"))
    return CaseView(
        record=record, name=record["name"], tag=str(record.get("tag")),
        model=str(record.get("model")), case_id=str(record.get("case_id")),
        status=record["status"], pp=pp, tp=_int(parallel.get("tp"), 1),
        dp=_int(parallel.get("dp"), 1), vpp=vpp,
        sequence_parallel=bool(parallel.get("sequence_parallel")), schedule=str(schedule),
        dtype=str(flags.get("dtype") or "float32"), layout=short_layout(layout, pp),
        uniform=is_uniform(layout), tokens_per_s=number(record.get("tokens_per_s")),
        peak_memory_mb=number(record.get("peak_memory_mb")),
        wall_s=number(section(record, "timings").get("run_s")),  # the launch; None: never ran
    )


BUNDLED = "harness"  # the record's `trainer` for the bundled PyTorch trainer


def trainer_of(record: dict) -> str:
    """The record's `trainer`; a harness.result/1 record (no `trainer`) ran the bundled one."""
    return str(record.get("trainer") or BUNDLED)


def is_foreign(record: dict) -> bool:
    """Run by a trainer other than the bundled one (InfiniTrain's binaries, a command): no
    torch, no gloo, no ru_maxrss; its `environment` is null and its memory its own figure."""
    return trainer_of(record) != BUNDLED


def session_trainers(records: list[dict], header: dict | None = None) -> list[str]:
    """The trainers a session's cases ran, bundled first; from the header's `trainer` when no
    record says (a session with no result yet); [] when nothing says."""
    names = {trainer_of(r) for r in records}
    fact = (header or {}).get("trainer")
    if not names and isinstance(fact, dict) and fact.get("name"):
        names = {str(fact["name"])}
    return sorted(names, key=lambda n: (n != BUNDLED, n))


def foreign_only(records: list[dict], header: dict | None = None) -> bool:
    """True when every case of the session ran a foreign trainer (torch facts do not apply)."""
    names = session_trainers(records, header)
    return bool(names) and BUNDLED not in names


def _int(value, default: int) -> int:
    x = number(value)
    return int(x) if x is not None and x == x else default


def _chunks(layout: dict) -> list[tuple[int, int, int]] | None:
    try:
        return [(int(s), int(a), int(b)) for s, a, b in layout["chunks"]]
    except (KeyError, TypeError, ValueError):
        return None


def short_layout(layout: dict, pp: int) -> str:
    """One chunk per stage in stage order: the layer counts ("3,5"); otherwise the chunk list
    in global order as stage:layers ("0:2,1:3,0:2,1:1"), the trainer's --pipeline_chunk_layout."""
    chunks = _chunks(layout)
    if not chunks:
        return "–" if pp <= 1 or not layout else "?"
    if [c[0] for c in chunks] == list(range(len(chunks))):
        return ",".join(str(end - start) for _, start, end in chunks)
    return ",".join(f"{stage}:{end - start}" for stage, start, end in chunks)


def is_uniform(layout: dict) -> bool | None:
    """Whether the layout is the trainer's default (PipelineLayout.uniform) for its shape."""
    chunks = _chunks(layout)
    if chunks is None:
        return None
    try:
        from harness.layout import PipelineLayout

        uniform = PipelineLayout.uniform(int(layout["num_layers"]), int(layout["pp"]),
                                         int(layout.get("vpp") or 1))
    except Exception:  # a shape the layout package rejects cannot be the uniform one
        return False
    return [tuple(c) for c in uniform.to_dict()["chunks"]] == chunks


def status_counts(views: list[CaseView], unrecorded: list[str]) -> list[dict]:
    """Per (tag, model): counts of each status, plus cases with no record."""
    counts: dict[tuple[str, str], Counter] = {}
    for v in views:
        counts.setdefault((v.tag, v.model), Counter())[v.status] += 1
    for name in unrecorded:
        parts = name.split("/")
        key = (parts[0], parts[1]) if len(parts) == 3 else ("?", "?")
        counts.setdefault(key, Counter())["unrecorded"] += 1
    rows = []
    for (tag, model), counter in sorted(counts.items()):
        rows.append({"tag": tag, "model": model, **{s: counter[s] for s in STATUSES},
                     "unrecorded": counter["unrecorded"], "total": sum(counter.values())})
    return rows


def environment_facts(records: list[dict]) -> dict[str, list[str]]:
    """Distinct values over the session's runs (a mixed fleet shows every value)."""
    keys = ("torch", "cuda", "device_name", "driver", "host", "python")
    facts: dict[str, list[str]] = {k: [] for k in keys}
    for record in records:
        env = section(record, "environment")
        for key in keys:
            value = env.get(key)
            if value not in (None, "") and str(value) not in facts[key]:
                facts[key].append(str(value))
    return facts
