"""Result records for the report tests, shaped as the plugin writes them (harness.result/2):
built from `new_record` so every key is present, with the compare summaries' exact keys; run
by the bundled trainer (`trainer: "harness"`, as the runner sets it). Records of a foreign
trainer (InfiniTrain) are in data/infinitrain_cpu_session.jsonl, as the plugin wrote them."""

from __future__ import annotations

import json
from pathlib import Path

from harness.results import new_record

ATOL = 1e-5
REF = [5.5117, 5.5071, 5.5003, 5.4903]


def _layout(chunks, pp, vpp=1):
    return {"format": "harness.pipeline_layout/1", "num_layers": 8, "pp": pp, "vpp": vpp,
            "chunks": [list(c) for c in chunks]}


def _loss(max_diff=0.0, mismatched_steps=(), nonfinite=()):
    mismatched_steps = list(mismatched_steps)
    return {"tolerance": {"atol": ATOL, "rtol": 0}, "steps": 4, "compared": 4,
            "mismatched": len(mismatched_steps), "mismatched_steps": mismatched_steps,
            "nonfinite_steps": list(nonfinite), "missing_steps": [], "extra_steps": [],
            "max_abs_diff": max_diff,
            "first_diverging_step": mismatched_steps[0] if mismatched_steps else None,
            "ok": not mismatched_steps}


def _param(name, stage, layer, max_diff, mismatched=0, elements=1024):
    return {"name": name, "shape": [32, 32], "elements": elements, "mismatched": mismatched,
            "nonfinite": 0, "max_abs_diff": max_diff, "worst_index": [3, 7],
            "worst_got": 0.125 + max_diff, "worst_ref": 0.125, "stage": stage, "layer": layer}


def _gradients(worst, mismatched=0):
    return {"tolerance": {"atol": ATOL, "rtol": 0}, "parameters": 100, "mismatched": mismatched,
            "elements": 113984, "mismatched_elements": sum(w["mismatched"] for w in worst),
            "max_abs_diff": max((w["max_abs_diff"] for w in worst), default=0.0),
            "missing": [], "extra": [], "shape_errors": [], "worst": worst,
            "ok": not mismatched}


def case(tag, model, case_id, status="passed", *, pp=2, tp=1, dp=1, chunks=None, vpp=1,
         tokens=1000.0, flags=None, session="20260101-010000-1", **values):
    """A record that ran (unless skipped): losses, diffs, logs and environment filled in."""
    name = f"{tag}/{model}/{case_id}"
    out = f"/runs/{session}/cases/{tag}/{model}/{case_id}"
    base_flags = {"dtype": "float32", "batch_size": 2, "sequence_length": 32,
                  "pipeline_parallel": pp, "tensor_parallel": tp, "data_parallel": dp,
                  **(flags or {})}
    record = new_record(
        session=session, worker="gw0", nodeid=f"configs/test_config.json::{name}", name=name,
        tag=tag, model=model, case_id=case_id, status=status, world_size=pp * tp * dp,
        parallel={"pp": pp, "tp": tp, "dp": dp, "vpp": vpp, "sequence_parallel": False},
        trainer="harness", passthrough_flags=[],
        flags=base_flags, device="cuda", compare={"loss": True, "gradients": True},
        tolerances={"loss": {"atol": ATOL, "rtol": 0}, "gradients": {"atol": ATOL, "rtol": 0}},
        started_at="2026-01-01T01:00:05+0000", finished_at="2026-01-01T01:00:35+0000",
    )
    if status == "skipped":
        record["reason"] = values.pop("reason", "needs 16 devices, but --gpus allows 8")
        record.update(values)
        return record
    if chunks is None:
        chunks = [(s, s * 8 // pp, (s + 1) * 8 // pp) for s in range(pp)]
    record.update(
        layout=_layout(chunks, pp, vpp), layout_text="pipeline layout: ...",
        loss=_loss(1e-7), gradients=_gradients([_param("h.0.mlp.c_fc.weight", "0", "0", 3e-8)]),
        losses=[x + 1e-7 for x in REF], reference_losses=list(REF), tokens_per_s=tokens,
        peak_memory_mb=2048.0, step_time_ms=500.0, returncode=0, timed_out=False,
        # 512 tokens a step, ±1% from step to step: a spread of ±1.2% (two standard errors)
        step_times_ms=[512e3 / tokens * f for f in (0.99, 1.0, 1.01)],
        command=["torchrun", "--nproc_per_node", str(pp * tp * dp)], output_dir=out,
        logs={"launcher_stdout": f"{out}/logs/launcher.stdout",
              "launcher_stderr": f"{out}/logs/launcher.stderr",
              "ranks": {"0": [f"{out}/logs/ranks/0.log"], "1": [f"{out}/logs/ranks/1.log"]}},
        environment={"torch": "2.13.0+cu128", "cuda": "12.8", "device_name": "NVIDIA H100",
                     "host": "gpu-01", "world_size": pp * tp * dp,
                     "mesh": {"pp": pp, "dp": dp, "tp": tp}},
        timings={"lease_wait_s": 0.1, "reference_s": 5.0, "run_s": 30.5, "compare_s": 0.2,
                 "total_s": 36.0},
    )
    record.update(values)
    return record


def diverged(record):
    """Make `record` a numerics failure: loss diverges from step 3, h.5 / h.6 on stage 1 worst."""
    worst = [_param("h.6.mlp.c_fc.weight", "1", "6", 0.03, mismatched=512),
             _param("h.5.attn.c_proj.weight", "1", "5", 0.002, mismatched=40),
             _param("wte.weight", "0+1 (tied embedding / lm head)", "-", 2e-6)]
    record.update(
        status="failed", reason="pipeline_layout/gpt2/pp2-costs-L4.5: the run differs from the "
                                "single-device reference",
        errors=["pipeline_layout/gpt2/pp2-costs-L4.5: the run differs\n  loss: mismatched 2 of 4"],
        loss=_loss(0.0042, mismatched_steps=[3, 4]),
        gradients=_gradients(worst, mismatched=2),
        losses=REF[:2] + [REF[2] + 0.001, REF[3] + 0.0042])
    return record


def passing_session(session="20260101-010000-1"):
    return [
        case("basic", "gpt2", "single", pp=1, tokens=1500.0, session=session),
        case("basic", "gpt2", "pp2", tokens=1000.0, session=session),
        case("pipeline_layout", "gpt2", "pp2-partition-3-5", chunks=[(0, 0, 3), (1, 3, 8)],
             tokens=1100.0, flags={"pipeline_layer_partition": "3,5"}, session=session),
        case("pipeline_layout", "gpt2", "pp2-costs-L4.5", chunks=[(0, 0, 6), (1, 6, 8)],
             tokens=1188.0, flags={"pipeline_layer_costs": "1x8,L:4.5"}, session=session),
        case("pipeline_layout", "llama3", "pp2-partition-3-5", chunks=[(0, 0, 3), (1, 3, 8)],
             tokens=800.0, flags={"pipeline_layer_partition": "3,5"}, session=session),
        case("pipeline_layout", "llama3", "pp2-costs-L4.5", chunks=[(0, 0, 6), (1, 6, 8)],
             tokens=900.0, flags={"pipeline_layer_costs": "1x8,L:4.5"}, session=session),
    ]


def failing_session(session="20260102-010000-2"):
    """The next night: costs-L4.5 on gpt2 diverges and slows down (1188 -> 950.4 tokens/s),
    pp2 gets faster, a skip, a harness error, and a case the earlier session did not have."""
    records = passing_session(session)
    records[1]["tokens_per_s"] = 1200.0
    diverged(records[3])
    records[3]["tokens_per_s"] = 950.4
    records += [
        case("basic", "gpt2", "pp4-dp4", "skipped", pp=4, dp=4, session=session),
        case("basic", "llama3", "tp2", "error", pp=1, tp=2, session=session,
             reason="basic/llama3/tp2: ReferenceError: the reference run of llama3 failed",
             errors=["basic/llama3/tp2: ReferenceError: the reference run of llama3 failed: "
                     "exit code 1"],
             loss=None, gradients=None, tokens_per_s=None, losses=None, reference_losses=None,
             timings={"total_s": 2.0}),
    ]
    return records


def write(path: Path, records, trailer: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + trailer)
    return path
