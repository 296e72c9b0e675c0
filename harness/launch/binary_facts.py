"""What a foreign trainer binary can do, learned from the binary itself and never from a failed
run: its flag listing (gflags' `--helpxml`) and whether it was built to run more than one rank
(a CUDA build names the CUDA runtime / NCCL / cuBLAS libraries in its bytes).

Learned once per binary content hash and kept beside the reference cache
(`<reference cache>/binaries/<sha256>.json`), so every session, worker and cache state makes
the same decisions: a nightly (always a second session) decides exactly as the first one did.
A file lock makes concurrent xdist workers ask the binary once.
"""

from __future__ import annotations

import hashlib
import json
import os
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from harness.spec.records import write_atomic

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
    # out is (the PyTorch baseline runs with InfiniTrain's defaults, harness.spec.infinitrain)
    defaults: tuple[tuple[str, str], ...] = ()

    def accepts(self, flag: str) -> bool:
        return flag in self.flags

    def default(self, flag: str) -> str | None:
        """The flag's default as the binary's listing states it, or None when it lists none."""
        return dict(self.defaults).get(flag)

    def to_json(self) -> dict:
        return {"format": FACTS_FORMAT, "path": self.path, "sha256": self.sha256,
                "flags": sorted(self.flags), "multi_rank": self.multi_rank,
                "defaults": dict(self.defaults)}

    @classmethod
    def from_json(cls, data: dict) -> "BinaryFacts":
        if data.get("format") != FACTS_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FACTS_FORMAT!r}")
        return cls(path=str(data["path"]), sha256=str(data["sha256"]),
                   flags=frozenset(map(str, data["flags"])), multi_rank=bool(data["multi_rank"]),
                   defaults=tuple(sorted((str(k), str(v))
                                         for k, v in dict(data["defaults"]).items())))


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


def ask_binary(binary: Path, sha256: str, multi_rank: bool, cwd: Path) -> BinaryFacts:
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
                       multi_rank=multi_rank, defaults=tuple(sorted(listing.items())))


def learn_binary(binary: Path, store: Path) -> BinaryFacts:
    """The binary's facts: from `store` when this content was asked before, else asked now
    and stored (once across processes)."""
    sha256, multi_rank = content_hash(binary)
    store.mkdir(parents=True, exist_ok=True)
    entry = store / f"{sha256}.json"
    with FileLock(str(store / f".{sha256}.lock")):
        try:
            facts = BinaryFacts.from_json(json.loads(entry.read_text()))
            return BinaryFacts(str(binary), facts.sha256, facts.flags, facts.multi_rank,
                               facts.defaults)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not asked yet, or a damaged entry: ask again
        facts = ask_binary(binary, sha256, multi_rank, cwd=store)
        write_atomic(entry, json.dumps(facts.to_json(), indent=1) + "\n")
    return facts
