"""A case and its reference go through the same stage functions (harness.runner.stages: lease,
port, launch, collect), and every stage returns a frozen result that the record is assembled
from once, at the end. The fake trainer (tests/plugin/fake_trainer.py) is the launched program,
as in tests/runner/test_run_record.py."""

from __future__ import annotations

import dataclasses

import pytest

from harness.runner import stages
from harness.runner.record import assemble
from tests.runner.test_run_record import PP2, Foreign, _runner

pytestmark = pytest.mark.subprocess  # the cases launch the fake trainer

SHARED = ("lease", "port", "launch", "collect")


def _record_stage_calls(monkeypatch) -> list[tuple[str, str]]:
    """Every call of a shared stage function as (the launch's name, the stage)."""
    calls = []

    @dataclasses.dataclass
    class Recording:
        name: str
        real: object

        def __call__(self, *args, **kwargs):
            target = next(a for a in args if isinstance(a, (stages.RunTarget, stages.Launched)))
            calls.append((target.name if isinstance(target, stages.RunTarget)
                          else target.spec.case, self.name))
            return self.real(*args, **kwargs)

    for name in SHARED:
        monkeypatch.setattr(stages, name, Recording(name, getattr(stages, name)))
    return calls


def test_a_case_and_its_reference_go_through_the_same_stage_functions(tmp_path, monkeypatch):
    calls = _record_stage_calls(monkeypatch)
    runner, cases = _runner(tmp_path, [{"tag": "fake", "tests": [{"id": "ok", "args": PP2}]},
                                       {"tag": "topo", "reference": PP2,
                                        "tests": [{"id": "ok", "args": PP2}]}], Foreign)
    for case in cases.values():
        assert runner.run(case).status == "passed"
    # one device's reference, then its case; a trusted topology's reference, then its case
    assert calls == [(name, stage) for name in ("reference", "fake/gpt2/ok", "reference",
                                                "topo/gpt2/ok") for stage in SHARED]
    # ... the same functions, not a second copy, whatever the world size or the port: what
    # differs is in what they were given (the references' commands; no port: "0")
    first, topology = (runner.run(case).record["reference"]["command"]
                       for case in cases.values())
    assert [first[first.index(flag) + 1] for flag in ("--world_size", "--port")] == ["1", "0"]
    assert topology[topology.index("--world_size") + 1] == "2"
    assert int(topology[topology.index("--port") + 1]) > 1024  # a rendezvous port


def test_a_baseline_run_goes_through_the_same_stage_functions(tmp_path, monkeypatch):
    """LiveBaseline's runs (run_one_device): one process, no gradients, no port."""
    calls = _record_stage_calls(monkeypatch)
    runner, cases = _runner(tmp_path, [{"tag": "fake", "tests": [{"id": "ok", "args": {}}]}],
                            Foreign)
    case = cases["fake/gpt2/ok"]
    checkpoint, input_bin = runner.model_files(case.model)
    ran = runner.run_one_device(runner.backend, "baseline", case.model, dict(case.flags),
                                checkpoint, input_bin, tmp_path / "baseline")
    assert calls == [("baseline", stage) for stage in SHARED]
    spec = ran.launched.spec
    assert (spec.world_size, spec.gradients_dir, spec.port) == (1, None, None)
    assert not ran.failed and ran.outputs.steps


def test_the_record_is_assembled_from_frozen_stage_results(tmp_path, monkeypatch):
    """Every stage's result is frozen: no stage can change what another gave, and the record
    made from them is the same each time it is assembled."""
    runner, cases = _runner(tmp_path, [{"tag": "fake", "tests": [{"id": "ok", "args": PP2}]}],
                            Foreign)
    case = cases["fake/gpt2/ok"]
    results = {}
    for name in ("plan", "reference", "collect", "judge", "settle"):
        real = getattr(runner, name)
        monkeypatch.setattr(runner, name, lambda *args, _real=real, _name=name, **kwargs:
                            results.setdefault(_name, _real(*args, **kwargs)))
    run, ran = stages.run, []  # the reference's run, then the case's
    monkeypatch.setattr(stages, "run", lambda *args, **kwargs: ran.append(run(*args, **kwargs))
                        or ran[-1])
    outcome = runner.run(case)
    assert outcome.status == "passed", outcome.message
    assert [r.launched.spec.case for r in ran] == ["reference", case.name]
    results["run"] = ran[-1]
    assert set(results) == {"plan", "reference", "run", "collect", "judge", "settle"}
    for name, result in {**results, "target": results["plan"].target,
                         "launched": results["run"].launched,
                         "leased": results["run"].launched.leased}.items():
        assert dataclasses.is_dataclass(result) and result.__dataclass_params__.frozen, name
        field = dataclasses.fields(result)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(result, field, None)
    # the record is what the results give: assembled again from them, it is the same
    reached = stages.Reached(results["plan"].layout)
    reached.plan, reached.reference = results["plan"], results["reference"]
    reached.leased, reached.launched = results["run"].launched.leased, results["run"].launched
    reached.collected, reached.judged = results["collect"], results["judge"]
    reached.settled, reached.compare_s = results["settle"], outcome.record["timings"]["compare_s"]
    again = assemble(case, runner.settings, "", runner.backend.name, reached, outcome,
                     outcome.record["started_at"], outcome.record["timings"]["total_s"])
    assert {**again.to_json(), "finished_at": None} == {**outcome.record, "finished_at": None}


def test_a_stage_result_is_validated_on_construction(tmp_path):
    with pytest.raises(ValueError, match="world size 0"):
        stages.RunTarget("reference", "gpt2", {}, 0, tmp_path, tmp_path, tmp_path,
                         gradients=True, port=False)
    with pytest.raises(ValueError, match="waited -1"):
        stages.Leased((0,), -1)
    with pytest.raises(ValueError, match="no failure"):
        stages.Collected(None, None, None, failing_rank="0")
