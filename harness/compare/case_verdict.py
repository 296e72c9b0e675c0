"""A case's verdict: its loss, gradient and parameter-update comparisons as one object.

`judge` makes every comparison a case asks for; `CaseVerdict.ok` is the verdict, `lines()` the
failure text (harness.compare.render), `record()` the result record's `loss` / `gradients`
fields, which the markdown report reads. One place decides, so no comparison can drop out
without the verdict saying so: parameter updates asked for, with no reference updates to
compare them with, fail the case with the reason (they used to be skipped in silence); a run
that wrote no updates fails with every parameter `missing`, as a missing gradient does, and the
record and the failure text say the run wrote none (`updates_unwritten`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .diff import GradientDiff, LossDiff, compare_gradients, compare_losses, gradient_names
from .locate import Locator
from .render import gradient_lines, loss_lines


@dataclass(frozen=True)
class UpdatesRequest:
    """The run dumped every parameter's change over the run to `got`; the reference's are
    expected in `ref`, compared with the scale-free `relative` and per-element `resolution`."""
    got: Path
    ref: Path
    relative: float
    resolution: float


@dataclass(frozen=True)
class CaseVerdict:
    loss: LossDiff | None  # None: the case compares no loss
    gradients: GradientDiff | None  # None: none compared (not asked, or not comparable)
    updates: GradientDiff | None
    updates_missing: str | None = None  # why updates asked for could not be compared
    updates_unwritten: str | None = None  # the run wrote no updates: every parameter missing

    @property
    def ok(self) -> bool:
        return all(diff.ok for diff in (self.loss, self.gradients, self.updates)
                   if diff is not None) and self.updates_missing is None

    def lines(self) -> list[str]:
        lines = loss_lines(self.loss) if self.loss is not None else []
        if self.gradients is not None:
            lines += gradient_lines(self.gradients)
        if self.updates is not None:
            lines += [line.replace("gradients", "parameter updates", 1)
                      for line in gradient_lines(self.updates)]
        if self.updates_unwritten:
            lines.append(f"parameter updates: {self.updates_unwritten}")
        if self.updates_missing:
            lines.append(f"parameter updates: not compared: {self.updates_missing}")
        return lines

    def record(self) -> dict:
        """The record's fields this verdict fills: `loss`, `gradients` (with
        `parameter_updates` inside)."""
        fields = {}
        if self.loss is not None:
            fields["loss"] = self.loss.to_dict()
        if self.gradients is not None:
            gradients = self.gradients.to_dict()
            if self.updates is not None:
                gradients["parameter_updates"] = self.updates.to_dict()
                if self.updates_unwritten:
                    gradients["parameter_updates"]["run_wrote_none"] = True
                    gradients["parameter_updates"]["reason"] = self.updates_unwritten
            elif self.updates_missing:
                gradients["parameter_updates"] = {"compared": False, "ok": False,
                                                  "reason": self.updates_missing}
            fields["gradients"] = gradients
        return fields


def judge(steps: list[dict], ref_steps: list[dict] | None, loss_tol, loss_relative,
          gradients: tuple[Path, Path] | None, gradient_tol, gradient_relative,
          locator: Locator | None, tensor_parallel: int = 1,
          updates: UpdatesRequest | None = None) -> CaseVerdict:
    """Every comparison asked for: the loss when ref_steps is given, the gradients when
    `gradients` is (run folder, reference folder), the parameter updates when `updates` is."""
    loss = (compare_losses(steps, ref_steps, loss_tol, loss_relative)
            if ref_steps is not None else None)
    grads = changes = None
    missing = unwritten = None
    if gradients is not None:
        grads = compare_gradients(gradients[0], gradients[1], gradient_tol, locator,
                                  relative=gradient_relative, tensor_parallel=tensor_parallel)
        if updates is not None:
            if updates.ref.is_dir() and any(updates.ref.glob("*.npy")):
                # no `updates.got.is_dir()` guard: a run without them fails, every one missing
                if not gradient_names(updates.got):
                    unwritten = (f"the run wrote no parameter updates (none in {updates.got}); "
                                 f"every parameter is missing")
                changes = compare_gradients(updates.got, updates.ref, gradient_tol, locator,
                                            relative=updates.relative,
                                            resolution=updates.resolution)
            else:
                missing = (f"the reference has no parameter updates in {updates.ref} (its "
                           f"build did not dump them)")
    return CaseVerdict(loss, grads, changes, missing, unwritten)
