"""Planted bugs in the bundled trainer, for end-to-end tests of the module-level trace.

`write_shim(folder)` writes a `sitecustomize.py` into `folder`; with `folder` on the trainer's
PYTHONPATH (a config's `trainer.env`, as tests/runner/test_calibrate.py plants its bug, or the
session's own PYTHONPATH, so that the zygote, which imports it once, still serves the runs)
every trainer process imports it at start. `HARNESS_TRACE_PLANT` picks the plant; unset, the
shim does nothing. Each plant patches a module when it is first imported (a meta path finder),
so an import of the trainer that never reaches that module pays nothing, and decides whether to
act when the patched code runs, from the run's environment (a zygote's ranks get theirs only
then):

- `ln_eps=<layer>`: that layer's `ln_1` norm eps is 1e-1 instead of the checkpoint's (GPT-2's
  LayerNorm, LLaMA 3's RMSNorm) on every rank that holds the layer, in runs of more than one
  process only (WORLD_SIZE > 1: torchrun and the zygote set it on each rank; a one-process run
  has none or 1), so the single-device reference keeps the checkpoint's eps and the self-check
  sees the plant. First diverging module: `h.<layer>.ln_1` forward, on the pipeline rank
  holding the layer (every TP rank of it).
- `tp_allreduce=<rank>`: on TP rank <rank> only, the result of every row-parallel all-reduce
  (RowwiseParallel's output: `attn.c_proj` and `mlp.c_proj`) is scaled by 1.001. First
  diverging module: `h.<first layer of the stage>.attn.c_proj` forward, on that TP rank only.
- `pp_microbatch`: pipeline stage 0 sends microbatch 0's activation in place of microbatch 1's.
  First diverging module: the next stage's first module (`h.<k>.ln_1`) forward call 1
  (`_1` files), on pipeline rank 1; call 0 and every module of stage 0's forward match.

`HARNESS_TRACE_PLANT` may name several plants, comma-separated, each with an optional
`@<case id>`: that plant then acts only in the runs of that case (HARNESS_CASE, which the
harness sets per run, `<tag>/<model>/<id>`, its trace rerun `<tag>/<model>/<id>-trace`), so one
session's config (`trainer.env`) plants a different bug in each case:
`ln_eps=5@ln5,tp_allreduce=1@tp2,pp_microbatch@pp2`. Without `@`, a plant acts in every run.
"""

from __future__ import annotations

from pathlib import Path

ENV = "HARNESS_TRACE_PLANT"
PLANTS = ("ln_eps", "tp_allreduce", "pp_microbatch")
LN_EPS = 1e-1
ALLREDUCE_SCALE = 1.001

SITECUSTOMIZE = '''
"""Planted trace bugs (tests/trace_plants/shim.py): HARNESS_TRACE_PLANT picks them."""
import importlib.abc, importlib.util, os, sys

KINDS = ("ln_eps", "tp_allreduce", "pp_microbatch")


def _plants():
    """{kind: value} of the plants that act in this run (HARNESS_TRACE_PLANT, HARNESS_CASE)."""
    text = os.environ.get("HARNESS_TRACE_PLANT", "")
    case = os.environ.get("HARNESS_CASE", "").rpartition("/")[2]
    plants = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        plant, _, only = item.partition("@")
        kind, _, value = plant.partition("=")
        if kind not in KINDS:
            raise SystemExit(f"HARNESS_TRACE_PLANT={text!r}: expected ln_eps=<layer>, "
                             "tp_allreduce=<tp rank> or pp_microbatch, each with an optional "
                             "@<case id>, comma-separated")
        if not only or case == only or case.startswith(only + "-"):
            plants[kind] = value
    return plants


def _after_import(name, patch):
    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                patch(module)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, Finder())


def _ln_eps(models):
    build = models.build_model

    def build_model(*args, **kwargs):
        part = build(*args, **kwargs)
        value = _plants().get("ln_eps")
        if value is None or int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
            return part  # one process: the single-device reference keeps the checkpoint's eps
        for name, module in part.named_modules():
            if name == f"h.{int(value)}.ln_1":
                module.eps = @LN_EPS@
        return part
    models.build_model = build_model


def _tp_allreduce(style):
    original = style.RowwiseParallel._prepare_output_fn

    def prepare_output(output_layouts, use_local_output, mod, outputs, device_mesh):
        out = original(output_layouts, use_local_output, mod, outputs, device_mesh)
        value = _plants().get("tp_allreduce")
        if value is not None and device_mesh.get_local_rank() == int(value):
            out = out * @ALLREDUCE_SCALE@
        return out
    style.RowwiseParallel._prepare_output_fn = staticmethod(prepare_output)


def _pp_microbatch(stage):
    original = stage._PipelineStageBase.get_fwd_send_ops

    def get_fwd_send_ops(self, fwd_chunk_id):
        if self.stage_index == 0 and fwd_chunk_id == 1 and "pp_microbatch" in _plants():
            fwd_chunk_id = 0  # microbatch 0's activation goes out as microbatch 1's
        return original(self, fwd_chunk_id)
    stage._PipelineStageBase.get_fwd_send_ops = get_fwd_send_ops


_plants()  # a malformed HARNESS_TRACE_PLANT stops the process at start
_after_import("harness.trainer.models", _ln_eps)
_after_import("torch.distributed.tensor.parallel.style", _tp_allreduce)
_after_import("torch.distributed.pipelining.stage", _pp_microbatch)
'''.replace("@LN_EPS@", repr(LN_EPS)).replace("@ALLREDUCE_SCALE@", repr(ALLREDUCE_SCALE))


def write_shim(folder: str | Path) -> Path:
    """`folder/sitecustomize.py` with the plants; returns its path. Put `folder` on the
    trainer's PYTHONPATH and set HARNESS_TRACE_PLANT to plant one."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sitecustomize.py"
    path.write_text(SITECUSTOMIZE)
    return path
