"""The pipeline layout a case's flags ask for, resolved before the run (as the trainer does), so
skipped and crashed cases carry one too."""

from __future__ import annotations

from pathlib import Path

from harness.cases import Case, HarnessConfig


def num_layers(config: HarnessConfig, model: str, checkpoint: Path | None) -> int | None:
    """The model's transformer layers from its checkpoint header (torch-free), without
    generating synthetic assets that are not there yet (their preset says it). `checkpoint` is
    the model's resolved checkpoint when known."""
    try:
        if checkpoint is None:
            files = config.files_for(model)
            if files.synthetic:
                from harness.assets.presets import PRESETS

                return int(PRESETS[config.assets.preset].config(model).n_layer)
            checkpoint = files.checkpoint
        from harness.contracts.llmc import read_checkpoint_header

        return int(read_checkpoint_header(checkpoint)[1].n_layer)
    except Exception:  # unreadable or not an llm.c checkpoint (another trainer's files)
        return None


def layout_from_flags(case: Case, num_layers: int | None) -> dict | None:
    """The layout the case's flags ask for (resolve_layout, as the trainer does); None when
    the model's depth is unknown or the flags do not resolve (the run will say why)."""
    if num_layers is None:
        return None
    try:
        return _resolve(case, num_layers).to_dict()
    except Exception:
        return None


def layout_problem(case: Case, num_layers: int | None) -> str | None:
    """Why the case's layout flags cannot place the model's layers (harness.layout's one-line
    message, naming the flag and the value), or None. Checked before any trainer is launched,
    so a bad layout is a config error, never a failed run."""
    if num_layers is None:
        return None
    from harness.layout import LayoutError

    try:
        _resolve(case, num_layers)
    except LayoutError as error:
        return f"{case.name}: {error}"
    return None


def _resolve(case: Case, num_layers: int):
    from harness.layout import layout_from_flags

    return layout_from_flags(num_layers, case.flags)
