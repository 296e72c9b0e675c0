"""An InfiniTrain stand-in: Python programs that look, from outside, like InfiniTrain's ``gpt2`` /
``llama3`` trainers (numpy), feat/support_moe's ``tiny_mixtral`` (torch) and ``tools/infini_run``
(see /work/shared/INFINITRAIN.md), for CPU tests.

Executables: ``build.make_build_dir(path)`` -> ``path/gpt2``, ``path/llama3``, ``path/infini_run``
(also ``path/tools/infini_run/infini_run``). Or ``python -m tests.infinitrain_standin.trainer
{gpt2|llama3} FLAGS`` and ``python -m tests.infinitrain_standin.infini_run FLAGS -- PROGRAM ARGS``.

Builds: ``build.make_build_dir(path, flavour="pr209", cuda=True, models=("gpt2", "llama3"))``
(see build.py): ``flavour="master"`` has exactly the DEFINE_* of example/{gpt2,llama3}/main.cc at
b24d92f; ``"pr209"`` adds PR #209's pipeline_layer_partition / pipeline_layer_costs /
pipeline_chunk_layout / pipeline_model_parallel_layout (both) and dump_gradients (gpt2 only).
gflags' own 14 flags are accepted and listed (``--helpxml``, ``--helpfull``: exit 1); glog's are
not (glog is built WITH_GFLAGS=OFF: ``GLOG_*`` environment variables only). A CUDA build's
scripts name ``libcudart.so libnccl.so libcublas.so``; a CPU build (``cuda=False``) aborts every
multi-rank run and every single-device ``--device cuda`` run in ``device_guard.cc:161``. World
size below TP x PP dies of SIGFPE (global.cc:107). Layout flags:
only pipeline_layer_partition changes placement (pp*vpp per-chunk sizes, or pp per-stage sizes when
vpp=1; the sum must be n_layer); pipeline_layer_costs (n_layer positive numbers),
pipeline_chunk_layout and pipeline_model_parallel_layout are checked for form and then treated as
uniform; setting two layout flags is fatal.

Feature-branch flavours (build.py): ``lr_scheduler`` (feat/lr_scheduler a7949ac: five schedule
flags, lr_schedule.py's schedule printed on the step line and used by SGD, save default
./checkpoints and a checkpoint_final written by every run, no --save/--save_interval check),
``qwen3`` (feat/add_Qwen3-8B a3f84f8: no save/load/zero_stage flags, use_distributed_optimizer),
``support_moe`` (feat/support_moe b7e0760: master's gpt2/llama3 flags plus the ``tiny_mixtral``
program, tiny_mixtral.py: the real tiny Mixtral read from its checkpoint and trained in torch,
mixtral_math.py; ``make_build_dir(..., mixtral_config="file")`` plays a build compiled with the
checkpoint's own config so small files load), ``context_parallel`` (feat/context_parallel d03ba16: --context_parallel,
--cp_comm_type; TP-CP-DP-PP rank order, global.cc:126's divisibility CHECK, sequences split over
CP ranks and averaged over DP x CP, ``CP=`` on the step line) and ``activation_checkpointing``
(feat/activation_checkpointing e594d9c: the four recompute flags and their checks; numbers
unchanged). Each behaviour cites its branch source line in the code.

Loaders: master's checks in master's order and words (gpt2: n_kv_head stays 12, so n_head must be
12, config.h:36; llama3: original_vocab_size stays 128256, config.h:31; TP divisibility in the
TransformerModel constructor). Use the harness's ``infinitrain`` asset preset.

Differences from the real binaries worth knowing: the stand-in always computes on CPU (gpt2 and
llama3 a toy per-token model, see model.py: the forward / backward run once per distinct input
token and the lm head in row blocks of at most 64 MiB of logits; tiny_mixtral the real tiny
Mixtral, see tiny_mixtral.py for its own differences); with --dump_gradients the dump is taken when
the loop's step index is 0, after the optimizer step (a run resumed with --load dumps nothing, as
#209); for a parameter several ranks hold, exactly one holder's copy is written (replicated ones
whole, sharded ones that rank's TP shard), chosen by ``STANDIN_SHARD_WRITER``; checkpoints hold
``model.ckpt`` (numpy .npz of the rank's shards), ``optimizer.ckpt`` (empty .npz: SGD) and
``trainer_state.json`` in InfiniTrain's exact text, which has no comma after ``vocab_size`` (not
valid JSON, as the real one); resume requires the same topology (as InfiniTrain checks); log files
only when GLOG_log_dir is set (INFO / WARNING / ERROR files with glog's buffering, see glog.py).

``--precision_check "level=1,save_tensors=true,path=DIR"`` (master's flag, every flavour,
gpt2 / llama3): precision_check.py emulates master's module-level checker: its parsing and
failures, ``DIR/<YYYYMMDD_HHMMSS>/precision_check_rank_<R>.log`` and ``rank_<R>/<name>[_idx]_
<forward|backward>.npy`` with the real binary's names, order and shapes (copied from master's CPU
runs into precision_check_{gpt2,llama3}_order.txt), values from the stand-in model; TP slices,
DP ranks and PP stages' local block names (a stand-in convention for the PP order); not level 2's
function entries, SP or CP. The losses are those of a run without the flag, bit for bit.

Environment variables:
- ``STANDIN_PLANT="<param name>:<relative scale>"``: in runs with world > 1 only, that parameter's
  gradient is multiplied by (1 + scale) before the optimizer step (dump and later losses move).
- ``STANDIN_PLANT_RANKS=all|r0,r1,...`` (default all): only those TP ranks' copies are scaled (a
  replicated parameter's file is scaled when the writer is planted; the stand-in's single weight
  copy takes the planted update when any rank is planted; a sharded one: those ranks' slices).
- ``STANDIN_SHARD_WRITER=random|highest|lowest`` (default random, seeded from the process id, or
  under infini_run the launcher's): which holder's copy a dumped file holds.
- ``STANDIN_CRASH_RANK=r`` [``STANDIN_CRASH_STEP=s``, default 1]: the process playing global rank
  r logs ``F... Check failed: planted crash on rank r`` and aborts (SIGABRT) at step s.
- ``STANDIN_CRASH_SIGNAL=SEGV|ABRT|FPE`` (with ``STANDIN_CRASH_STEP``, ``STANDIN_CRASH_RANK``,
  default rank 0): at that step the rank logs ``Rank r: start forward`` (INFO: in the log file
  only with ``GLOG_logbuflevel=-1``) and dies of the signal, nothing on stderr.
- ``STANDIN_CPU_BF16_BROKEN=1``: bf16 on a CPU device breaks as InfiniTrain's does (llama3:
  SIGSEGV in the first forward; gpt2: ``train loss -nan`` lines and a SIGSEGV at a varying step).
  Off by default: bf16 works on the stand-in.
- ``STANDIN_NORM_EPS=e``: the final norm's epsilon (default 1e-5): a kernel-level plant that
  every configuration shares (tests/baseline: the baseline check sees it, the self-check not).
- ``STANDIN_PLANT_RECOMPUTE=scale``: with --activation_recompute (activation_checkpointing
  flavour), every update is scaled by (1 + scale), one device too.
- ``STANDIN_PLANT_LR=warmup_short|cosine_floor`` (lr_scheduler flavour, every run, one device
  too; lr_schedule.py): ``warmup_short`` hands the warmup over to the main schedule one step
  early (W - 1 warmup steps: step W already prints and trains at max_lr), ``cosine_floor``
  decays the cosine to 2 x min_lr instead of min_lr (the last steps stay above it). The printed
  lr and SGD's both follow the planted schedule: the self-check cannot see it, the baseline's lr
  comparison can (tests/infinitrain/test_baseline_plants.py).
- ``STANDIN_PLANT_ROUTER=other_order`` (tiny_mixtral): the MoE router takes the softmax over every
  expert and then the top k (moe_utils.cc's router_pre_softmax branch) instead of the source's
  top k of the logits then the softmax; every run shares it, the baseline's losses see it.
- ``STANDIN_PLANT_MODULE=<module qualified name>:<scale>`` (gpt2 / llama3, every run, one device
  too): that module's forward output is multiplied by scale, e.g. ``transformer.h.0.mlp.gelu:1.0001``
  or the first norm ``transformer.h.0.ln_1:1.0001`` (the stand-in's ln_1 plays LayerNorm for gpt2
  and RMSNorm for llama3). Plantable: transformer.wte, transformer.wpe (gpt2),
  TransformerFirstStage, transformer.h.<i> and its ln_1, attn.c_attn, attn.c_proj, attn, ln_2,
  mlp.c_fc, mlp.gelu (gpt2) / mlp.c_fc2, mlp.silu (llama3), mlp.c_proj, mlp; transformer.ln_f;
  anything else exits 2. Its backward is left as it was (a forward kernel bug). The loss moves by
  ~1e-6 relative or not at all; the module's ``--precision_check`` entry moves by the scale and
  every entry before it stays bit for bit (tests/infinitrain_standin/test_precision_check_standin.py).
- ``STANDIN_MIXTRAL_CONFIG=file`` (tiny_mixtral): the compiled-in config (config.h's
  TinyMixtralConfig, which the loader CHECKs the header against) is taken to be the checkpoint's
  own header: the emulation of a build compiled with a small config.h (what
  ``make_build_dir(..., mixtral_config="file")`` bakes into the folder's script). Unset: config.h's
  values, so only the 3.4 GB file's header passes.
- ``STANDIN_NO_STEP_LINES=1``: train, print no step line.
- ``STANDIN_SLEEP=seconds``: sleep before training.
"""
