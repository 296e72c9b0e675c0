"""benchmarks/mutation.py's own logic (no mutmut run): which mutant names are in scope, which
survivors count as explained, and that every explanation names a mutant in scope and a line
of today's code (so a stale one fails here instead of hiding a survivor)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import mutation  # noqa: E402

SEP = mutation.SEP


def test_scope_and_only():
    assert mutation.in_scope("harness.compare.diff.x_within__mutmut_3", [])
    run = f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}_run__mutmut_7"
    assert mutation.in_scope(run, [])
    assert not mutation.in_scope(f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}announce__mutmut_1", [])
    assert not mutation.in_scope("harness.contracts.flags.x_parse__mutmut_1", [])
    assert mutation.in_scope("harness.contracts.flags.x_role_of__mutmut_2", [])
    assert not mutation.in_scope(run, ["harness.compare.*"])
    assert mutation.module_of(run) == "harness.runner.case_runner"


def test_equivalents_name_mutants_in_scope_and_todays_code():
    for pattern, text, why in mutation.EQUIVALENT:
        module = pattern.split(".x", 1)[0]
        assert mutation.in_scope(pattern.replace("*", "1"), []), pattern
        source = (REPO / (module.replace(".", "/") + ".py")).read_text()
        # the mutated line differs from the original by the mutation: its other tokens exist
        # (less what mutmut inserts: XX markers, upper-casing, True / False / None)
        words = text.replace("XX", " ").replace("(", " ").replace(")", " ").split()
        original_tokens = [t.lower() for t in words if t.isidentifier() and len(t) > 3
                           and t not in ("True", "False", "None")]
        assert all(t in source.lower() for t in original_tokens), (pattern, original_tokens)
        assert len(why) > 20  # a reason, not a label


def test_a_survivor_is_explained_only_by_its_own_pattern_and_line():
    pattern, text, why = mutation.EQUIVALENT[0]
    name = pattern.replace("*", "4")
    diff = f"--- a\n+++ b\n-    original\n+    {text}\n"
    assert mutation.equivalent_reason(name, diff) == why
    assert mutation.equivalent_reason(name, "-    original\n+    something else\n") is None
    assert mutation.equivalent_reason("harness.compare.diff.x_within__mutmut_4", diff) is None
