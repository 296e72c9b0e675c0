"""Planted bugs in the bundled trainer, for end-to-end tests of the module-level trace.

`write_shim(folder)` writes a `sitecustomize.py` into `folder`; with `folder` on the trainer's
PYTHONPATH (a config's `trainer.env`, as tests/runner/test_calibrate.py plants its bug) every
trainer process imports it at start. `HARNESS_TRACE_PLANT` (in the same env) picks the plant;
unset, the shim does nothing. Each plant patches a module when it is first imported (a meta
path finder), so an import of the trainer that never reaches that module pays nothing:

- `ln_eps=<layer>`: that layer's `ln_1` norm eps is 1e-1 instead of the checkpoint's (GPT-2's
  LayerNorm, LLaMA 3's RMSNorm) on every rank that holds the layer. First diverging module:
  `h.<layer>.ln_1` forward, on the pipeline rank holding the layer (every TP rank of it).
- `tp_allreduce=<rank>`: on TP rank <rank> only, the result of every row-parallel all-reduce
  (RowwiseParallel's output: `attn.c_proj` and `mlp.c_proj`) is scaled by 1.001. First
  diverging module: `h.<first layer of the stage>.attn.c_proj` forward, on that TP rank only.
- `pp_microbatch`: pipeline stage 0 sends microbatch 0's activation in place of microbatch 1's.
  First diverging module: the next stage's first module (`h.<k>.ln_1`) forward call 1
  (`_1` files), on pipeline rank 1; call 0 and every module of stage 0's forward match.
"""

from __future__ import annotations

from pathlib import Path

ENV = "HARNESS_TRACE_PLANT"
PLANTS = ("ln_eps", "tp_allreduce", "pp_microbatch")
LN_EPS = 1e-1
ALLREDUCE_SCALE = 1.001

SITECUSTOMIZE = '''
"""Planted trace bugs (tests/trace_plants/shim.py): HARNESS_TRACE_PLANT picks one."""
import importlib.abc, importlib.util, os, sys

PLANT = os.environ.get("HARNESS_TRACE_PLANT", "")
KIND, _, VALUE = PLANT.partition("=")


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
    layer = int(VALUE)
    build = models.build_model

    def build_model(*args, **kwargs):
        part = build(*args, **kwargs)
        for name, module in part.named_modules():
            if name == f"h.{layer}.ln_1":
                module.eps = @LN_EPS@
        return part
    models.build_model = build_model


def _tp_allreduce(style):
    rank = int(VALUE)
    original = style.RowwiseParallel._prepare_output_fn

    def prepare_output(output_layouts, use_local_output, mod, outputs, device_mesh):
        out = original(output_layouts, use_local_output, mod, outputs, device_mesh)
        if device_mesh.get_local_rank() == rank:
            out = out * @ALLREDUCE_SCALE@
        return out
    style.RowwiseParallel._prepare_output_fn = staticmethod(prepare_output)


def _pp_microbatch(stage):
    original = stage._PipelineStageBase.get_fwd_send_ops

    def get_fwd_send_ops(self, fwd_chunk_id):
        if self.stage_index == 0 and fwd_chunk_id == 1:
            fwd_chunk_id = 0  # microbatch 0's activation goes out as microbatch 1's
        return original(self, fwd_chunk_id)
    stage._PipelineStageBase.get_fwd_send_ops = get_fwd_send_ops


if KIND == "ln_eps":
    _after_import("harness.trainer.models", _ln_eps)
elif KIND == "tp_allreduce":
    _after_import("torch.distributed.tensor.parallel.style", _tp_allreduce)
elif KIND == "pp_microbatch":
    _after_import("torch.distributed.pipelining.stage", _pp_microbatch)
elif KIND:
    raise SystemExit(f"HARNESS_TRACE_PLANT={PLANT!r}: expected ln_eps=<layer>, "
                     "tp_allreduce=<tp rank> or pp_microbatch")
'''.replace("@LN_EPS@", repr(LN_EPS)).replace("@ALLREDUCE_SCALE@", repr(ALLREDUCE_SCALE))


def write_shim(folder: str | Path) -> Path:
    """`folder/sitecustomize.py` with the plants; returns its path. Put `folder` on the
    trainer's PYTHONPATH and set HARNESS_TRACE_PLANT to plant one."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sitecustomize.py"
    path.write_text(SITECUSTOMIZE)
    return path
