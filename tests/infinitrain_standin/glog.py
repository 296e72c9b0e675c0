"""A glog (v0.7.1, InfiniTrain's third_party/glog at 7b134a5) look-alike:
``<L><yyyymmdd> <HH:MM:SS.micro> <tid> <file>:<line>] msg``.

Configuration comes from glog's ``GLOG_*`` environment variables only: InfiniTrain builds glog
with ``WITH_GFLAGS OFF`` (CMakeLists.txt:42), so glog's flags are not command-line flags.

Where lines go (src/logging.cc ``LogMessage::SendToLog``):
- default: every line to the log files of its severity and below; ERROR and FATAL also to
  stderr (``GLOG_stderrthreshold``, default 2); ``GLOG_alsologtostderr=1``: every line to stderr;
- ``GLOG_logtostderr=1``: everything to stderr, no log file; ``GLOG_logtostdout=1``: to stdout;
- log files only when ``GLOG_log_dir`` is set (real glog falls back to the system temp folder;
  the stand-in writes none then): ``<log_dir>/<prog>.<host>.<user>.log.<SEV>.<yyyymmdd-hhmmss>.<pid>``
  for SEV = INFO, WARNING, ERROR, FATAL, each created by the first line of that severity or
  above, plus the symlinks ``<log_dir>/<prog>.<SEV>`` (``LogFileObject::CreateLogfile``).

Buffering, as ``LogDestination::MaybeLogToLogfile`` (logging.cc:892: ``should_flush = severity >
FLAGS_logbuflevel`` where severity is the *file's*) and ``LogFileObject::Write`` (flush when
forced, after 1,000,000 bytes, or when ``logbufsecs`` (30) have passed since the last flush; the
first write flushes; a normal exit closes and so flushes them): with the default ``GLOG_logbuflevel=0`` the INFO file is flushed by its
first line and then only every 30 s, so a process killed by a signal leaves an INFO file that ends
at start-up; ``GLOG_logbuflevel=-1`` flushes every line. stdio's own 4096-byte buffer is mirrored
(whole 4096-byte blocks reach the file when more is pending). A FATAL line flushes every file
before the abort (logging.cc SendToLog: ``logger_->Write(true, ...)``). stderr is unbuffered.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import getpass
import os
import socket
import sys
import time

_SEV = "IWEF"
_SEV_NAMES = ("INFO", "WARNING", "ERROR", "FATAL")
_STDIO_BUF = 4096


def _env_bool(name: str) -> bool:
    v = os.environ.get(name, "")
    return v.lower() in ("1", "true", "t", "yes", "y")


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


class _LogFile:
    """One severity's log file: glog's LogFileObject with a stdio buffer in front of it."""

    def __init__(self, logger: "Logger", sev: int):
        self.logger, self.sev = logger, sev
        self.fd = None
        self.failed = False
        self.pending = b""
        self.bytes_since_flush = 0
        self.next_flush = 0.0

    def _open(self) -> bool:
        if self.fd is not None or self.failed:
            return self.fd is not None
        lg = self.logger
        now = _dt.datetime.now()
        try:
            user = getpass.getuser()
        except Exception:
            user = "invalid-user"
        host = socket.gethostname()
        base = f"{lg.prog}.{host}.{user}.log.{_SEV_NAMES[self.sev]}.{now:%Y%m%d-%H%M%S}.{lg.pid}"
        try:
            os.makedirs(lg.log_dir, exist_ok=True)
            self.fd = os.open(os.path.join(lg.log_dir, base), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o664)
        except OSError:
            self.failed = True
            return False
        link = os.path.join(lg.log_dir, f"{lg.prog}.{_SEV_NAMES[self.sev]}")
        try:
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(base, link)
        except OSError:
            pass
        dur = int(time.time() - lg.start_time)
        header = (f"Log file created at: {now:%Y/%m/%d %H:%M:%S}\n"
                  f"Running on machine: {host}\n"
                  f"Running duration (h:mm:ss): {dur // 3600}:{dur // 60 % 60:02d}:{dur % 60:02d}\n"
                  "Log line format: [IWEF]yyyymmdd hh:mm:ss.uuuuuu threadid file:line] msg\n")
        self.pending += header.encode()
        self.bytes_since_flush += len(header)
        return True

    def write(self, text: str, force_flush: bool) -> None:
        if not self._open():
            return
        data = text.encode()
        self.pending += data
        self.bytes_since_flush += len(data)
        now = time.time()
        if force_flush or self.bytes_since_flush >= 1_000_000 or now >= self.next_flush:
            self.flush(now)
        elif len(self.pending) >= _STDIO_BUF:  # stdio writes out what no longer fits its buffer
            n = len(self.pending) // _STDIO_BUF * _STDIO_BUF
            self._raw(self.pending[:n])
            self.pending = self.pending[n:]

    def flush(self, now: float | None = None) -> None:
        if self.fd is None:
            return
        self._raw(self.pending)
        self.pending = b""
        self.bytes_since_flush = 0
        self.next_flush = (now if now is not None else time.time()) + self.logger.logbufsecs

    def _raw(self, b: bytes) -> None:
        try:
            while b:
                k = os.write(self.fd, b)
                b = b[k:]
        except OSError:
            pass


class Logger:
    def __init__(self, prog: str, flags: dict | None = None):
        self.prog = os.path.basename(prog)
        self.tostderr = _env_bool("GLOG_logtostderr")
        self.alsotostderr = _env_bool("GLOG_alsologtostderr")
        self.tostdout = _env_bool("GLOG_logtostdout")
        self.stderrthreshold = _env_int("GLOG_stderrthreshold", 2)
        self.minloglevel = _env_int("GLOG_minloglevel", 0)
        self.logbuflevel = _env_int("GLOG_logbuflevel", 0)
        self.logbufsecs = _env_int("GLOG_logbufsecs", 30)
        self.log_dir = os.environ.get("GLOG_log_dir", "")
        self.pid = os.getpid()
        self.start_time = time.time()
        self.files = [_LogFile(self, s) for s in range(4)]
        atexit.register(self.flush_all)  # a normal exit closes (flushes) the files; a signal does not

    def line(self, sev: str, msg: str, where: str) -> str:
        now = _dt.datetime.now()
        return f"{sev}{now:%Y%m%d %H:%M:%S}.{now.microsecond:06d} {self.pid:5d} {where}] {msg}\n"

    def log(self, sev: str, msg: str, where: str = "main.cc:0") -> None:
        level = _SEV.index(sev)
        if level < self.minloglevel and level < 3:
            return
        text = "".join(self.line(sev, m, where) for m in str(msg).split("\n"))
        if self.tostdout:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        if self.tostderr:
            sys.stderr.write(text)
            sys.stderr.flush()
            return
        if self.log_dir:
            for i in range(level, -1, -1):  # LogToAllLogfiles: this severity's file and below
                self.files[i].write(text, force_flush=i > self.logbuflevel)
        if self.alsotostderr or level >= self.stderrthreshold:
            sys.stderr.write(text)
            sys.stderr.flush()

    def flush_all(self) -> None:
        for f in self.files:
            f.flush()

    def info(self, msg, where="main.cc:0"):
        self.log("I", msg, where)

    def warning(self, msg, where="main.cc:0"):
        self.log("W", msg, where)

    def error(self, msg, where="main.cc:0"):
        self.log("E", msg, where)

    def fatal(self, msg, where="main.cc:0"):
        """LOG(FATAL): the F line, every log file flushed, glog's stack-trace banner, SIGABRT."""
        self.log("F", msg, where)
        self.flush_all()
        sys.stderr.write("*** Check failure stack trace: ***\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os.abort()

    # glog's CHECK text: "Check failed: <expr> " + streamed message (glog/logging.h CHECK);
    # CHECK_OP: "Check failed: <expr> (<a> vs. <b>) " + message (logging.cc:1594, 2645-2665)
    def check(self, cond: bool, expr: str, msg: str = "", where="main.cc:0"):
        if not cond:
            self.fatal(f"Check failed: {expr} {msg}", where)

    def check_op(self, ok: bool, expr: str, a, b, msg: str = "", where="main.cc:0"):
        if not ok:
            self.fatal(f"Check failed: {expr} ({a} vs. {b}) {msg}", where)

    def check_eq(self, a, b, expr: str, msg: str = "", where="main.cc:0"):
        self.check_op(a == b, expr, a, b, msg, where)


def die_by_signal(sig: int) -> None:
    """Die of ``sig`` as a crashing C++ program does: nothing more on stderr, no buffer flushed
    (InfiniTrain installs no glog failure-signal handler)."""
    import signal
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(5)
    os._exit(128 + sig)
