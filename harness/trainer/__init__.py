"""The reference trainer: `python -m harness.trainer`, or `torchrun -m harness.trainer` for parallel runs."""
