"""A foreign binary's facts, learned from the binary (its --helpxml listing, its bytes), once per
name and content (what actually runs: a wrapper script followed to what it execs), kept in a
store every session and worker shares."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from harness.launch.binary_facts import (
    BinaryFactsError,
    content_hash,
    entry_name,
    identify,
    learn_binary,
    parse_helpxml,
)
from tests.reliability.checks import alive

LISTING = """<?xml version="1.0"?>
<AllFlags>
<program>gpt2</program>
<usage>Warning: SetUsageMessage() never called</usage>
<flag><file>example/gpt2/main.cc</file><name>lora_rank</name><meaning>LoRA rank (0 = disabled)</meaning><default>0</default><current>0</current><type>int32</type></flag>
<flag><file>example/gpt2/main.cc</file><name>dump_gradients</name><meaning>dir &amp; more</meaning><default></default><current></current><type>string</type></flag>
<flag><file>src/gflags.cc</file><name>undefok</name><meaning>x</meaning><default></default><current></current><type>string</type></flag>
</AllFlags>
"""


def _binary(path: Path, listing: str, extra: str = "") -> Path:
    """A script that counts how often it is asked, prints `listing` and exits 1 (as gflags)."""
    (path.parent / "listing.txt").write_text(listing)
    path.write_text("#!/bin/sh\n"
                    f"echo asked >> {path.parent / 'asked.log'}\n"
                    f"cat {path.parent / 'listing.txt'}\n"
                    f"{extra}\n"
                    "exit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_listing_names_every_flag_and_unescapes_xml():
    assert parse_helpxml(LISTING, Path("gpt2")) == {"lora_rank", "dump_gradients", "undefok"}


@pytest.mark.parametrize("text, expected", [
    ("", "answers no flag listing (`gpt2 --helpxml` printed 'nothing'); expected gflags' XML"),
    ("usage: gpt2 [options]\n", "printed 'usage: gpt2 [options]'"),
    ("<AllFlags><flag><name>x</flag></AllFlags>", "is not well-formed XML"),
    ("<AllFlags></AllFlags>", "names no flag; expected one <flag><name>"),
])
def test_a_binary_without_a_listing_gets_one_clear_line(text, expected):
    with pytest.raises(BinaryFactsError) as raised:
        parse_helpxml(text, Path("/build/gpt2"))
    assert str(raised.value).startswith("/build/gpt2: ")
    assert expected in str(raised.value)


def test_a_cuda_build_is_known_by_the_libraries_its_bytes_name(tmp_path):
    cpu, cuda = tmp_path / "cpu", tmp_path / "cuda"
    cpu.write_bytes(b"\x7fELF" + b"\0" * 100 + b"libstdc++.so.6")
    # the marker straddles the 1 MiB read blocks: it must still be found
    cuda.write_bytes(b"\0" * ((1 << 20) - 4) + b"libcudart.so.12" + b"\0" * 10)
    assert content_hash(cpu)[1] is False
    assert content_hash(cuda)[1] is True
    assert content_hash(cpu)[0] != content_hash(cuda)[0]


def test_facts_are_learned_once_per_content_and_shared_by_every_session(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    binary = _binary(build / "gpt2", LISTING, extra="# links libnccl.so")
    store = tmp_path / "cache" / "binaries"
    first = learn_binary(binary, store)
    assert first.accepts("dump_gradients") and not first.accepts("pipeline_layer_partition")
    assert first.multi_rank
    # a second session (a new process would read the same store): the binary is not asked
    again = learn_binary(binary, store)
    assert again == first
    assert (build / "asked.log").read_text().splitlines() == ["asked"]
    entry = json.loads((store / entry_name(binary, first.sha256)).read_text())
    assert entry["flags"] == sorted(first.flags) and entry["multi_rank"] is True
    # a rebuild (new content) is asked again, and a binary without the flag says so
    _binary(binary, LISTING.replace("dump_gradients", "save"))
    rebuilt = learn_binary(binary, store)
    assert not rebuilt.accepts("dump_gradients") and not rebuilt.multi_rank
    assert (build / "asked.log").read_text().splitlines() == ["asked", "asked"]


def test_a_damaged_store_entry_is_asked_again_not_trusted(tmp_path):
    binary = _binary(tmp_path / "gpt2", LISTING)
    store = tmp_path / "binaries"
    facts = learn_binary(binary, store)
    (store / entry_name(binary, facts.sha256)).write_text("{not json")
    assert learn_binary(binary, store) == facts
    assert (tmp_path / "asked.log").read_text().splitlines() == ["asked", "asked"]


def test_a_binary_that_answers_no_listing_is_not_stored(tmp_path):
    binary = _binary(tmp_path / "gpt2", "ERROR: unknown command line flag 'helpxml'\n")
    store = tmp_path / "binaries"
    with pytest.raises(BinaryFactsError, match="answers no flag listing"):
        learn_binary(binary, store)
    assert not list(store.glob("*.json"))


def test_a_binary_that_cannot_be_executed_says_why_and_leaves_no_file(tmp_path):
    binary = tmp_path / "gpt2"
    binary.write_text("not a program\n")  # no execute bit
    store = tmp_path / "binaries"
    with pytest.raises(BinaryFactsError, match=r"gpt2: cannot be run \(.*Permission denied"):
        learn_binary(binary, store)
    assert sorted(p.name for p in store.iterdir() if not p.name.endswith(".lock")) == []


def test_a_binary_that_never_answers_is_ended_with_what_it_started(tmp_path, monkeypatch):
    from harness.launch import binary_facts

    pid_file = tmp_path / "child.pid"
    binary = _binary(tmp_path / "gpt2", "", extra=f"sleep 300 & echo $! > {pid_file}; wait")
    monkeypatch.setattr(binary_facts, "_LISTING_TIMEOUT_S", 1.0)
    with pytest.raises(BinaryFactsError, match=r"--helpxml` did not answer within 1 s"):
        learn_binary(binary, tmp_path / "binaries")
    assert not alive(int(pid_file.read_text()))  # the binary's own child is ended too


def _listing_by_name(path: Path) -> Path:
    """One script that prints gpt2's listing as `gpt2` and a listing without dump_gradients
    under any other name (a multi-call binary, a wrapper reading `basename $0`)."""
    (path.parent / "gpt2.txt").write_text(LISTING)
    (path.parent / "other.txt").write_text(LISTING.replace("dump_gradients", "save"))
    path.write_text("#!/bin/sh\n"
                    f"case $(basename $0) in gpt2) cat {path.parent / 'gpt2.txt'};; "
                    f"*) cat {path.parent / 'other.txt'};; esac\n"
                    "exit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_one_file_under_two_names_gets_two_facts(tmp_path):
    """Planted (issue 35): facts keyed by the content hash alone; `llama3`, the same file as
    `gpt2`, then took gpt2's listing and its cases were launched with --dump_gradients."""
    build = tmp_path / "build"
    build.mkdir()
    gpt2 = _listing_by_name(build / "gpt2")
    llama3 = build / "llama3"
    llama3.hardlink_to(gpt2)
    store = tmp_path / "binaries"
    assert learn_binary(gpt2, store).accepts("dump_gradients")
    other = learn_binary(llama3, store)
    assert not other.accepts("dump_gradients") and other.accepts("save")
    assert len(list(store.glob("*.json"))) == 2


def _elf(path: Path, payload: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF" + payload)
    return path


@pytest.mark.parametrize("exec_line", [
    'exec {opt}/$(basename $0) "$@"',
    'exec "{opt}/$(basename "$0")" "$@"',
    'exec {opt}/${{0##*/}} "$@"',
])
def test_a_wrapper_is_known_by_the_elf_it_execs(tmp_path, exec_line):
    """A cluster module's wrapper: its bytes never change when the binary behind it is
    rebuilt, so what it execs is hashed, and how it was identified is said."""
    opt = tmp_path / "opt" / "bin"
    elf = _elf(opt / "gpt2", b"build 1 libnccl.so")
    wrapper = tmp_path / "bin" / "gpt2"
    wrapper.parent.mkdir()
    wrapper.write_text("#!/bin/sh\n# a module wrapper\n" + exec_line.format(opt=opt) + "\n")
    first = identify(wrapper)
    assert first.identified == f"script -> {elf}"
    assert first.multi_rank  # the ELF's CUDA libraries, not the script's
    _elf(elf, b"build 2 libnccl.so")  # rebuilt behind the same wrapper
    assert identify(wrapper).sha256 != first.sha256
    assert identify(elf).identified == "elf"
    assert identify(elf).sha256 == content_hash(elf)[0]


def test_a_script_without_exec_is_known_by_its_own_bytes_and_says_so(tmp_path):
    binary = _binary(tmp_path / "gpt2", LISTING)
    identity = identify(binary)
    assert identity.sha256 == content_hash(binary)[0]
    assert identity.identified.startswith(f"script ({binary}: no exec line")


def test_a_wrapper_whose_target_is_rebuilt_gives_a_new_version_and_facts(tmp_path):
    """Planted (issue 35): the version and facts keyed by the wrapper's own bytes; a rebuild of
    the binary behind it kept the old build's listing and reference key (false passes against
    stale references). The second session's backend must have a new version."""
    from harness.launch.infinitrain import InfiniTrainBackend

    opt = tmp_path / "opt"
    opt.mkdir()
    build = tmp_path / "build"
    build.mkdir()
    for name in ("gpt2", "llama3"):
        _listing_by_name(opt / name)
        wrapper = build / name
        wrapper.write_text(f'#!/bin/sh\nexec {opt}/$(basename $0) "$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    store = tmp_path / "binaries"
    first = InfiniTrainBackend(build, facts_dir=store)
    before = first.version()
    assert first.facts("gpt2").identified.startswith(f"script -> {opt / 'gpt2'} (")
    assert first.facts("gpt2").accepts("dump_gradients")
    (opt / "gpt2.txt").write_text(LISTING.replace("dump_gradients", "save"))
    real = opt / "gpt2"  # rebuilt: new bytes behind the same wrapper
    real.write_text(real.read_text().replace("exit 1", "exit 1  # rebuilt"))
    second = InfiniTrainBackend(build, facts_dir=store)
    assert second.version() != before
    assert not second.facts("gpt2").accepts("dump_gradients")  # asked again, not the old one
    assert second.identities()["gpt2"].startswith(f"script -> {real} (")


def test_the_session_header_names_what_each_wrapper_execs(tmp_path):
    """The session header's trainer identity (case_runner.trainer_identity) carries the version
    that covers a wrapper's target, and how each binary was identified."""
    from harness.cases import load_config
    from harness.runner.case_runner import trainer_identity

    opt, build = tmp_path / "opt", tmp_path / "build"
    build.mkdir()
    elf = _elf(opt / "gpt2", b"build 1")
    (build / "gpt2").write_text(f'#!/bin/sh\nexec {opt}/$(basename $0) "$@"\n')
    (tmp_path / "cases.json").write_text(json.dumps({
        "models": ["gpt2"], "trainer": {"backend": "infinitrain", "build": str(build)},
        "test_groups": [{"tag": "t", "tests": [{"id": "one", "args": {}}]}]}))
    identity = trainer_identity(load_config(tmp_path / "cases.json"), "cpu")
    assert identity["identified"] == {"gpt2": f"script -> {elf}"}
    _elf(elf, b"build 2")
    assert trainer_identity(load_config(tmp_path / "cases.json"), "cpu")["version"] \
        != identity["version"]
