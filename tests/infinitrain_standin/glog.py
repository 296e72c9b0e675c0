"""A glog (0.7) look-alike: ``<L><yyyymmdd> <HH:MM:SS.micro> <tid> <file>:<line>] msg``.

Where lines go (as glog's defaults with its GLOG_* environment variables / flags):
- default: INFO/WARNING only to the log file, ERROR and FATAL also to stderr;
- ``GLOG_logtostderr=1``: everything to stderr, no log file;
- ``GLOG_alsologtostderr=1``: everything to stderr and to the log file;
- ``GLOG_logtostdout=1``: everything to stdout instead of stderr, no log file;
- log file only when ``GLOG_log_dir`` (or ``--log_dir``) is set (real glog falls back to the
  system temp folder; the stand-in writes none then):
  ``<log_dir>/<prog>.<host>.<user>.log.INFO.<yyyymmdd-hhmmss>.<pid>``, one per process.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import os
import socket
import sys

_SEV = "IWEF"


def _env_bool(name: str) -> bool:
    v = os.environ.get(name, "")
    return v.lower() in ("1", "true", "t", "yes", "y")


class Logger:
    def __init__(self, prog: str, flags: dict | None = None):
        flags = flags or {}
        self.prog = os.path.basename(prog)
        self.tostderr = bool(flags.get("logtostderr")) or _env_bool("GLOG_logtostderr")
        self.alsotostderr = bool(flags.get("alsologtostderr")) or _env_bool("GLOG_alsologtostderr")
        self.tostdout = bool(flags.get("logtostdout")) or _env_bool("GLOG_logtostdout")
        self.log_dir = flags.get("log_dir") or os.environ.get("GLOG_log_dir", "")
        self.pid = os.getpid()
        self._file = None
        self._file_failed = False

    def _open_file(self):
        if self._file is not None or self._file_failed or not self.log_dir:
            return self._file
        if self.tostderr or self.tostdout:
            return None
        now = _dt.datetime.now()
        try:
            user = getpass.getuser()
        except Exception:
            user = "invalid-user"
        name = (f"{self.prog}.{socket.gethostname()}.{user}.log.INFO."
                f"{now:%Y%m%d-%H%M%S}.{self.pid}")
        try:
            os.makedirs(self.log_dir, exist_ok=True)
            self._file = open(os.path.join(self.log_dir, name), "a", buffering=1)
            self._file.write(f"Log file created at: {now:%Y/%m/%d %H:%M:%S}\n"
                             f"Running on machine: {socket.gethostname()}\n"
                             "Log line format: [IWEF]yyyymmdd hh:mm:ss.uuuuuu threadid file:line] msg\n")
        except OSError:
            self._file_failed = True
        return self._file

    def line(self, sev: str, msg: str, where: str) -> str:
        now = _dt.datetime.now()
        return f"{sev}{now:%Y%m%d %H:%M:%S}.{now.microsecond:06d} {self.pid:5d} {where}] {msg}\n"

    def log(self, sev: str, msg: str, where: str = "main.cc:0") -> None:
        text = "".join(self.line(sev, m, where) for m in str(msg).split("\n")) if "\n" in str(msg) \
            else self.line(sev, msg, where)
        level = _SEV.index(sev)
        if self.tostdout:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        if self.tostderr or self.alsotostderr or level >= 2:
            sys.stderr.write(text)
            sys.stderr.flush()
        if not self.tostderr:
            f = self._open_file()
            if f is not None:
                f.write(text)
                f.flush()

    def info(self, msg, where="main.cc:0"):
        self.log("I", msg, where)

    def warning(self, msg, where="main.cc:0"):
        self.log("W", msg, where)

    def error(self, msg, where="main.cc:0"):
        self.log("E", msg, where)

    def fatal(self, msg, where="main.cc:0"):
        """LOG(FATAL): the F line, glog's stack-trace banner, then abort (SIGABRT)."""
        self.log("F", msg, where)
        sys.stderr.write("*** Check failure stack trace: ***\n")
        sys.stderr.flush()
        sys.stdout.flush()
        if self._file is not None:
            self._file.flush()
        os.abort()

    def check(self, cond: bool, expr: str, msg: str = "", where="main.cc:0"):
        if not cond:
            self.fatal(f"Check failed: {expr} {msg}".rstrip(), where)

    def check_eq(self, a, b, expr: str, msg: str = "", where="main.cc:0"):
        if a != b:
            self.fatal(f"Check failed: {expr} ({a} vs. {b}) {msg}".rstrip(), where)
