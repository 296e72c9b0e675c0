"""A pre-warmed launcher for the bundled trainer: a zygote that has imported torch and the
trainer once, and forks each run's ranks.

Why: on CPU a PP2 tiny case spends ~0.15 s in its steps and ~4.5 s starting up, almost all of
it torchrun's agent and every rank importing torch. The zygote pays that once per pytest
worker (process).

Processes, for one run of N ranks::

    pytest worker --(stdin/stdout JSON lines)--> zygote (own session; imported torch, idle)
                                                   `- fork: leader (setsid: the run's own
                                                      process group, like torchrun's agent)
                                                        `- fork: rank 0 .. N-1

- The zygote initialises nothing that cannot survive a fork: it only imports (no CUDA, no
  tensor op, so no OpenMP / MKL thread pool); `threads` in its ready line says it is still one
  thread. Each rank sets the standard environment (RANK, LOCAL_RANK, WORLD_SIZE,
  LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; torchrun's
  OMP_NUM_THREADS=1 default for N > 1), applies OMP_NUM_THREADS with torch.set_num_threads,
  sends its stdout / stderr to `<log_dir>/ranks/zygote/attempt_0/<rank>/{stdout,stderr}.log`
  (ZygoteLauncher.rank_logs; torchrun's layout, for people who know it) and calls the trainer's
  `main(argv)` in-process; init_process_group then meets over MASTER_PORT (gloo on CPU).
- The leader behaves as torchrun's agent does: when a rank fails it stops the others
  (SIGTERM, then SIGKILL after GRACE_S), writes torchrun's failure summary (`Root Cause ...
  rank : R`) to the launcher's stderr, copies each rank's log there with torchrun's
  `[defaultR]:` prefix and exits 1; with all ranks done, 0. One process (N == 1) runs as
  `python -m harness.trainer` does: its output is the launcher's files, its exit code the run's.
- The client (`Zygote.run`) gives the same ProcessResult as run_process: on timeout, and
  after every run, the leader's whole process group is killed (SIGTERM, then SIGKILL). The
  leader and ranks also die with their parent (PR_SET_PDEATHSIG), and the zygote with its
  client (end of its stdin). A zygote found dead is started again; one that dies during a run
  is started again and the run repeated once, with a note in the launcher's stderr; a second
  death fails the run with that message. No run is skipped.

The command recorded for a run, `python -m harness.launch.zygote run --nproc-per-node N
--master-port P --log-dir D -- <trainer flags>`, runs the same leader without a zygote, so it
reproduces the run by hand.

ZygoteLauncher is the zygote behind the Launcher protocol (harness.launch.launcher): its
failure record is failure.json, its log layout the folders above; a run it cannot serve (another
module than the bundled trainer, or interpreter start-up variables of its own) goes to torchrun.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from ..contracts.rank_exit import exit_code
from .launcher import RankRun
from .process import GRACE_S, ProcessResult, end_group, end_processes, signal_group
from .reaper import become_subreaper, die_with_parent, end_descendants
from .torchrun import TorchrunLauncher

READY_TIMEOUT_S = 300.0
# Imported once in the zygote; anything missing (a module being refactored) is skipped, and is
# then imported by the rank that needs it, as under torchrun.
PRELOAD = (
    "numpy",
    "torch",
    "torch.nn.functional",
    "torch.optim",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch.distributed.pipelining",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "harness.layout",
    "harness.trainer.main",
    "harness.trainer.flags",
    "harness.trainer.engine",
    "harness.trainer.data",
    "harness.contracts.llmc",
    "harness.trainer.models",
    "harness.trainer.models.build",
    "harness.trainer.models.registry",
    "harness.trainer.parallel",  # its __init__ imports nothing (no cycle): its modules follow
    "harness.trainer.parallel.build",
    "harness.trainer.parallel.engine",
    "harness.trainer.parallel.tensor_parallel",
    "harness.trainer.gradient_dump",
    "harness.contracts.records",
    "harness.trainer.profiling",
)
# Environment read when an interpreter starts (sitecustomize, import paths, the allocator): a
# zygote cannot replay that per rank, so a run whose environment differs from the zygote's
# here needs a fresh interpreter (see startup_environment_differs).
_STARTUP_EXEMPT = {"PYTHONUNBUFFERED"}
_STARTUP_PREFIXES = ("PYTHON", "LD_", "MALLOC_")
TRAINER_MAIN = Path(__file__).resolve().parents[1] / "trainer" / "__main__.py"
TRAINER_MODULE = "harness.trainer"  # the one module a zygote has preloaded and serves


def startup_environment(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k.startswith(_STARTUP_PREFIXES) and k not in _STARTUP_EXEMPT}


def startup_environment_differs(env: Mapping[str, str], base: Mapping[str, str] | None = None) -> bool:
    """True when env sets interpreter start-up variables (PYTHONPATH, LD_PRELOAD, ...) other
    than those of `base` (default: this process's environment)."""
    base = os.environ if base is None else base
    return startup_environment(env) != startup_environment(base)


def command(world_size: int, port: int | None, log_dir: Path, trainer_args: Sequence[str]) -> list[str]:
    """The standalone equivalent of a zygote run (recorded as the run's command)."""
    return [sys.executable, "-m", "harness.launch.zygote", "run",
            "--nproc-per-node", str(world_size), "--master-port", str(port or 0),
            "--log-dir", str(log_dir), "--", *map(str, trainer_args)]


# ---------------------------------------------------------------------- in the forked processes

def _die_with_parent() -> None:
    die_with_parent(signal.SIGKILL)


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as any Python interpreter starts


def _redirect(stdout: Path, stderr: Path) -> None:
    for fd, path in ((1, stdout), (2, stderr)):
        path.parent.mkdir(parents=True, exist_ok=True)
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")


def _run_trainer(env: Mapping[str, str], trainer_args: Sequence[str]) -> int:
    """Become the trainer process: environment, threads, argv; returns its exit code."""
    os.environ.clear()
    os.environ.update(env)
    # The zygote imported torch with OMP_NUM_THREADS=1 (no OpenMP pool to lose in the fork);
    # each run gets the count a fresh interpreter would: its OMP_NUM_THREADS, else every CPU.
    threads = os.environ.get("OMP_NUM_THREADS", "")
    count = int(threads) if threads.isdigit() and int(threads) > 0 else len(os.sched_getaffinity(0))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(count)
    sys.argv = [str(TRAINER_MAIN), *trainer_args]
    entry = os.environ.get("HARNESS_ZYGOTE_ENTRY", "harness.trainer.main:main")
    module, _, name = entry.partition(":")

    def main() -> int | None:
        import importlib

        return getattr(importlib.import_module(module), name)(list(trainer_args))

    return exit_code(main)  # the rank ends as `python -m harness.trainer` does: os._exit


def _rank_env(env: Mapping[str, str], rank: int, world_size: int, port: int) -> dict[str, str]:
    env = dict(env)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for more than one process
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })
    return env


def rank_log_dir(log_dir: Path, rank: int) -> Path:
    return Path(log_dir) / "ranks" / "zygote" / "attempt_0" / str(rank)


def lead(request: Mapping) -> int:
    """The leader of one run (its process group's first process): fork the ranks, wait, and
    report as torchrun does. Returns the run's exit code."""
    env = dict(request["env"])
    args = list(request["args"])
    world_size = int(request["world_size"])
    if request.get("cwd"):
        os.chdir(request["cwd"])
    if world_size == 1:  # `python -m harness.trainer`: one process, the launcher's own files
        return _run_trainer(env, args)
    port = int(request["port"])
    log_dir = Path(request["log_dir"])
    pids: dict[int, int] = {}
    for rank in range(world_size):
        folder = rank_log_dir(log_dir, rank)
        folder.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _die_with_parent()
                _redirect(folder / "stdout.log", folder / "stderr.log")
                code = _run_trainer(_rank_env(env, rank, world_size, port), args)
            finally:
                os._exit(code)
        pids[pid] = rank
    first: tuple[int, int, int, float] | None = None  # rank, exit code, pid, time
    others: list[tuple[int, int, int, float]] = []
    while pids:
        pid, status = os.wait()
        rank = pids.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            failure = (rank, code, pid, time.time())
            if first is None:
                first = failure
                _stop(pids)
            else:
                others.append(failure)
    _copy_rank_logs(log_dir, world_size)
    if first is None:
        return 0
    write_failure(log_dir, first, others)
    print(_failure_summary(first, others), file=sys.stderr, flush=True)
    return 1


FAILURE_FILE = "failure.json"


def write_failure(log_dir: Path, first, others) -> None:
    """The run's failure as data, `<log_dir>/failure.json`: the first failing rank, then the
    others, each with its exit code, pid and time (what ZygoteLauncher.failing_rank reads;
    the text summary on stderr is for people)."""
    def entry(failure):
        rank, code, pid, when = failure
        return {"rank": rank, "exitcode": code, "pid": pid, "time": when}

    (log_dir / FAILURE_FILE).write_text(json.dumps(
        {"first": entry(first), "others": [entry(f) for f in others]}))


def read_failure(log_dir: Path) -> dict | None:
    """failure.json as written by write_failure, or None (no failure recorded, or unreadable)."""
    try:
        data = json.loads((log_dir / FAILURE_FILE).read_text())
        int(data["first"]["rank"])
        return data
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stop(pids: Mapping[int, int]) -> None:
    """Stop the remaining ranks as torchrun's agent does: SIGTERM, then SIGKILL after GRACE_S
    (process.end_processes). No reaping here: the caller's wait loop collects each rank's exit
    code."""
    end_processes(lambda: [pid for pid in pids if _alive(pid)], GRACE_S)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _copy_rank_logs(log_dir: Path, world_size: int) -> None:
    """torchrun's --tee: every rank's lines in the launcher's stdout / stderr, prefixed."""
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        for rank in range(world_size):
            try:
                text = (rank_log_dir(log_dir, rank) / f"{name}.log").read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                stream.write(f"[default{rank}]:{line}\n")
        stream.flush()


def _failure_summary(first, others) -> str:
    """The failure in torchrun's ChildFailedError layout, for people who know it (the data is
    failure.json)."""
    def block(index, failure):
        rank, code, pid, when = failure
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            trace = f"Signal {-code} ({name}) received by PID {pid}"
        else:
            trace = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        return [f"[{index}]:",
                f"  time      : {time.strftime('%Y-%m-%d_%H:%M:%S', time.localtime(when))}",
                f"  host      : {socket.gethostname()}",
                f"  rank      : {rank} (local_rank: {rank})",
                f"  exitcode  : {code} (pid: {pid})",
                "  error_file: <N/A>",
                f"  traceback : {trace}"]

    rule, thin = "=" * 60, "-" * 60
    lines = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", rule,
             "harness.trainer FAILED (zygote launcher)", thin, "Failures:"]
    if others:
        for i, failure in enumerate(others, start=1):
            lines += ["  " + l for l in block(i, failure)]
    else:
        lines.append("  <NO_OTHER_FAILURES>")
    lines += [thin, "Root Cause (first observed failure):", *block(0, first), rule]
    return "\n".join(lines)


# ---------------------------------------------------------------------- the zygote

def _preload() -> list[str]:
    import importlib

    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - reported in the ready line, not fatal
            missing.append(f"{name}: {type(error).__name__}: {error}")
    return missing


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _settle_threads(timeout_s: float = 5.0) -> int:
    """Wait (briefly) until this process is one thread again: an import may leave a short-lived
    helper thread, and a fork copies only the forking thread (locks a helper holds stay held)."""
    deadline = time.monotonic() + timeout_s
    while _thread_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return _thread_count()


def serve() -> int:
    """The zygote's loop: one JSON request per stdin line, replies on the original stdout."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by an import goes to the zygote's log, not the protocol
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client ends runs; Ctrl-C is its
    missing = _preload()
    replies.write(json.dumps({"ready": True, "pid": os.getpid(), "threads": _settle_threads(),
                              "missing": missing}) + "\n")
    stdin = sys.stdin.buffer
    for line in stdin:
        request = json.loads(line)
        if request.get("op") == "ping":
            replies.write(json.dumps({"pong": True, "threads": _thread_count()}) + "\n")
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        _settle_threads()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setsid()
                _die_with_parent()
                become_subreaper()  # what a rank starts, in any session, stays below the leader
                _default_signals()
                _redirect(Path(request["stdout"]), Path(request["stderr"]))
                code = lead(request)
            except BaseException:
                traceback.print_exc()
            finally:
                end_descendants(os.getpid())
                os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)
        replies.write(json.dumps({"pid": pid}) + "\n")
        code = _wait_or_orphaned(pid, stdin)
        if code is None:  # the client is gone: end the run with it, then ourselves
            return 0
        replies.write(json.dumps({"returncode": code}) + "\n")
    return 0


def _wait_or_orphaned(pid: int, stdin) -> int | None:
    """The leader's exit code; None (after killing its group) if the client closed our stdin."""
    pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    while True:
        waitable = [pidfd] if pidfd is not None else []
        ready, _, _ = select.select([stdin.fileno(), *waitable], [], [],
                                    None if pidfd is not None else 0.05)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if pidfd is not None:
                os.close(pidfd)
            return os.waitstatus_to_exitcode(status)
        if stdin.fileno() in ready and not stdin.peek(1):  # EOF: the client died
            signal_group(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None



# ---------------------------------------------------------------------- the client

class ZygoteDied(RuntimeError):
    pass


class _Lines:
    """JSON lines from a pipe, with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def read(self, deadline: float | None) -> dict | None:
        """The next message; None at the deadline; ZygoteDied at end of file."""
        while b"\n" not in self.buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.fd], [], [], wait)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise ZygoteDied("the zygote exited")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


class Zygote:
    """The client's handle: starts the zygote on first use, and again whenever it is dead."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.lines: _Lines | None = None
        self.info: dict = {}
        self.starts = 0
        self._startup: dict[str, str] = {}
        self._log = None

    # -- lifecycle
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.close()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="harness-zygote-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self._log = open(self.log_path, "ab")
        env = dict(os.environ)
        self._startup = startup_environment(env)
        # torch's import starts OpenMP's thread pool unless told one thread: a fork would copy
        # its state but not its threads. Runs set their own count (_run_trainer).
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "harness.launch.zygote", "serve"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            start_new_session=True, cwd=str(Path(__file__).resolve().parents[2]))
        self.lines = _Lines(self.process.stdout.fileno())
        self.starts += 1
        try:
            ready = self.lines.read(time.monotonic() + READY_TIMEOUT_S)
        except ZygoteDied:
            ready = None
        if not ready or not ready.get("ready"):
            log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
            self.close()
            raise ZygoteDied(f"the zygote did not start:\n{log}")
        self.info = ready

    def ensure(self) -> None:
        if not self.alive() or startup_environment(os.environ) != self._startup:
            self.start()

    def close(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            try:
                process.stdin.close()
            except OSError:
                pass
            try:
                process.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                signal_group(process.pid, signal.SIGKILL)
                process.wait()
            process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def ping(self) -> dict:
        self.ensure()
        self._send({"op": "ping"})
        return self.lines.read(time.monotonic() + 30) or {}

    def _send(self, message: dict) -> None:
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise ZygoteDied(f"the zygote is gone ({error})") from None

    # -- one run
    def run(self, trainer_args: Sequence[str], env: Mapping[str, str], world_size: int,
            port: int | None, log_dir: Path, timeout_s: float, stdout: Path, stderr: Path,
            cwd: str | os.PathLike | None = None) -> ProcessResult:
        argv = tuple(command(world_size, port, log_dir, trainer_args))
        stdout.parent.mkdir(parents=True, exist_ok=True)
        stderr.parent.mkdir(parents=True, exist_ok=True)
        for path in (stdout, stderr):
            path.write_bytes(b"")
        request = {"op": "run", "args": list(map(str, trainer_args)), "env": dict(env),
                   "world_size": world_size, "port": port, "log_dir": str(log_dir),
                   "stdout": str(stdout), "stderr": str(stderr),
                   "cwd": str(cwd) if cwd else os.getcwd()}
        started = time.monotonic()
        deadline = started + timeout_s
        for attempt in (1, 2):
            try:
                returncode, timed_out = self._run_once(request, deadline)
                return ProcessResult(argv, returncode, timed_out, time.monotonic() - started,
                                     stdout, stderr)
            except ZygoteDied as error:
                self.close()
                shutil.rmtree(Path(log_dir) / "ranks" / "zygote", ignore_errors=True)
                note = (f"harness zygote launcher: the zygote (pid {self.info.get('pid')}) "
                        f"died during the run ({error}); ")
                note += "started a new one and ran again\n" if attempt == 1 else "giving up\n"
                with open(stderr, "a") as stream:
                    stream.write(note)
                if attempt == 2 or time.monotonic() >= deadline:
                    return ProcessResult(argv, None, time.monotonic() >= deadline,
                                         time.monotonic() - started, stdout, stderr)
        raise AssertionError("unreachable")

    def _run_once(self, request: dict, deadline: float) -> tuple[int | None, bool]:
        self.ensure()
        self._send(request)
        leader = None
        timed_out = False
        clean = False
        try:
            message = self.lines.read(None)
            leader = int(message["pid"])
            message = self.lines.read(deadline)
            if message is None:  # timed out: end the whole run, as run_process does
                timed_out = True
                end_group(leader)
                message = self.lines.read(time.monotonic() + 3 * GRACE_S)
                clean = message is not None
                return None, True
            clean = True
            return int(message["returncode"]), False
        finally:
            if leader is not None:
                end_group(leader)  # leftovers of a finished run, or every way out
            if not clean and not timed_out and self.alive():
                # Interrupted mid-protocol (KeyboardInterrupt): a fresh zygote next time.
                self.close()



_SHARED: Zygote | None = None


def shared_zygote() -> Zygote:
    """This process's zygote (one per pytest worker), closed at exit."""
    global _SHARED
    if _SHARED is None:
        _SHARED = Zygote()
        atexit.register(_close_shared)
    return _SHARED


def _close_shared() -> None:
    if _SHARED is not None:
        _SHARED.close()
        if _SHARED.log_path is not None:
            try:
                _SHARED.log_path.unlink()
            except OSError:
                pass


class ZygoteLauncher:
    """The Launcher protocol over this process's zygote (shared_zygote)."""

    name = "zygote"

    def __init__(self) -> None:
        # What runs a run the zygote cannot serve, and reads its one-process runs' failures.
        self.torchrun = TorchrunLauncher()

    def serves(self, run: RankRun) -> bool:
        """Whether the zygote can run it: the bundled trainer, in an environment without
        interpreter start-up variables of its own (such as a config's PYTHONPATH)."""
        return run.module == TRAINER_MODULE and not startup_environment_differs(run.env)

    def command(self, run: RankRun) -> list[str]:
        if not self.serves(run):
            return self.torchrun.command(run)
        return command(run.world_size, run.port, run.log_dir, run.args)

    def launch(self, run: RankRun) -> ProcessResult:
        if not self.serves(run):
            return self.torchrun.launch(run)
        result = shared_zygote().run(run.args, run.env, run.world_size, run.port, run.log_dir,
                                     run.timeout_s, run.stdout, run.stderr, cwd=run.cwd)
        return replace(result, launcher=self.name)

    def rank_logs(self, log_dir: Path, result: ProcessResult) -> dict[str, list[Path]]:
        logs: dict[str, list[Path]] = {}
        for path in sorted(rank_log_dir(log_dir, 0).parent.glob("*/*.log")):
            logs.setdefault(path.parent.name, []).append(path)
        return logs

    def failing_rank(self, log_dir: Path, result: ProcessResult) -> str | None:
        failure = read_failure(log_dir)  # the leader writes it as data
        if failure is not None:
            return str(failure["first"]["rank"])
        # No record: one process (it runs as `python -m harness.trainer`, its launcher files
        # are its own), or a leader ended before writing one; the ranks' own records and logs
        # then say it, read as under torchrun.
        return self.torchrun.failing_rank(log_dir, result)


# ---------------------------------------------------------------------- command line

def _main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness.launch.zygote")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run as a zygote (JSON requests on stdin)")
    run = sub.add_parser("run", help="launch one run the way the zygote does, without one")
    run.add_argument("--nproc-per-node", type=int, default=1)
    run.add_argument("--master-port", type=int, default=0)
    run.add_argument("--log-dir", type=Path, default=Path("logs"))
    run.add_argument("trainer_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve()
    trainer_args = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    port = args.master_port
    if args.nproc_per_node > 1 and not port:
        from .ports import free_port

        port = free_port()
    # No preload here: this process was not started single-threaded, so torch is imported by
    # each forked rank (slower, and the same arithmetic).
    return lead({"env": dict(os.environ), "args": trainer_args, "world_size": args.nproc_per_node,
                 "port": port, "log_dir": str(args.log_dir)})


if __name__ == "__main__":
    raise SystemExit(_main())
