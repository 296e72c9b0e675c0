"""Pairing: descriptive PyTorch section names to InfiniTrain's case ids (never guessed: a cited
table, or a `--pairing FILE`), then baseline runs with subject runs by (model, case, tag)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .readers import DESCRIPTIVE_MODELS, SCRIPT_MODELS, BadInput, Reading, RecordedRun, dtype_of

# Where each row comes from. The descriptive names are in InfiniTrain-Test's
# baseline/pytorch/logs/202511_a800/result_pytorch.log (commit b09e9d3); the script that printed
# them is not public, but each name states the command's flags, and the id-style script that
# replaced it, baseline/pytorch/scripts/run_pytorch_training.sh (commit 143d981), runs those flags
# under the case ids of InfiniTrain's scripts/test_config.json (`basic`: 1 = defaults, 2 =
# --batch_size 80 --total_batch_size 5120, 3 = 8 processes --batch_size 10 --total_batch_size
# 5120; `_bfloat16` = --dtype bfloat16). The log's own lines agree: "total desired batch size:
# 256" in the default-batch sections, 5120 in the others, torchrun's warnings in the 8-GPU ones.
_SCRIPT = "InfiniTrain-Test baseline/pytorch/scripts/run_pytorch_training.sh@143d981"
_CONFIG = "InfiniTrain scripts/test_config.json `basic`"
_FLAGS = {
    "Single GPU, default batch": ("1", f"{_SCRIPT}: `{{script}} --dtype D` is case 1; "
                                       f"{_CONFIG} id 1 has only dtype"),
    "Single GPU, total_batch_size 5120": ("2", f"{_SCRIPT}: `{{script}} --batch_size 80 "
                                               "--total_batch_size 5120` is case 2; "
                                               f"{_CONFIG} id 2"),
    "8 GPUs, total_batch_size 5120": ("3", f"{_SCRIPT}: `torchrun --nproc_per_node=8 "
                                           "{script} --batch_size 10 --total_batch_size 5120` "
                                           f"is case 3; {_CONFIG} id 3 (nthread_per_process 8)"),
}
_SCRIPTS = {model: script for script, model in SCRIPT_MODELS.items()}
_MODELS = {label: (model, _SCRIPTS[model]) for label, model in DESCRIPTIVE_MODELS.items()}


@dataclass(frozen=True)
class Mapping:
    """A descriptive section name -> InfiniTrain's (model, case), and where that comes from."""

    section: str
    model: str
    case: str
    source: str


def _table() -> tuple[Mapping, ...]:
    rows = []
    for label, (model, script) in _MODELS.items():
        for flags, (case, source) in _FLAGS.items():
            for dtype, suffix in (("fp32", ""), ("bf16", "_bfloat16")):
                rows.append(Mapping(f"{label} ({flags}, {dtype})", model, case + suffix,
                                    source.format(script=script)
                                    + (" with --dtype bfloat16" if suffix else "")))
    return tuple(rows)


DESCRIPTIVE: tuple[Mapping, ...] = _table()
_BY_SECTION = {m.section: m for m in DESCRIPTIVE}


def read_pairing(path: str | Path) -> dict[str, tuple[str, str]]:
    """A --pairing file: `{"<section or file name>": "<model>_<case>"}`. A bad file is a
    ValueError naming it and what was expected."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}; expected a JSON object "
                         '{"<section or file name>": "<model>_<case>"}') from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON {type(data).__name__}; expected an object "
                         '{"<section or file name>": "<model>_<case>"}')
    out = {}
    for key, value in data.items():
        model, _, case = str(value).partition("_")
        if not isinstance(value, str) or not model or not case:
            raise ValueError(f"{path}: {key!r}: {value!r}; expected \"<model>_<case>\" "
                             "(gpt2_1_bfloat16)")
        out[key] = (model, case)
    return out


def resolve(run: RecordedRun, pairing: dict[str, tuple[str, str]]) -> RecordedRun | BadInput:
    """The run with its (model, case) from the pairing file or the cited table; a mapping that
    names another model or dtype than the section or file says is a bad input."""
    file = Path(run.meta.get("file", run.source)).name
    section = run.section
    if section is not None and section in pairing:
        (model, case), how = pairing[section], "--pairing"
    elif file in pairing and section is None:
        (model, case), how = pairing[file], "--pairing"
    elif run.case is None and section in _BY_SECTION:
        row = _BY_SECTION[section]
        model, case, how = row.model, row.case, f"table: {row.source}"
    else:
        return run
    if model != run.model or dtype_of(case) != run.dtype:
        return BadInput(run.source, f"{run.source}: paired ({how}) with {model}_{case}, a run of "
                                    f"{model} {dtype_of(case)}; expected {run.model} "
                                    f"{run.dtype} as the log says", model, case, run.tag)
    return replace(run, model=model, case=case,
                   meta={**run.meta, "paired_by": how})


def resolved(reading: Reading, pairing: dict[str, tuple[str, str]]) -> Reading:
    """Every run of `reading` resolved (`resolve`); a mapping that cannot hold joins the bad
    inputs. The log tool and the session's recorded baseline read a folder through this."""
    runs, bad = [], list(reading.bad)
    for run in reading.runs:
        got = resolve(run, pairing)
        (bad if isinstance(got, BadInput) else runs).append(got)
    return Reading(tuple(runs), tuple(bad))
