"""A real one-node Slurm cluster on this machine, for the Slurm scheduler's tests.

`start_cluster(folder)` runs a private munged (its own key and socket), slurmctld and slurmd
(its own slurm.conf, ports, state and spool folders under `folder`), waits for the node to be
idle and returns a Cluster whose `env` (SLURM_CONF) points sbatch / squeue / scontrol at it;
`cluster.stop()` cancels every job and ends the three daemons by pid. Nothing of the system's
own Slurm or munge configuration is read or changed.

Where Slurm is not installed it is installed with `apt-get install -y slurm-wlm munge` when
this process is root and apt-get exists, bounded by INSTALL_TIMEOUT_S (HARNESS_SLURM_INSTALL=0
turns that off). Every reason it cannot start is raised as SlurmUnavailable, which the fixture
turns into `pytest.skip("slurm: ...")`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_TIMEOUT_S = 75.0
START_TIMEOUT_S = 30.0
DAEMONS = ("munged", "slurmctld", "slurmd")


class SlurmUnavailable(RuntimeError):
    pass


@dataclass
class Cluster:
    folder: Path
    node: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def jobs(self) -> list[str]:
        """Ids of the jobs still queued or running."""
        return self.run("squeue", "-h", "-o", "%i", check=False).split()

    def log_tail(self, lines: int = 20) -> str:
        out = []
        for name in ("slurmctld", "slurmd"):
            path = self.folder / f"{name}.log"
            if path.is_file():
                out.append(f"--- {path} ---\n" + "\n".join(
                    path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user", str(os.getuid()), check=False)
        for name in reversed(DAEMONS):
            proc = self.procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def ensure_installed() -> None:
    missing = [tool for tool in (*DAEMONS, "sbatch", "squeue", "scontrol", "scancel")
               if not _have(tool)]
    if not missing:
        return
    if os.environ.get("HARNESS_SLURM_INSTALL", "1") == "0":
        raise SlurmUnavailable(f"{', '.join(missing)} not installed (HARNESS_SLURM_INSTALL=0)")
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SlurmUnavailable(f"{', '.join(missing)} not installed, and it cannot be installed "
                               f"here (needs root and apt-get: apt-get install slurm-wlm munge)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + INSTALL_TIMEOUT_S
    for argv in (["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm",
                  "munge"],
                 ["apt-get", "update", "-q"],
                 ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm",
                  "munge"]):
        left = deadline - time.monotonic()
        if left <= 1:
            break
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"apt-get install slurm-wlm munge did not finish within "
                                   f"{INSTALL_TIMEOUT_S:g} s") from None
        if argv[1] == "install" and done.returncode == 0:
            return
    raise SlurmUnavailable("apt-get install slurm-wlm munge failed: "
                           + (done.stderr.strip().splitlines() or ["?"])[-1])


def _have(tool: str) -> bool:
    return bool(shutil.which(tool)) or Path("/usr/sbin", tool).exists()


def _free_ports(count: int) -> list[int]:
    socks, ports = [], []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
        ports.append(sock.getsockname()[1])
    for sock in socks:
        sock.close()
    return ports


def _daemon(path: str) -> str:
    return shutil.which(path) or str(Path("/usr/sbin") / path)


def start_cluster(folder: Path, cpus: int | None = None) -> Cluster:
    ensure_installed()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    node = socket.gethostname().split(".")[0]
    cpus = cpus or os.cpu_count() or 1
    user = "root" if os.geteuid() == 0 else os.environ.get("USER") or str(os.getuid())
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir(exist_ok=True)
    os.chmod(folder / "munge", 0o700)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    os.chmod(key, 0o600)
    munge_socket = folder / "munge" / "munge.socket"
    ctld_port, slurmd_port = _free_ports(2)
    conf = folder / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=harness-test",
        f"SlurmctldHost={node}",
        f"SlurmUser={user}",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "ReturnToService=2",
        "MinJobAge=600",
        "KillWait=5",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=harness Nodes={node} Default=YES MaxTime=INFINITE State=UP "
        f"OverSubscribe=NO",
        "",
    ]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Cluster(folder, node, env)
    try:
        cluster.procs["munged"] = _start(
            [_daemon("munged"), "--foreground", "--force", f"--socket={munge_socket}",
             f"--key-file={key}", f"--pid-file={folder / 'munge' / 'munged.pid'}",
             f"--log-file={folder / 'munge' / 'munged.log'}",
             f"--seed-file={folder / 'munge' / 'munged.seed'}"], env, folder / "munged.out")
        _wait(lambda: munge_socket.exists(), 5, "munged did not create its socket", cluster,
              folder / "munged.out")
        cluster.procs["slurmctld"] = _start([_daemon("slurmctld"), "-D", "-i", "-f", str(conf)],
                                            env, folder / "slurmctld.out")
        cluster.procs["slurmd"] = _start([_daemon("slurmd"), "-D", "-f", str(conf)], env,
                                         folder / "slurmd.out")

        def idle() -> bool:
            for name, proc in cluster.procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited with {proc.returncode}")
            state = cluster.run("sinfo", "-h", "-n", node, "-o", "%t", check=False).strip()
            return state in ("idle", "mix", "alloc")

        _wait(idle, START_TIMEOUT_S, "the node did not become idle", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait(ready, timeout_s: float, what: str, cluster: Cluster, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except SlurmUnavailable as error:
            raise SlurmUnavailable(f"{error}\n{cluster.log_tail()}") from None
        time.sleep(0.3)
    text = log.read_text(errors="replace")[-2000:] if log and log.is_file() else cluster.log_tail()
    raise SlurmUnavailable(f"{what} within {timeout_s:g} s\n{text}")
