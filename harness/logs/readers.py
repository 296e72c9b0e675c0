"""The readers, one per kind of recorded log, each to RecordedRun; what cannot be read is a
BadInput (one line naming the file and what was expected), never dropped.

    result_pytorch*.log                 PyTorch baseline: `Running: gpt2_1 (fp32)` sections,
                                        `Running: train_gpt2.py / 5_linear_tp4_sp_distopt`
                                        (script / case id), or descriptive ones (case None,
                                        paired in pairing.py)
    result_megatron_training_<m>.log    Megatron: `Running: llama3_1 (float32)` sections; its
                                        step 2 is the mean of iterations 1-2, so 2*L2 - L1
    result_megatron_<m>.log             Megatron runs that print InfiniTrain's step lines
                                        (`Running: tiny_mixtral_1 (float32)`), one loss a step
    <model>_<case>.log                  an InfiniTrain run's log (flat, or under logs/<tag>/
                                        with a run_metadata.log)
    results.jsonl                       the harness's own session folder (no lr recorded)

Every step line's learning rate is read beside its loss (`| lr 1.00e-05 |`, Megatron's
`learning rate: 1.000000E-05 |`), with its print resolution (harness.compare.baseline.
printed_resolution), into RecordedRun.lrs / lr_resolutions; a log that prints none has none.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from harness.compare.baseline import printed_resolution
from harness.contracts.programs import PROGRAMS
from harness.results import read_results

STEP = re.compile(r"\bstep\s+(\d+)/\s*\d+\s*\|\s*train loss\s+(\S+)")
ITERATION = re.compile(r"\biteration\s+(\d+)/\s*\d+\s*\|.*?\blm loss:\s*(\S+)")
# The lr on a step line: InfiniTrain's `| lr {:.2e} |` (master@b24d92f:example/gpt2/main.cc:493,
# PyTorch's and tiny_mixtral's alike), Megatron's `learning rate: {:.6E} |`.
STEP_LR = re.compile(r"\|\s*lr\s+([^\s|]+)")
ITERATION_LR = re.compile(r"\blearning rate:\s*([^\s|]+)")
SECTION = re.compile(r"^Running:\s*(.+?)\s*$")
# An id-style section (or a log's stem): model, then the case (`gpt2_1_bfloat16`). The model is
# one of InfiniTrain's programs where the name starts with one (`tiny_mixtral_1`:
# harness/contracts/data/infinitrain_programs.json), else its first word.
ID_NAME = re.compile(r"^([a-z][a-z0-9.]*?)_([A-Za-z0-9][\w.]*)$")
CASE_ID = re.compile(r"[A-Za-z0-9][\w.]*")
# A script-style PyTorch section, `Running: train_gpt2.py / 5_linear_tp4_sp_distopt`
# (InfiniTrain-Test baseline/pytorch/scripts/run_pytorch_training_lr_scheduler.sh@2ba71fe:
# `echo "Running: ${training_script} / ${case_id}"` over TRAINING_SCRIPTS), the case id being
# InfiniTrain's test_config.json id of the lr_scheduler tag.
SCRIPT_SECTION = re.compile(r"^(\S+\.py)\s*/\s*([A-Za-z0-9][\w.]*)$")
METADATA_KEYS = {"RUN_STARTED_AT": "run_started_at", "GIT_BRANCH": "git_branch",
                 "GIT_COMMIT": "git_commit", "CONFIG_FILE": "config_file"}
# The model a descriptive PyTorch section speaks of (`GPT-2 (Single GPU, ...)`): InfiniTrain-Test's
# train_gpt2.py and train_llama3.2_1B.py are InfiniTrain's gpt2 and llama3 examples.
DESCRIPTIVE_MODELS = {"GPT-2": "gpt2", "LLaMA3_2": "llama3"}
SCRIPT_MODELS = {"train_gpt2.py": "gpt2", "train_llama3.2_1B.py": "llama3"}
MEGATRON_NOTE = ("step 2 := 2*L2 - L1 (Megatron logs the mean of iterations 1-2 as "
                 "iteration 2)")


@dataclass(frozen=True)
class RecordedRun:
    """One run's losses per step, as a log recorded them."""

    kind: str  # pytorch, megatron, infinitrain, harness
    model: str
    case: str | None  # None: a descriptive section name, not yet paired
    dtype: str
    steps: tuple[int, ...]
    losses: tuple[float, ...]
    source: str  # the file, and the section when there is one
    tag: str | None = None
    note: str | None = None
    meta: dict = field(default_factory=dict, compare=False)
    # The lr each step printed (NaN where a step line printed none) and one unit in its last
    # printed place (None for an lr that is not a number); both empty when the log prints no lr.
    lrs: tuple[float, ...] = ()
    lr_resolutions: tuple[float | None, ...] = ()

    @property
    def section(self) -> str | None:
        return self.meta.get("section")

    @property
    def key(self) -> tuple[str, str | None]:
        return self.model, self.case

    @property
    def label(self) -> str:
        return f"{self.model}/{self.case}" if self.case else f"{self.model}/?"


@dataclass(frozen=True)
class BadInput:
    """A log, section or record that could not be read; model/case when they are known."""

    source: str
    message: str  # names the file and what was expected
    model: str | None = None
    case: str | None = None
    tag: str | None = None


@dataclass(frozen=True)
class Reading:
    runs: tuple[RecordedRun, ...]
    bad: tuple[BadInput, ...]

    def __add__(self, other: "Reading") -> "Reading":
        return Reading(self.runs + other.runs, self.bad + other.bad)


def dtype_of(name: str) -> str:
    """bfloat16 when a case or section name says bfloat16/bf16, else float32."""
    return "bfloat16" if re.search(r"bfloat16|bf16", name, re.I) else "float32"


def _float(text: str) -> float:
    try:
        return float(text.rstrip(",;|"))
    except ValueError:
        return math.nan


def _steps(lines: Iterable[str], pattern: re.Pattern,
           lr_pattern: re.Pattern = STEP_LR) -> list[tuple[int, float, str | None]]:
    """(step, loss, the lr as printed or None) of each step line."""
    out = []
    for line in lines:
        m = pattern.search(line)
        if m:
            lr = lr_pattern.search(line)
            out.append((int(m.group(1)), _float(m.group(2)), lr.group(1) if lr else None))
    return out


def _lr_column(steps: list[tuple[int, float, str | None]]) -> dict:
    """RecordedRun's lrs and lr_resolutions of the step lines: none when no line printed an
    lr; else one a step, NaN (resolution None) where a line printed none."""
    if all(text is None for _, _, text in steps):
        return {}
    return {"lrs": tuple(math.nan if t is None else _float(t) for _, _, t in steps),
            "lr_resolutions": tuple(None if t is None else printed_resolution(t.rstrip(",;"))
                                    for _, _, t in steps)}


def _checked(pairs: list[tuple[int, float, str | None]], source: str, what: str) -> str | None:
    """The problem with a run's (step, loss, lr) lines, or None."""
    if not pairs:
        return f"{source}: no {what} lines; expected one per step"
    seen: set[int] = set()
    for step, *_ in pairs:
        if step in seen:
            return f"{source}: step {step} appears twice; expected each step once"
        seen.add(step)
    return None


def _sections(path: Path) -> list[tuple[str, list[str]]]:
    """(section name, its lines) for each `Running: ...` section of a baseline log."""
    sections: list[tuple[str, list[str]]] = []
    for line in path.read_text(errors="replace").splitlines():
        m = SECTION.match(line)
        if m:
            sections.append((m.group(1), []))
        elif sections:
            sections[-1][1].append(line)
    return sections


def split_id(name: str) -> tuple[str, str] | None:
    """(model, case) of an id-style name (`gpt2_1_bfloat16`, `tiny_mixtral_2`), else None: the
    longest InfiniTrain program the name starts with, else its first word."""
    for program in sorted(PROGRAMS, key=len, reverse=True):
        rest = name.removeprefix(program + "_")
        if rest != name and CASE_ID.fullmatch(rest):
            return program, rest
    m = ID_NAME.match(name)
    return (m.group(1), m.group(2)) if m else None


def _section_name(name: str) -> tuple[str, str, str] | None:
    """(model, case, dtype) of an id-style section (`gpt2_3 (fp32, 8 GPUs)`), else None."""
    head, _, rest = name.partition(" ")
    parsed = split_id(head)
    if not parsed or (rest and not (rest.startswith("(") and rest.endswith(")"))):
        return None
    return *parsed, dtype_of(name)


def descriptive_model(name: str) -> str:
    """The model a descriptive section name speaks of (`GPT-2 (...)` -> gpt2), else the name's
    first word, lower-cased and letters and digits only."""
    head = name.partition(" (")[0]
    return DESCRIPTIVE_MODELS.get(head) or re.sub(r"[^a-z0-9]", "", head.lower()) or "unknown"


def _script_section(name: str, source: str) -> tuple[str, str, str] | BadInput | None:
    """(model, case, dtype) of a script-style section (`train_gpt2.py / 3_none_zero2`), a
    BadInput for a script that is none of SCRIPT_MODELS, else None."""
    m = SCRIPT_SECTION.match(name)
    if not m:
        return None
    script, case = m.groups()
    if script not in SCRIPT_MODELS:
        return BadInput(source, f"{source}: script {script!r}; expected one of "
                                f"{', '.join(SCRIPT_MODELS)} (InfiniTrain's "
                                f"{', '.join(SCRIPT_MODELS.values())})", None, case)
    return SCRIPT_MODELS[script], case, dtype_of(case)


def read_pytorch(path: Path) -> Reading:
    """A PyTorch baseline log: one run per `Running:` section, id-style (`gpt2_1 (fp32)`) or
    script-style (`train_gpt2.py / 3_none_zero2`); a descriptive section name
    (`GPT-2 (Single GPU, default batch, fp32)`) keeps case None for pairing.py."""
    runs, bad = [], []
    sections = _sections(path)
    if not sections:
        bad.append(BadInput(str(path), f"{path}: no `Running: <model>_<case>` section; "
                                       "expected a PyTorch baseline log"))
    for name, lines in sections:
        source = f"{path} [{name}]"
        parsed = _section_name(name) or _script_section(name, source)
        if isinstance(parsed, BadInput):
            bad.append(parsed)
            continue
        if parsed:
            model, case, dtype = parsed
        else:
            model, case, dtype = descriptive_model(name), None, dtype_of(name)
        pairs = _steps(lines, STEP)
        problem = _checked(pairs, source, "`step N/M | train loss X`")
        if problem:
            bad.append(BadInput(source, problem, model, case))
            continue
        runs.append(RecordedRun("pytorch", model, case, dtype, tuple(p[0] for p in pairs),
                                tuple(p[1] for p in pairs), source,
                                note=None if case else "descriptive section name",
                                meta={"section": name, "file": str(path)}, **_lr_column(pairs)))
    return Reading(tuple(runs), tuple(bad))


def read_megatron_steps(path: Path) -> Reading:
    """A Megatron log that prints InfiniTrain's step lines, one loss a step (no running mean:
    InfiniTrain-Test baseline/megatron/scripts/train_megatron_tiny_mixtral.py@db67c7b prints
    `step {step+1:4d}/{N} | train loss {loss_value:.6f} | norm -1.0000 | lr {lr:.2e}` for
    each step), under id-style sections (`Running: tiny_mixtral_1 (float32)`, its
    run_megatron_tiny_mixtral.sh)."""
    runs, bad = [], []
    sections = _sections(path)
    if not sections:
        bad.append(BadInput(str(path), f"{path}: no `Running: <model>_<case> (<dtype>)` "
                                       "section; expected a Megatron log"))
    for name, lines in sections:
        source = f"{path} [{name}]"
        parsed = _section_name(name)
        if not parsed:
            bad.append(BadInput(source, f"{source}: section name {name!r}; expected "
                                        "`<model>_<case> (<dtype>)`"))
            continue
        model, case, dtype = parsed
        pairs = _steps(lines, STEP)
        problem = _checked(pairs, source, "`step N/M | train loss X`")
        if problem:
            bad.append(BadInput(source, problem, model, case))
            continue
        runs.append(RecordedRun("megatron", model, case, dtype, tuple(p[0] for p in pairs),
                                tuple(p[1] for p in pairs), source,
                                meta={"section": name, "file": str(path)}, **_lr_column(pairs)))
    return Reading(tuple(runs), tuple(bad))


def read_megatron(path: Path) -> Reading:
    """A Megatron baseline log, step 2 corrected (MEGATRON_NOTE); a section without iteration
    1 cannot be corrected and is a bad input."""
    file_model = path.stem.removeprefix("result_megatron_training_")
    runs, bad = [], []
    sections = _sections(path)
    if not sections:
        bad.append(BadInput(str(path), f"{path}: no `Running: <model>_<case> (<dtype>)` "
                                       "section; expected a Megatron baseline log"))
    for name, lines in sections:
        source = f"{path} [{name}]"
        parsed = _section_name(name)
        if not parsed:
            bad.append(BadInput(source, f"{source}: section name {name!r}; expected "
                                        "`<model>_<case> (<dtype>)`", file_model))
            continue
        model, case, dtype = parsed
        if model != file_model:
            bad.append(BadInput(source, f"{source}: section of model {model!r} in the log of "
                                        f"{file_model!r}; expected {file_model}", model, case))
            continue
        pairs = _steps(lines, ITERATION, ITERATION_LR)
        problem = _checked(pairs, source, "`iteration N/M | ... | lm loss: X`")
        losses = {step: loss for step, loss, _ in pairs}
        if not problem and 2 in losses and 1 not in losses:
            problem = (f"{source}: iteration 2 but no iteration 1; expected iteration 1 to "
                       "correct step 2 (Megatron logs the mean of iterations 1-2)")
        if problem:
            bad.append(BadInput(source, problem, model, case))
            continue
        note = None
        if 2 in losses:
            losses[2] = 2 * losses[2] - losses[1]
            note = MEGATRON_NOTE
        steps = tuple(p[0] for p in pairs)
        runs.append(RecordedRun("megatron", model, case, dtype, steps,
                                tuple(losses[s] for s in steps), source, note=note,
                                meta={"section": name, "file": str(path)}, **_lr_column(pairs)))
    return Reading(tuple(runs), tuple(bad))


def read_run_metadata(path: Path) -> dict:
    """`[RUN_STARTED_AT] ...` lines of an InfiniTrain run_metadata.log, as meta keys (read as
    a log's own header lines are, `_header`)."""
    meta = _header(path.read_text(errors="replace").splitlines())
    meta.pop("command", None)
    return meta


def _metadata_near(path: Path) -> tuple[dict, Path | None]:
    for folder in list(path.parents)[:3]:
        candidate = folder / "run_metadata.log"
        if candidate.is_file():
            return read_run_metadata(candidate), candidate
    return {}, None


# What an InfiniTrain step line says of its own placement, after the timings:
# `(805.57 ms | 6356 tok/s | ..., DP=2, TP=4, SP=4, PP=1)` (master@b24d92f:example/gpt2/main.cc:493;
# feat/context_parallel adds `CP=`): read where a log has no [COMMAND] line.
STEP_TOPOLOGY = re.compile(r"\b(DP|TP|SP|CP|PP)=(\d+)")
PLANNED_STEPS = re.compile(r"\bstep\s+\d+/\s*(\d+)\s*\|")
_HEADER = re.compile(r"^\[(\w+)\]\s*(.*?)\s*$")


def _header(lines: list[str]) -> dict:
    """The `[KEY] value` lines before a log's first step line: its metadata (METADATA_KEYS)
    and its `[COMMAND]`."""
    meta = {}
    for line in lines:
        m = _HEADER.match(line)
        if m is None:
            if STEP.search(line):
                break
            continue
        key, value = m.groups()
        if key in METADATA_KEYS:
            meta[METADATA_KEYS[key]] = value
        elif key == "COMMAND" and "command" not in meta:
            meta["command"] = value
    return meta


def read_infinitrain(path: Path) -> Reading:
    """An InfiniTrain log `<model>_<case>.log` (case `1`, `1_bfloat16`, ...); under
    `logs/<tag>/` (or beside a run_metadata.log) the folder is the tag. Its meta holds the
    `[COMMAND]` line (`command`, read by harness.logs.command_line), the `[GIT_*]` /
    `[RUN_STARTED_AT]` lines before it (a run_metadata.log's keys, which it overrides), the
    steps its step lines announce (`planned_steps`, the M of `step N/M`) and the placement its
    last step line prints (`step_topology`)."""
    parsed = split_id(path.stem)
    if not parsed:
        return Reading((), (BadInput(str(path), f"{path}: file name; expected "
                                                "`<model>_<case>.log`"),))
    model, case = parsed
    meta, metadata = _metadata_near(path)
    # logs/<tag>/<model>_<case>.log: the folder is the tag (older runs have no metadata)
    tag = path.parent.name if path.parent.name != "logs" and (
        metadata is not None or path.parent.parent.name == "logs") else None
    lines = path.read_text(errors="replace").splitlines()
    meta = {**meta, **_header(lines), "file": str(path)}
    if metadata is not None:
        meta["run_metadata"] = str(metadata)
    step_lines = [line for line in lines if STEP.search(line)]
    pairs = _steps(step_lines, STEP)
    problem = _checked(pairs, str(path), "`step N/M | train loss X`")
    if problem:
        return Reading((), (BadInput(str(path), problem, model, case, tag),))
    planned = PLANNED_STEPS.search(step_lines[-1])
    if planned:
        meta["planned_steps"] = int(planned.group(1))
    topology = dict(STEP_TOPOLOGY.findall(step_lines[-1]))
    if topology:
        meta["step_topology"] = {k: int(v) for k, v in topology.items()}
    return Reading((RecordedRun("infinitrain", model, case, dtype_of(case),
                                tuple(p[0] for p in pairs), tuple(p[1] for p in pairs),
                                str(path), tag=tag, meta=meta, **_lr_column(pairs)),), ())


def read_session(path: Path) -> Reading:
    """A harness session's results.jsonl: one run per record with losses."""
    try:
        records = read_results(path)
    except (OSError, ValueError) as e:
        said = str(e) if str(path) in str(e) else f"{path}: {e}"
        return Reading((), (BadInput(str(path), f"{said}; expected the harness's results.jsonl "
                                                "records"),))
    runs, bad = [], []
    for i, record in enumerate(records, 1):
        name = record.get("name") or f"record {i}"
        source = f"{path} [{name}]"
        model, case, tag = record.get("model"), record.get("case_id"), record.get("tag")
        if not model or not case:
            bad.append(BadInput(source, f"{source}: no model or case_id; expected both"))
            continue
        losses, steps = record.get("losses") or [], record.get("steps")
        steps = list(steps) if steps else list(range(1, len(losses) + 1))
        if not losses:
            bad.append(BadInput(source, f"{source}: no losses (status "
                                        f"{record.get('status')}); expected a loss per step",
                                model, case, tag))
            continue
        if len(steps) != len(losses) or len(set(steps)) != len(steps):
            bad.append(BadInput(source, f"{source}: {len(steps)} steps for {len(losses)} "
                                        "losses; expected one loss per distinct step",
                                model, case, tag))
            continue
        dtype = (record.get("flags") or {}).get("dtype") or dtype_of(case)
        runs.append(RecordedRun("harness", model, case, dtype, tuple(map(int, steps)),
                                tuple(math.nan if x is None else float(x) for x in losses),
                                source, tag=tag,
                                meta={"file": str(path), "status": record.get("status"),
                                      "session": record.get("session")}))
    return Reading(tuple(runs), tuple(bad))


def kind_of(path: Path) -> str | None:
    """Which reader a file is for, or None when it is none of ours."""
    name = path.name
    if name == "results.jsonl":
        return "harness"
    if name.startswith("result_pytorch") and name.endswith(".log"):
        return "pytorch"
    if name.startswith("result_megatron_training_") and name.endswith(".log"):
        return "megatron"
    if name.startswith("result_megatron_") and name.endswith(".log"):
        return "megatron_steps"
    # InfiniTrain-Test keeps each build's output beside the runs as build_<n>.log: no run
    if (name.endswith(".log") and name != "run_metadata.log" and "profile" not in name
            and not name.startswith(("result_", "build_")) and ID_NAME.match(path.stem)):
        return "infinitrain"
    return None


READERS = {"pytorch": read_pytorch, "megatron": read_megatron,
           "megatron_steps": read_megatron_steps, "infinitrain": read_infinitrain,
           "harness": read_session}


def read_paths(paths: Iterable[str | Path]) -> Reading:
    """Every recorded run under the paths (files, or folders searched recursively for any
    mix of kinds). A path that is not there, or holds no recorded run, is a
    FileNotFoundError."""
    runs: list[RecordedRun] = []
    bad: list[BadInput] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder; expected a log file or a "
                                    "folder of logs")
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found = False
        for file in files:
            kind = kind_of(file)
            if kind is None:
                continue
            found = True
            try:
                read = READERS[kind](file)
            except OSError as e:
                read = Reading((), (BadInput(str(file), f"{file}: unreadable ({e}); expected a "
                                                        f"{kind} log"),))
            runs += read.runs
            bad += read.bad
        if not found:
            raise FileNotFoundError(f"{path}: no recorded run; expected at least one of "
                                    "result_pytorch*.log, result_megatron_training_<model>.log, "
                                    "result_megatron_<model>.log, <model>_<case>.log, "
                                    "results.jsonl")
    return Reading(tuple(runs), tuple(bad))
