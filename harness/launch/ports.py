"""Free rendezvous ports: asked of the OS, and never handed out twice in one session (a port
is only reserved once torchrun binds it, so two workers asking at once could get the same)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from filelock import FileLock


def _os_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port(state_dir: str | Path | None = None) -> int:
    if state_dir is None:
        return _os_port()
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    record = state_dir / "ports.json"
    with FileLock(str(state_dir / "ports.lock")):
        try:
            issued = set(json.loads(record.read_text()))
        except (OSError, ValueError):
            issued = set()
        for _ in range(100):
            port = _os_port()
            if port not in issued:
                break
        issued.add(port)
        record.write_text(json.dumps(sorted(issued)))
    return port
