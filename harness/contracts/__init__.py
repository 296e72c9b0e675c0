"""Contracts shared by the harness and the trainer, with no torch import (see docs/design.md)."""
