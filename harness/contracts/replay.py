"""A module replay's record: per module call and phase, how far the subject's recorded tensor
is from the partner module run on the subject's own inputs in float64, and how far the
partner's own run in the subject's dtype is (its floor). Written by the bundled trainer's replay
(harness.trainer.replay), judged by harness.compare.blame. No torch, no numpy.

One JSON object per line, in the subject's execution order (its forward, then its backward):

    {"module": "h.3.ln_2", "phase": "backward", "index": 0, "order": 41, "shape": [2, 64, 24],
     "subject_error": 7.8e-07, "floor_error": 5.9e-08, "scale": 3.3e-03,
     "consumers": ["h.3.mlp", "h.3.mlp.c_fc"], "note": null, "inputs": [], "inline": false}

`subject_error` is max |subject - float64 replay|, `floor_error` max |dtype replay - float64
replay|, `scale` max |float64 replay|. For a forward row the replayed tensor is the module's
output on the subject's inputs; for a backward row it is the gradient of the module's output as
its consumers' backward wrote it from the subject's own gradients (`consumers`: the modules
whose inputs that output feeds, innermost first; inline code such as a residual sum is the
enclosing module's). A forward row's `inputs` are the recorded outputs its input was built from
(`inline`: through the model's own code between modules, such as the attention core between
c_attn and c_proj). `note` says why a row was not replayed (its errors are then null).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .trace import PHASES

REPLAY_FILE = "replay.jsonl"


class ReplayRecordError(ValueError):
    """A replay record that is not one: one line naming the file, the line and the field."""


@dataclass(frozen=True)
class ReplayRow:
    module: str  # the partner's (bundled trainer's) name
    phase: str  # forward | backward
    index: int  # the call: how often (module, phase) was recorded before in the step
    order: int  # position in the subject's execution order
    shape: tuple[int, ...]
    subject_error: float | None = None
    floor_error: float | None = None
    scale: float | None = None
    consumers: tuple[str, ...] = ()
    note: str | None = None  # why it was not replayed
    # forward: the recorded outputs its input was built from, and whether inline code (a
    # residual sum, the attention core) lay between them and the module
    inputs: tuple[str, ...] = ()
    inline: bool = False

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"{self.module}: phase {self.phase!r}; expected one of "
                             f"{', '.join(PHASES)}")
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise ValueError(f"{self.module}: index {self.index!r}; expected an integer >= 0")
        numbers = (self.subject_error, self.floor_error, self.scale)
        if self.note is None:
            for name, value in zip(("subject_error", "floor_error", "scale"), numbers):
                if isinstance(value, bool) or not isinstance(value, (int, float)) \
                        or (value < 0 and not math.isnan(value)):
                    raise ValueError(f"{self.module} {self.phase}: {name} {value!r}; expected "
                                     f"a number >= 0 (or a note saying why there is none)")
        elif any(value is not None for value in numbers):
            raise ValueError(f"{self.module} {self.phase}: not replayed ({self.note}) but "
                             f"carries errors; expected none")

    @property
    def label(self) -> str:
        return f"{self.module} {self.phase}" + (f"#{self.index}" if self.index else "")

    def to_dict(self) -> dict:
        return {"module": self.module, "phase": self.phase, "index": self.index,
                "order": self.order, "shape": list(self.shape),
                "subject_error": self.subject_error, "floor_error": self.floor_error,
                "scale": self.scale, "consumers": list(self.consumers), "note": self.note,
                "inputs": list(self.inputs), "inline": self.inline}

    @classmethod
    def from_dict(cls, data: dict) -> "ReplayRow":
        expected = {"module", "phase", "index", "order", "shape", "subject_error",
                    "floor_error", "scale", "consumers", "note", "inputs", "inline"}
        unknown = sorted(set(data) - expected)
        missing = sorted(expected - set(data))
        if unknown or missing:
            raise ValueError(f"keys {unknown or ''} unknown, {missing or ''} missing; expected "
                             f"{', '.join(sorted(expected))}")
        return cls(module=str(data["module"]), phase=data["phase"], index=data["index"],
                   order=int(data["order"]), shape=tuple(int(d) for d in data["shape"]),
                   subject_error=data["subject_error"], floor_error=data["floor_error"],
                   scale=data["scale"],
                   consumers=tuple(str(c) for c in data["consumers"]), note=data["note"],
                   inputs=tuple(str(i) for i in data["inputs"]), inline=bool(data["inline"]))


def write_replay(path: str | Path, rows) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as stream:
        for row in rows:
            stream.write(json.dumps(row.to_dict(), allow_nan=True) + "\n")
    return path


def read_replay(path: str | Path) -> tuple[ReplayRow, ...]:
    """The rows of a replay record, or ReplayRecordError naming the file and the line."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise ReplayRecordError(f"{path}: cannot read the replay record: "
                                f"{error.strerror or error}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(ReplayRow.from_dict(json.loads(line)))
        except (ValueError, TypeError, KeyError) as error:
            raise ReplayRecordError(f"{path}:{number}: {error}") from None
    return tuple(rows)
