"""A Slurm job's guard: cancels the job if the process that submitted it dies first.

    python -I -S harness/launch/job_guard.py   (stdin: a pipe from the submitter)

The submitter (harness.launch.slurm) starts one guard per job before it submits, in a session
of its own, and keeps the write end of the guard's stdin: `job <id>` once sbatch has answered,
`done` once the job has ended (or was cancelled and waited for), then it closes the pipe. If
the pipe closes after `job <id>` without `done`, the submitter is gone, however it went
(pytest or an xdist worker killed by SIGKILL, the OOM killer, a lost login shell), and the
guard runs `scancel <id>` with the submitter's environment (SLURM_CONF included). Standard
library only: it starts in ~15 ms.
"""

from __future__ import annotations

import subprocess
import sys


def guard(lines) -> int:
    job, done = None, False
    for line in lines:
        word, _, value = line.strip().partition(" ")
        if word == "job":
            job = value
        elif word == "done":
            done = True
    if job is None or done:
        return 0
    ended = subprocess.run(["scancel", job], capture_output=True, text=True)
    print(f"job_guard: the submitter of Slurm job {job} is gone; scancel {job}: exit "
          f"{ended.returncode} {ended.stderr.strip()}", file=sys.stderr, flush=True)
    return ended.returncode


if __name__ == "__main__":
    sys.exit(guard(sys.stdin))
