"""Structured per-case results (JSON lines under a file lock), their junit properties, and the
session header (session.json)."""

from .records import (
    FIELDS,
    RESULT_FORMAT,
    ResultsWriter,
    junit_properties,
    new_record,
    read_results,
)
from .result_record import ResultRecord
from .session import HEADER_NAME, SESSION_FORMAT, read_header, write_header

__all__ = ["FIELDS", "HEADER_NAME", "RESULT_FORMAT", "ResultRecord", "ResultsWriter",
           "SESSION_FORMAT",
           "junit_properties", "new_record", "read_header", "read_results", "write_header"]
