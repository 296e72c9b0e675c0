"""A failed reference that kept flags the flag table does not know names them and the
declaration that would drop them (harness.runner.case_runner.kept_unknown)."""

from __future__ import annotations

from harness.cases.config_types import Case, Compare
from harness.contracts.flags import DeclaredRoles
from harness.contracts.tolerance import Tolerance, Tolerances
from harness.runner.case_runner import kept_unknown


def _case(args, declared=DeclaredRoles({}, {}), world=1):
    return Case(tag="basic", case_id="3", model="gpt2", flags={}, world_size=world,
                tolerances=Tolerances(Tolerance(1e-5), Tolerance(1e-5)), compare=Compare(),
                source="test_groups[0].tests[0]", args=args, declared=declared)


def test_a_kept_unknown_flag_is_named_with_the_declaration_that_drops_it():
    text = kept_unknown(_case({"dtype": "float32", "cp_size": 2, "cp_mode": "ring"}))
    assert text == ("\nthe reference kept --cp_size, --cp_mode: not in the flag table, assumed "
                    "mathematics; if a flag only places work, declare it: --harness-flag-role "
                    "cp_size=topology (or the config's flag_roles)")


def test_known_or_declared_flags_add_nothing():
    assert kept_unknown(_case({"dtype": "float32", "context_parallel": 2}, world=2)) == ""
    declared = DeclaredRoles({"cp_size": "mathematics"}, {"cp_size": "--harness-flag-role"})
    assert kept_unknown(_case({"cp_size": 2}, declared)) == ""
