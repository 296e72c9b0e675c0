"""Recorded runs made elsewhere (InfiniTrain run folders, PyTorch and Megatron baseline logs,
the harness's session folders) read and judged against each other:
`python -m harness.logs BASELINE SUBJECT [--pairing FILE] [-o REPORT]`.

    readers.py   the readers, one per kind of log, each to RecordedRun (bad inputs beside)
    pairing.py   descriptive PyTorch section names paired through a cited table or a file;
                 baseline and subject paired by (model, case, tag)
    cli.py       the verdict lines, report.md and the exit code
"""

from .readers import BadInput, RecordedRun, Reading, read_paths

__all__ = ["BadInput", "Reading", "RecordedRun", "read_paths"]
