"""What a foreign trainer binary can do, learned from the binary itself and never from a failed
run: its flag listing (gflags' `--helpxml`) and whether it was built to run more than one rank
(a CUDA build names the CUDA runtime / NCCL / cuBLAS libraries in its bytes).

Learned once per binary name and content and kept beside the reference cache
(`<reference cache>/binaries/<name>-<sha256>.json`), so every session, worker and cache state
makes the same decisions: a nightly (always a second session) decides exactly as the first one
did. A file lock makes concurrent xdist workers ask the binary once.

A binary is known by what actually runs (`identify`): the name counts (one file installed as
`gpt2` and `llama3`, a multi-call binary or a wrapper reading `basename $0`, answers a listing per
name), and a script (`#!`) is followed through its `exec` line to the file it runs (`$0`,
`$(basename $0)`, `"$@"` resolved), so a wrapper whose target is rebuilt is a new binary though
its own bytes never change. `identified` says which way: `elf`, `script -> /path`, or why a
script's own bytes had to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from harness.contracts.records import write_atomic

from .process import run_process
from .reaper import CANNOT_START

# /2 added each flag's default as the listing gives it (/1 entries are asked again)
FACTS_FORMAT = "harness.binary_facts/2"
# Bytes a CUDA build of InfiniTrain carries: the names of the libraries its ELF links or loads
# (a CPU build, USE_CUDA=OFF, names none; its parallel ranks abort `No DeviceGuardImpl
# registered for type 1`, docs/infinitrain.md).
CUDA_MARKERS = (b"libcudart", b"libnccl", b"libcublas")
_LISTING_TIMEOUT_S = 60.0
_BLOCK = 1 << 20
_MAX_SCRIPTS = 8  # wrappers followed before giving up (a loop)


class BinaryFactsError(ValueError):
    """A binary whose capabilities cannot be learned; the message names it and what was
    expected."""


@dataclass(frozen=True)
class BinaryFacts:
    path: str
    sha256: str
    flags: frozenset[str]  # every flag its listing names
    multi_rank: bool  # built with CUDA: can run more than one rank
    # (flag, default) as the listing's <default> gives it, sorted: what a flag the case leaves
    # out is (the PyTorch baseline runs with its defaults, harness.contracts.semantics)
    defaults: tuple[tuple[str, str], ...] = ()
    identified: str = "elf"  # how `sha256` was found (Identity.identified)

    def accepts(self, flag: str) -> bool:
        return flag in self.flags

    def default(self, flag: str) -> str | None:
        """The flag's default as the binary's listing states it, or None when it lists none."""
        return dict(self.defaults).get(flag)

    def to_json(self) -> dict:
        return {"format": FACTS_FORMAT, "path": self.path, "sha256": self.sha256,
                "flags": sorted(self.flags), "multi_rank": self.multi_rank,
                "defaults": dict(self.defaults), "identified": self.identified}

    @classmethod
    def from_json(cls, data: dict) -> "BinaryFacts":
        if data.get("format") != FACTS_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FACTS_FORMAT!r}")
        return cls(path=str(data["path"]), sha256=str(data["sha256"]),
                   flags=frozenset(map(str, data["flags"])), multi_rank=bool(data["multi_rank"]),
                   defaults=tuple(sorted((str(k), str(v))
                                         for k, v in dict(data["defaults"]).items())),
                   identified=str(data["identified"]))


def content_hash(path: Path) -> tuple[str, bool]:
    """(sha256 of the file, whether it carries a CUDA marker), in one read."""
    digest = hashlib.sha256()
    found = False
    tail = b""
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(_BLOCK), b""):
            digest.update(block)
            window = tail + block  # a marker may straddle two blocks
            found = found or any(marker in window for marker in CUDA_MARKERS)
            tail = block[-16:]
    return digest.hexdigest(), found


@dataclass(frozen=True)
class Identity:
    """What runs when `binary` is started: `sha256` of the file itself (an ELF), or of every
    script on the way and the file the last one execs; `multi_rank` when any of them names a
    CUDA library; `identified` how: `elf`, `script -> /path`, or `script (...)` saying why its
    own bytes had to do."""
    sha256: str
    multi_rank: bool
    identified: str


_BASENAME = ('"$(basename "$0")"', '"$(basename $0)"', '$(basename "$0")', '$(basename $0)',
             '`basename $0`', '"${0##*/}"', '${0##*/}')
_DIRNAME = ('"$(dirname "$0")"', '"$(dirname $0)"', '$(dirname "$0")', '$(dirname $0)',
            '`dirname $0`', '"${0%/*}"', '${0%/*}')
_ZERO = ('"$0"', '"${0}"', '${0}', '$0')


def exec_target(script: Path, zero: str) -> tuple[Path | None, str]:
    """The file a shell script's first `exec` line runs when started as `zero` (its $0), or
    None with the reason it cannot be followed."""
    try:
        text = script.read_text(errors="replace")
    except OSError as error:
        return None, f"unreadable ({error.strerror})"
    for line in text.splitlines():
        words = line.strip()
        if not words.startswith("exec "):
            continue
        words = words[len("exec "):]
        for forms, value in ((_BASENAME, Path(zero).name), (_DIRNAME, str(Path(zero).parent)),
                             (_ZERO, zero)):
            for form in forms:
                words = words.replace(form, shlex.quote(value))
        try:
            tokens = [t for t in shlex.split(words, comments=True) if t not in ("$@", "$*")]
        except ValueError:
            return None, f"its exec line cannot be read: {line.strip()!r}"
        while tokens and tokens[0] in ("-a", "-c", "-l"):  # exec's own options
            tokens = tokens[2:] if tokens[0] == "-a" else tokens[1:]
        if not tokens or "$" in tokens[0] or "`" in tokens[0]:
            return None, f"its exec line names no program it can resolve: {line.strip()!r}"
        program = tokens[0]
        if "/" not in program:
            found = shutil.which(program)
            target = Path(found) if found else None
        else:
            target = Path(program) if Path(program).is_absolute() else script.parent / program
        if target is None or not target.is_file():
            return None, f"its exec runs {program}, which is not a file"
        return target, ""
    return None, "no exec line: its interpreter runs its own bytes"


def _chained(shas: list[str]) -> str:
    return shas[0] if len(shas) == 1 else hashlib.sha256("\0".join(shas).encode()).hexdigest()


def identify(binary: Path) -> Identity:
    """What starting `binary` runs, followed through wrapper scripts (their `exec`)."""
    shas, cuda, path, zero = [], False, binary, str(binary)
    for _ in range(_MAX_SCRIPTS):
        sha, marked = content_hash(path)
        shas.append(sha)
        cuda = cuda or marked
        with open(path, "rb") as stream:
            head = stream.read(4)
        if not head.startswith(b"#!"):
            if len(shas) == 1:
                return Identity(sha, cuda, "elf" if head == b"\x7fELF" else "file (not elf)")
            return Identity(_chained(shas), cuda, f"script -> {path}")
        target, why = exec_target(path, zero)
        if target is None:  # a script run by its interpreter: its own bytes are what runs
            how = f"script ({path}: {why})" if len(shas) == 1 else f"script -> {path} ({why})"
            return Identity(_chained(shas), cuda, how)
        path, zero = target, str(target)
    raise BinaryFactsError(f"{binary}: more than {_MAX_SCRIPTS} scripts exec one another; "
                           f"expected a wrapper that execs the binary")


def parse_helpxml(text: str, binary: Path) -> frozenset[str]:
    """The flag names of gflags' `--helpxml` listing (`<AllFlags>` of `<flag><name>`)."""
    return frozenset(listing_defaults(text, binary))


def listing_defaults(text: str, binary: Path) -> dict[str, str]:
    """Every flag of gflags' `--helpxml` listing with its `<default>` (as text, stripped)."""
    start, end = text.find("<AllFlags>"), text.rfind("</AllFlags>")
    if start < 0 or end < 0:
        shown = " ".join(text.split())[:200] or "nothing"
        raise BinaryFactsError(
            f"{binary}: answers no flag listing (`{binary.name} --helpxml` printed {shown!r}); "
            f"expected gflags' XML listing (<AllFlags>...</AllFlags>), as InfiniTrain's "
            f"binaries print")
    try:
        root = ElementTree.fromstring(text[start:end + len("</AllFlags>")])
    except ElementTree.ParseError as error:
        raise BinaryFactsError(f"{binary}: its --helpxml listing is not well-formed XML "
                               f"({error})") from None
    names = {(flag.findtext("name") or "").strip(): (flag.findtext("default") or "").strip()
             for flag in root.iter("flag")}
    names.pop("", None)
    if not names:
        raise BinaryFactsError(f"{binary}: its --helpxml listing names no flag; expected one "
                               f"<flag><name>...</name></flag> per flag")
    return names


def ask_binary(binary: Path, sha256: str, multi_rank: bool, cwd: Path,
               identified: str = "elf") -> BinaryFacts:
    """Run `binary --helpxml` (gflags prints the listing and exits 1) in `cwd`, under the
    reaper like every other process the harness starts."""
    # glog to stderr only: asking must leave no log files in the system temp folder
    env = {**os.environ, "GLOG_logtostderr": "1"}
    stdout, stderr = (cwd / f".{sha256}.{os.getpid()}.{name}" for name in ("stdout", "stderr"))
    try:
        done = run_process([binary, "--helpxml"], env, _LISTING_TIMEOUT_S, stdout, stderr, cwd=cwd)
        text = (stdout.read_text(errors="replace") + "\n"
                + stderr.read_text(errors="replace"))
    finally:
        stdout.unlink(missing_ok=True)
        stderr.unlink(missing_ok=True)
    if done.timed_out:
        raise BinaryFactsError(f"{binary}: `--helpxml` did not answer within "
                               f"{_LISTING_TIMEOUT_S:.0f} s; expected gflags' flag listing")
    not_started = [line for line in text.splitlines() if line.startswith("reaper: cannot start")]
    if done.returncode == CANNOT_START and not_started:
        raise BinaryFactsError(f"{binary}: cannot be run ({not_started[0].split(': ', 2)[-1]})")
    listing = listing_defaults(text, binary)
    return BinaryFacts(path=str(binary), sha256=sha256, flags=frozenset(listing),
                       multi_rank=multi_rank, defaults=tuple(sorted(listing.items())),
                       identified=identified)


def entry_name(binary: Path, sha256: str) -> str:
    """The store's file of a binary: its name and what runs (a listing may depend on either)."""
    return f"{binary.name}-{sha256}.json"


def learn_binary(binary: Path, store: Path) -> BinaryFacts:
    """The binary's facts: from `store` when this name and what it runs were asked before,
    else asked now and stored (once across processes)."""
    identity = identify(binary)
    sha256, multi_rank = identity.sha256, identity.multi_rank
    store.mkdir(parents=True, exist_ok=True)
    entry = store / entry_name(binary, sha256)
    with FileLock(str(store / f".{entry.stem}.lock")):
        try:
            facts = BinaryFacts.from_json(json.loads(entry.read_text()))
            return BinaryFacts(str(binary), facts.sha256, facts.flags, facts.multi_rank,
                               facts.defaults, identity.identified)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not asked yet, or a damaged entry: ask again
        facts = ask_binary(binary, sha256, multi_rank, cwd=store, identified=identity.identified)
        write_atomic(entry, json.dumps(facts.to_json(), indent=1) + "\n")
    return facts
