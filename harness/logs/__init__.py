"""Recorded runs made elsewhere (InfiniTrain run folders, PyTorch and Megatron baseline logs,
the harness's session folders) read and judged: a folder on its own, every case against the
recorded one-device run of its mathematics (`python -m harness.logs RUNS [--config FILE]
[-o REPORT]`), or two folders against each other (`python -m harness.logs BASELINE SUBJECT
[--pairing FILE] [-o REPORT]`).

    readers.py        the readers, one per kind of log, each to RecordedRun (bad inputs beside)
    command_line.py   an InfiniTrain log's [COMMAND] line, read as gflags reads argv
    run_folder.py     a run's folder, machine, night, branch and commit
    selfcheck.py      one run folder judged on its own: each case against its reference
    archive.py        many run folders: the same case across nights and machines, the
                      report's grid, findings.jsonl
    grid_plot.py      the archive's picture: cases x nights, the worst ratio a cell
    pairing.py        descriptive PyTorch section names paired through a cited table or a file;
                      baseline and subject paired by (model, case, tag)
    cli.py            the verdict lines, report.md and the exit code
"""

from .readers import BadInput, RecordedRun, Reading, read_paths

__all__ = ["BadInput", "Reading", "RecordedRun", "read_paths"]
