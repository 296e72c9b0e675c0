"""Launching runs: trainer backends, processes with whole-group timeouts, device leases, ports."""

from .backends import CommandBackend, HarnessBackend, LaunchSpec, RunOutputs, TrainerBackend
from .leases import DeviceLeases, LeaseError
from .ports import free_port
from .process import ProcessResult, run_process, tail

__all__ = ["CommandBackend", "DeviceLeases", "HarnessBackend", "LaunchSpec", "LeaseError",
           "ProcessResult", "RunOutputs", "TrainerBackend", "free_port", "run_process", "tail"]
