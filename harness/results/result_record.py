"""The result record as a type: `ResultRecord` (one per case, one JSON line in results.jsonl),
its nested parts (`Parallel`, `Reference`, `Logs`, `Timings`), and the one place its fields are
described. `FIELDS` (the JSON keys, in order) and the key table of docs/results_format.md are
derived from these dataclasses and their `doc` metadata; tests/results/test_record_type.py
checks that the doc is what `doc_table()` generates (`write_doc()` rewrites it).

Adding a key: add a field here with `doc=`, regenerate the doc, and bump RESULT_FORMAT when
readers need to tell records with it from records without (keep the old format readable).

`to_json()` gives the record as the dict that is written (JSON-safe: NaN / inf as strings,
paths as strings); `from_json(data, where=...)` reads a /1 or /2 record back, refusing an
unknown key with the key's name and `where` (e.g. `results.jsonl:3`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_FORMAT = "harness.result/2"
# Formats the readers accept: /2 added `trainer` and `passthrough_flags` (absent in /1 records).
READABLE_FORMATS = ("harness.result/1", RESULT_FORMAT)
STATUSES = ("passed", "failed", "skipped", "error")

# Nested fields with this metadata are left out of the JSON while None (they were keys that a
# run adds only when it knows them).
_OPTIONAL = "omit_none"


def doc(text: str, *, default: Any = None, factory: Any = None, omit_none: bool = False):
    """A field with its documentation (the doc table's 'meaning' column)."""
    meta = {"doc": text, _OPTIONAL: omit_none}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Parallel:
    """The parallelism a case asked for."""
    pp: int | None = doc("pipeline stages")
    tp: int | None = doc("tensor-parallel degree")
    dp: int | None = doc("data-parallel degree")
    cp: int | None = doc("context-parallel degree, where a case sets one (InfiniTrain's "
                         "`--context_parallel`)", omit_none=True)
    vpp: int | None = doc("chunks per stage")
    sequence_parallel: bool | None = doc("sequence parallelism on")
    schedule: str | None = doc("the pipeline schedule the trainer chose and ran (when it says)",
                               omit_none=True)


@dataclass
class Reference:
    """The cached reference a case was compared with."""
    key: str | None = doc("the cache key")
    path: str | None = doc("its cache folder")
    built: bool | None = doc("true when this session built it")
    command: list | None = doc("the command that built it")
    topology: dict | None = doc("the trusted topology it ran on (null: one device)")
    golden: str | None = doc("the golden record it came from (harness.reference.golden), or null")
    golden_mismatch: dict | None = doc("how the golden record's environment differs from this "
                                       "one, when it was accepted anyway")


@dataclass
class Logs:
    """Where a run's output went."""
    launcher_stdout: str | None = doc("the launcher's stdout file")
    launcher_stderr: str | None = doc("the launcher's stderr file")
    ranks: dict | None = doc("`{rank: [paths]}`, stdout first")


@dataclass
class Timings:
    """Seconds spent on each phase; a phase the case did not reach is left out."""
    reference_s: float | None = doc("getting the reference (cache hit or build)", omit_none=True)
    lease_wait_s: float | None = doc("waiting for device slots", omit_none=True)
    queue_s: float | None = doc("a scheduler job's time in the queue, submitted to started",
                                omit_none=True)
    run_s: float | None = doc("the launched run alone (a scheduler job: started to ended)",
                              omit_none=True)
    compare_s: float | None = doc("the diff", omit_none=True)
    total_s: float | None = doc("the whole case", omit_none=True)


@dataclass(frozen=True)  # assembled once, from the stages' frozen results (harness.runner.record)
class ResultRecord:
    format: str = doc('`"harness.result/2"` (`/1` records, which lack `trainer` and '
                      '`passthrough_flags`, are still read)', default=RESULT_FORMAT)
    session: str | None = doc("the session folder's name")
    worker: str | None = doc("`main`, or the xdist worker (`gw0`, ...) that ran the case")
    nodeid: str | None = doc("pytest node id, e.g. "
                             "`configs/test_config.json::pipeline_layout/gpt2/pp2-costs-L4.5`")
    name: str | None = doc("`tag/model/id`: the case's stable name (what `-k` matches)")
    tag: str | None = doc("the case's tag (its group in the config)")
    model: str | None = doc("the model family")
    case_id: str | None = doc("the case's id within its tag")
    description: str | None = doc("the case's description from the config")
    status: str | None = doc(
        "`passed`, `failed` (the run crashed, hung or differs from the reference), `skipped` "
        "(e.g. needs more devices than `--gpus`), `error` (a harness-side problem, e.g. the "
        "reference could not be built)")
    reason: str | None = doc("one line: why it failed, errored or was skipped")
    errors: list = doc("the full failure texts (command, log tail, diagnosis), as pytest shows "
                       "them", factory=list)
    world_size: int | None = doc("processes launched: dp x tp x pp")
    parallel: Parallel | None = doc(
        "as the case asked for them; `vpp` is the layout's chunks per stage (a "
        "`--pipeline_chunk_layout` or Megatron string sets it without "
        "`--virtual_pipeline_parallel`); `schedule` is present when the trainer said which "
        "pipeline schedule it ran")
    trainer: str | None = doc("the backend that ran the case: `harness` (the bundled trainer), "
                              "`command`, `infinitrain`")
    flags: dict | None = doc(
        "the flags the run was launched with, less the run's own output paths the harness "
        "sets (`output_dir`, `dump_gradients`, `dump_parameter_updates`, `profile_layers`: "
        "they are in `output_dir` and `command`): the bundled trainer's resolved flags; for "
        "another trainer the case's flags exactly as the config says (checkpoint paths moved "
        "under the session)")
    passthrough_flags: list | None = doc(
        "the case's flags the harness's flag table does not know, passed to the trainer as "
        "written and kept in its reference")
    layout: dict | None = doc(
        "the pipeline layout the run used: `{format, num_layers, pp, vpp, chunks: [[stage, "
        "start, end], ...]}`, chunks in global order, `end` exclusive. A case that did not run "
        "(skipped) or did not record one has the layout its flags resolve to for the model's "
        "depth; null when that cannot be known")
    layout_text: str | None = doc("the same, as the trainer printed it")
    device: str | None = doc("`cuda` or `cpu`")
    devices: list | None = doc("the device slots the case leased (null under a scheduler, "
                               "whose job's devices are its own)")
    job: dict | None = doc("the scheduler job that ran the case (null: a local run): "
                           "`scheduler`, `job_id`, `nodes`, `node_list`, `queue_s`, `run_s`")
    compare: dict | None = doc("`{loss: bool, gradients: bool}`: what was compared")
    tolerances: dict | None = doc(
        "`{loss: {atol, rtol}, gradients: {atol, rtol}}`: a value passes when "
        "`abs(got - ref) <= atol + rtol * abs(ref)`")
    loss: dict | None = doc("the loss diff summary (below), or null")
    gradients: dict | None = doc(
        "the gradient diff summary (below), or null; `{compared: false, reason}` when the "
        "trainer cannot give comparable gradients")
    losses: list | None = doc("loss per step of the run")
    steps: list | None = doc("the step number of each entry of `losses` (a resumed run "
                             "starts at its checkpoint's step + 1); null in older records")
    reference_losses: list | None = doc("loss per step of its single-device reference")
    reference_steps: list | None = doc("the step number of each entry of `reference_losses`; "
                                       "null: the same steps as the run's")
    tokens_per_s: float | None = doc("mean over the steps after the first (the first includes "
                                     "warm-up)")
    peak_memory_mb: float | None = doc("the largest peak over steps")
    step_time_ms: float | None = doc("mean over the steps after the first")
    step_times_ms: list | None = doc("every step after the first, in ms (the report's "
                                     "throughput spread); null in older records")
    reference: Reference | None = doc("the cached reference used")
    self_check: str | None = doc(
        "the self-check's verdict alone (`passed` / `failed`; null where the case was not "
        "judged): the run against the same trainer's single-device reference, \"did "
        "parallelism change the numbers?\". `status` is `failed` when it or the baseline "
        "check failed")
    baseline: dict | None = doc(
        "the baseline check, kept apart from the self-check (\"is the trainer right at "
        "all?\"), null when the session asked for none (`--harness-baseline`): `{source, "
        "status, reason, first_diverging_step, max_abs_diff, loss, losses, steps, note, gradients, "
        "gradients_reason, run}`; "
        "`source` is `pytorch (live)` (the bundled trainer run with the subject's semantics, "
        "harness.baseline) or the recorded log it was read from; `status` `passed`, `failed`, "
        "`skipped` (with the reason: no counterpart, not run) or `error`; `loss` the "
        "per-step comparison (harness.compare.baseline: `{ok, dtype, threshold, steps, "
        "diffs, first_diverging_step, worst_step, max_abs_diff, max_rel_diff, problem, "
        "run_losses, base_losses, resolution}`; a step diverges when its `diffs` entry is over "
        "`step_limit(dtype, base loss, resolution)`: the dtype's threshold, never below the "
        "run's print `resolution`, kept since 2026-12-04 for the report's divergence plot); "
        "`losses` / `steps` the baseline's; "
        "`note` e.g. a Megatron log's corrected step 2; `run` the live run's cache key, "
        "folder, whether this session built it, its command and flags; `gradients` the first "
        "step's gradients against the live baseline's where the case dumped them (the "
        "self-check's `gradients` format, under the bundled trainer's parameter names, "
        "harness.baseline.gradients), else null with `gradients_reason` saying why; "
        "`trace` step 1 module by module against the live baseline (the `trace` field's "
        "format; a divergence fails the check), or why it was not taken")
    trace: dict | None = doc(
        "the module-level trace (`--harness-trace`, harness.runner.trace), null where none "
        "was due: `{status, reason, step, partner, line, first_diverging, last_matched, "
        "modules, unpaired: {run, partner}, thresholds: {atol, rtol, source}, cost: {seconds, "
        "peak_bytes, tensors, bytes_read, kept_bytes, run_s, partner_s}}` (`seconds` the "
        "comparison's, `run_s` / `partner_s` the traced runs' wall time, the partner's ~0 "
        "when a cached baseline trace was reused); `status` `diverged`, `matched`, "
        "`skipped` or `error` (with the reason); `partner` `reference` or `pytorch "
        "baseline`; each module entry `{module, phase, index, rank, order, shape, max_abs, "
        "max_ref, threshold, ratio, ok, pieces, note}` in execution order (max |d| against "
        "atol + rtol * max |partner|; `inf` for a NaN, an Inf or a shape no slice explains)",
        omit_none=True)
    calibration: dict | None = doc(
        "which scale-free thresholds the case was judged with (docs/verdicts.md, "
        "Calibration): `{file, gradients_noise, loss_noise, thresholds: {loss, gradients}, "
        "problem, fp64_ratio}`; `file` is the calibration file used (`<reference cache>/calibration/"
        "<trainer-version>-<device>-<dtype>.json`), null for the dtype's defaults, with the "
        "noise it measured (null then); `problem` says why a calibration file of this trainer "
        "and dtype was not used (another host, trainer build or dtype), else null. "
        "`fp64_ratio`: in a calibration session with the bundled trainer, `{gradients, "
        "gradients_parameter, loss}`: the largest over parameters of ||run - fp64|| / "
        "||ref - fp64|| (fp64: the reference key's float64 run) with that parameter, and the "
        "largest over steps of |run - fp64| / |ref - fp64| for the loss; of order 1 for "
        "another rounding order, orders of magnitude above 1 for a bug; 0 / inf where "
        "ref equals fp64 exactly; null otherwise. Null for a "
        "case that stopped before its thresholds were chosen (skipped, or an error naming "
        "the calibration)")
    command: list | None = doc("the launch command (argv list)")
    returncode: int | None = doc("the launcher's exit code")
    timed_out: bool | None = doc("true when the run was killed at the timeout")
    failing_rank: str | None = doc("the rank that failed first, when known (`\"0\"` for a "
                                   "failed single-process run)")
    logs: Logs | None = doc(
        "every rank of a run that was launched has its files; a single-process run (no "
        "torchrun) lists the launcher's stdout and stderr as rank `\"0\"`. Null for a case "
        "that did not run")
    output_dir: str | None = doc("the case's run folder")
    environment: dict | None = doc(
        "from the run: `{torch, cuda, python, platform, host, device_name, world_size, mesh: "
        "{pp, dp, tp}}`")
    timings: Timings | None = doc("seconds", factory=Timings)
    dumps: dict | None = doc(
        "what happened to the run's gradient dump after the diff: `{policy, kept, bytes, "
        "removed_bytes}`; `policy` is `--harness-keep-dumps` (`failed`: a passing case's dump "
        "is removed, `all`, `none`), `bytes` the dump's size before; null for a case that was "
        "not diffed")
    disk_bytes: int | None = doc("bytes the case's run folder holds after that (what the "
                                 "session keeps of it); null for a case that was not diffed")
    started_at: str | None = doc("local time, `YYYY-mm-ddTHH:MM:SS+zzzz`")
    finished_at: str | None = doc("local time, `YYYY-mm-ddTHH:MM:SS+zzzz`")

    def to_json(self) -> dict:
        """The record as written: a dict with every key of FIELDS, in order, JSON-safe."""
        return {f.name: _clean(_dump(getattr(self, f.name)))
                for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict, where: str = "record") -> ResultRecord:
        """A /1 or /2 record back as a ResultRecord; a missing key is null (a /1 record has no
        `trainer`), an unknown key a ValueError naming it and `where`."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a result record is a JSON object, not "
                             f"{type(data).__name__}")
        if data.get("format") not in READABLE_FORMATS:
            raise ValueError(f"{where}: format {data.get('format')!r}, expected "
                             f"{RESULT_FORMAT!r}")
        return _load(cls, data, where, "")


def _dump(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _dump(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not (f.metadata.get(_OPTIONAL) and getattr(value, f.name) is None)}
    return value


def _clean(value: Any) -> Any:
    """JSON-safe: NaN / inf as strings, paths as strings, tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _nested(cls: type) -> dict[str, type]:
    """Field name -> nested dataclass type, for the fields that hold one."""
    types = {}
    for f in dataclasses.fields(cls):
        hint = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        head = hint.split("|")[0].strip()
        if head in _PARTS:
            types[f.name] = _PARTS[head]
    return types


def _load(cls: type, data: dict, where: str, prefix: str):
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise ValueError(f"{where}: unknown key {prefix + str(key)!r} in a "
                             f"{RESULT_FORMAT} record")
    nested = _nested(cls)
    values = {}
    for key, value in data.items():
        if key in nested and value is not None:
            if not isinstance(value, dict):
                raise ValueError(f"{where}: {prefix + key!r} is a JSON object or null, not "
                                 f"{type(value).__name__}")
            value = _load(nested[key], value, where, f"{prefix}{key}.")
        values[key] = value
    return cls(**values)


_PARTS = {c.__name__: c for c in (Parallel, Reference, Logs, Timings)}

FIELDS = tuple(f.name for f in dataclasses.fields(ResultRecord))


# ---------------------------------------------------------------------- the doc table

WRITE_DOC = 'python -c "from harness.results.result_record import write_doc; write_doc()"'
DOC_BEGIN = ("<!-- result-record-fields: generated from harness/results/result_record.py; "
             "edit it there, then rewrite this with: " + WRITE_DOC + " -->")
DOC_END = "<!-- end of result-record-fields -->"
DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "results_format.md"


def doc_table() -> list[str]:
    """The key table of docs/results_format.md, from the fields' `doc` metadata; a nested part's
    keys are listed with their meanings after its own."""
    lines = ["| key | meaning |", "| --- | --- |"]
    nested = _nested(ResultRecord)
    for f in dataclasses.fields(ResultRecord):
        text = f.metadata["doc"]
        if f.name in nested:
            parts = "; ".join(
                f"`{p.name}`{' (when known)' if p.metadata.get(_OPTIONAL) else ''}: "
                f"{p.metadata['doc']}" for p in dataclasses.fields(nested[f.name]))
            keys = ", ".join(p.name for p in dataclasses.fields(nested[f.name]))
            text = f"`{{{keys}}}`: {text} ({parts})"
        lines.append(f"| `{f.name}` | {text.replace('|', chr(92) + '|')} |")
    return lines


def doc_block() -> str:
    return "\n".join([DOC_BEGIN, "", *doc_table(), "", DOC_END])


def documented_block(text: str) -> str | None:
    """The generated block as it stands in the doc's text (None when the markers are missing)."""
    start, end = text.find(DOC_BEGIN.split(":")[0]), text.find(DOC_END)
    if start < 0 or end < start:
        return None
    return text[start:end + len(DOC_END)]


def write_doc(path: Path = DOC_PATH) -> bool:
    """Rewrite the generated block of the doc; True when it changed."""
    text = path.read_text()
    old = documented_block(text)
    if old is None:
        raise ValueError(f"{path}: no {DOC_BEGIN!r} ... {DOC_END!r} block")
    new = text.replace(old, doc_block())
    if new != text:
        path.write_text(new)
    return new != text

