"""An InfiniTrain stand-in: numpy programs that look, from outside, like InfiniTrain's ``gpt2`` /
``llama3`` trainers and ``tools/infini_run`` (see /work/shared/INFINITRAIN.md), for CPU tests.

Executables: ``build.make_build_dir(path)`` -> ``path/gpt2``, ``path/llama3``, ``path/infini_run``
(also ``path/tools/infini_run/infini_run``). Or ``python -m tests.infinitrain_standin.trainer
{gpt2|llama3} FLAGS`` and ``python -m tests.infinitrain_standin.infini_run FLAGS -- PROGRAM ARGS``.

Flags: exactly the DEFINE_* of example/{gpt2,llama3}/main.cc at b24d92f, plus PR #209's
pipeline_layer_partition / pipeline_layer_costs / pipeline_chunk_layout /
pipeline_model_parallel_layout (both) and dump_gradients (gpt2 only); glog's own flags
(logtostderr, log_dir, v, ...) are accepted as gflags-linked binaries accept them. Layout flags:
only pipeline_layer_partition changes placement (pp*vpp per-chunk sizes, or pp per-stage sizes when
vpp=1; the sum must be n_layer); pipeline_layer_costs (n_layer positive numbers),
pipeline_chunk_layout and pipeline_model_parallel_layout are checked for form and then treated as
uniform; setting two layout flags is fatal.

Differences from the real binaries worth knowing: the stand-in always computes on CPU; with
--dump_gradients the dump is taken after the first step this run executes (also on resume); for a
parameter several ranks hold, the file is written once, by the highest global rank holding it (the
deterministic "last writer": highest TP shard); checkpoints hold ``model.ckpt`` (numpy .npz of the
rank's shards), ``optimizer.ckpt`` (empty .npz: SGD) and ``trainer_state.json`` in InfiniTrain's
exact text, which has no comma after ``vocab_size`` (not valid JSON, as the real one); resume
requires the same topology (as InfiniTrain checks); log files only when GLOG_log_dir is set.

Planted faults (environment variables):
- ``STANDIN_PLANT="<param name>:<relative scale>"``: in runs with world > 1 only, that parameter's
  gradient is multiplied by (1 + scale) before the optimizer step (dump and later losses move).
- ``STANDIN_CRASH_RANK=r`` [``STANDIN_CRASH_STEP=s``, default 1]: the process playing global rank
  r logs ``F... Check failed: planted crash on rank r`` and aborts (SIGABRT) at step s.
- ``STANDIN_NO_STEP_LINES=1``: train, print no step line.
- ``STANDIN_SLEEP=seconds``: sleep before training.
"""
