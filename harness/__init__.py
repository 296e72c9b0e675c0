"""Precision-regression harness for distributed LLM training: the pytest plugin and what it runs (docs/design.md)."""
