"""Structured per-case results (JSON lines under a file lock) and their junit properties."""

from .records import (
    FIELDS,
    RESULT_FORMAT,
    ResultsWriter,
    junit_properties,
    new_record,
    read_results,
)

__all__ = ["FIELDS", "RESULT_FORMAT", "ResultsWriter", "junit_properties", "new_record",
           "read_results"]
