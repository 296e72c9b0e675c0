"""harness.cases.schema: the JSON Schema the shipped file is generated from."""

from __future__ import annotations

from harness.cases.schema import schema_text
from tests.cases.config_files import ROOT


def test_shipped_schema_file_matches_the_code():
    assert (ROOT / "configs" / "test_config.schema.json").read_text() == schema_text()
