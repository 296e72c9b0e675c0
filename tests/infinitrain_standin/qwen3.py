"""The stand-in ``qwen3``: ``python -m tests.infinitrain_standin.qwen3 @build:F:D FLAGS...`` (what a
qwen3-flavour build folder's ``qwen3`` script execs). It plays InfiniTrain feat/add_Qwen3-8B
(a3f84f8) ``example/qwen3/main.cc`` on one device:

- gflags-strict with exactly that program's 29 flags (feat/add_Qwen3-8B:example/qwen3/main.cc:42-86;
  the real CPU build's ``--helpxml`` lists the same names, defaults and types), ``--model``'s
  validator (:99: only ``qwen3``) and ``--device``'s (:100-101: cpu or cuda).
- the loader's first checks, in its words: the file (checkpoint_loader.cc:45-46), the magic and
  the version (:52-55: 20240804, 3; config.h's kQwen3Magic / kQwen3FP32Version).
- gradient accumulation total_batch_size / (batch_size x sequence_length) (main.cc:160-162), each
  microbatch's loss divided by it (:353), Adam with betas (0.9, 0.95) and eps 1e-8 (:263), the
  step line through glog at ERROR (:393-398, `peak used` 0 on CPU), to stderr and glog's files.
- the data loader's order as the gpt2 / llama3 stand-in reads it (trainer.py unit_batch).

What it trains is the real Qwen3: the checkpoint's float32 weights (read through
harness.contracts.llmc, the loader's stacked order, after the checks above) turned back into
Hugging Face's layout (each head's q / k rows and q / k norm gains from interleaved pairs to
rotate_half's halves) and trained as transformers' Qwen3ForCausalLM (eager attention, untied
head): an implementation independent of the bundled trainer's, so a baseline check against it
is a real one. bfloat16 is torch.autocast over the float32 weights.

Differences from the real binary: one device only (the CPU build aborts every multi-rank run in
device_guard.cc:161, as the gpt2 / llama3 stand-in does; on a CUDA stand-in build a multi-rank
run exits 2); no LoRA (``--lora_rank`` > 0 exits 2) and no ``--precision_check`` (exits 2); a run
without ``--llmc_filepath`` exits 2 (InfiniTrain would build Qwen3-8B from config.h).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from . import gflags
from .gflags import Flag
from .glog import Logger

_F = "example/qwen3/main.cc"
MAGIC = 20240804  # feat/add_Qwen3-8B:example/qwen3/config.h kQwen3Magic
VERSION = 3  # kQwen3FP32Version
STEP_LINE = "main.cc:393"
BETAS, EPS = (0.9, 0.95), 1e-8  # main.cc:263 optimizers::Adam::Create(lr, 0.9f, 0.95f, 1e-8f)


def flag_set() -> dict[str, Flag]:
    """feat/add_Qwen3-8B:example/qwen3/main.cc:42-86, with the validators of :99-101."""
    rows = [
        ("input_bin", "string", "", "input .bin to train on"),
        ("input_val_bin", "string", "", "input .bin to eval validation loss on"),
        ("tokenizer_bin", "string", "", "input .bin to tokenizer"),
        ("llmc_filepath", "string", "", "llmc model file path to load from"),
        ("model", "string", "qwen3", "qwen/qwen3-8b"),
        ("batch_size", "uint32", 4, "batch size, in units of #batch dimensions"),
        ("sequence_length", "uint32", 64, "sequence length"),
        ("total_batch_size", "uint32", 256, "total desired batch size, in units of #tokens"),
        ("num_iteration", "uint32", 10, "number of iterations to run"),
        ("freq_generate_txt", "uint32", 10, "frequency of text generation"),
        ("text_length", "uint32", 64, "the length of the generated text"),
        ("learning_rate", "double", 1e-5, "learning rate warmup iterations"),
        ("use_distributed_optimizer", "bool", False,
         "Whether to enable DistributedOptimizer(only take effects when DP>1)"),
        ("val_loss_every", "uint32", 0, "every how many steps to evaluate val loss?"),
        ("sample_every", "uint32", 0, "how often to sample from the model?"),
        ("overfit_single_batch", "bool", True, "overfit just one batch of data"),
        ("device", "string", "cuda", "device type (cpu/cuda), useless if using parallel training mode"),
        ("nthread_per_process", "int32", 1,
         "Number of threads to use for each process. When set > 1, enables data parallelism with "
         "device=cuda on the specified number of visible CUDA devices."),
        ("tensor_parallel", "uint32", 1, "Tensor Parallel world size"),
        ("sequence_parallel", "bool", False, "Whether to enable Sequence Parallel"),
        ("pipeline_parallel", "uint32", 1, "Pipeline Parallel world size, specified the number of PP stages."),
        ("virtual_pipeline_parallel", "uint32", 1, "Number of chunks in PP stage."),
        ("dtype", "string", "float32", "precision used in training (float32/bfloat16)"),
        ("precision_check", "string", "",
         "precision check config: level=N,format=simple|table,output_md5=true|false,output_path=PATH,"
         "baseline=PATH"),
        ("lora_rank", "int32", 0, "LoRA rank (0 = disabled)"),
        ("lora_alpha", "double", 16.0, "LoRA alpha scaling factor"),
        ("lora_target_modules", "string", "c_attn,c_proj,c_fc,c_fc2", "LoRA target modules (comma-separated)"),
        ("lora_save_path", "string", "", "Path to save LoRA weights after training"),
        ("lora_load_path", "string", "", "Path to load LoRA weights from"),
    ]
    validators = {"model": lambda v: v == "qwen3", "device": lambda v: v in ("cpu", "cuda")}
    return gflags.with_gflags_flags({n: Flag(n, k, d, validators.get(n), m, _F) for n, k, d, m in rows})


def check_header(path: str, log: Logger) -> None:
    """LoadFromLLMC's first checks (feat/add_Qwen3-8B:example/qwen3/checkpoint_loader.cc:45-55)."""
    if not os.path.isfile(path):
        log.fatal(f"File not found: {path}", "checkpoint_loader.cc:46")
    header = np.fromfile(path, dtype=np.uint32, count=256)
    if header.size < 2:
        log.fatal(f"Check failed: header of {path} (file too small)", "checkpoint_loader.cc:50")
    log.check_eq(int(header[0]), MAGIC, "magic == kQwen3Magic", "", "checkpoint_loader.cc:53")
    log.check_eq(int(header[1]), VERSION, "version == kQwen3FP32Version", "", "checkpoint_loader.cc:55")


def _rotate_half_rows(w, n_heads: int):
    """Each head's rows from interleaved pairs back to rotate_half's halves (the inverse of
    tests/trainer/models/hf_parity.py's interleaved_rows)."""
    d1 = w.shape[0]
    rest = tuple(w.shape[1:])
    return w.reshape(n_heads, d1 // n_heads // 2, 2, *rest).transpose(1, 2).reshape(d1, *rest)


def hf_model(path: str):
    """transformers' Qwen3ForCausalLM holding the checkpoint's weights."""
    import torch
    import transformers

    from harness.contracts.llmc import read_checkpoint

    checkpoint = read_checkpoint(path)
    c, t = checkpoint.config, {k: torch.from_numpy(np.array(v, dtype=np.float32))
                               for k, v in checkpoint.tensors.items()}
    hd = c.n_embd // c.n_head
    hf = transformers.Qwen3ForCausalLM._from_config(transformers.Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.ffn_dim,
        num_hidden_layers=c.n_layer, num_attention_heads=c.n_head, num_key_value_heads=c.n_kv_head,
        head_dim=hd, max_position_embeddings=c.block_size, rms_norm_eps=c.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        tie_word_embeddings=False, attention_bias=False, use_sliding_window=False),
        attn_implementation="eager")
    q_rows, kv_rows = c.n_head * hd, c.n_kv_head * hd
    state = {"model.embed_tokens.weight": t["wte.weight"], "model.norm.weight": t["ln_f.weight"],
             "lm_head.weight": t["lm_head.weight"]}
    for i in range(c.n_layer):
        h, p = f"h.{i}.", f"model.layers.{i}."
        qkv = t[h + "attn.c_attn.weight"]
        state[p + "self_attn.q_proj.weight"] = _rotate_half_rows(qkv[:q_rows], c.n_head)
        state[p + "self_attn.k_proj.weight"] = _rotate_half_rows(qkv[q_rows:q_rows + kv_rows], c.n_kv_head)
        state[p + "self_attn.v_proj.weight"] = qkv[q_rows + kv_rows:]
        state[p + "self_attn.q_norm.weight"] = _rotate_half_rows(t[h + "attn.q_norm.weight"], 1)
        state[p + "self_attn.k_norm.weight"] = _rotate_half_rows(t[h + "attn.k_norm.weight"], 1)
        state[p + "self_attn.o_proj.weight"] = t[h + "attn.c_proj.weight"]
        state[p + "input_layernorm.weight"] = t[h + "ln_1.weight"]
        state[p + "post_attention_layernorm.weight"] = t[h + "ln_2.weight"]
        state[p + "mlp.up_proj.weight"] = t[h + "mlp.c_fc.weight"]
        state[p + "mlp.gate_proj.weight"] = t[h + "mlp.c_fc2.weight"]  # SiLU is applied to c_fc2
        state[p + "mlp.down_proj.weight"] = t[h + "mlp.c_proj.weight"]
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"stand-in qwen3: weights not mapped: {missing} {unexpected}")
    return hf.train(), c


def main(argv: list[str]) -> None:
    from .trainer import _build_opts, _die_no_cuda, read_tokens
    flavour, cuda, argv = _build_opts(argv)
    fl, _rest = gflags.parse_or_exit(argv, flag_set(), "qwen3")
    log = Logger("qwen3", fl)
    threads = fl["nthread_per_process"] * int(os.environ.get("PROC_WORLD_SIZE", "1"))
    if threads > 1 or fl["tensor_parallel"] > 1 or fl["pipeline_parallel"] > 1:
        if not cuda:
            _die_no_cuda(log)  # parallel ranks use CUDA whatever --device
        sys.stderr.write("stand-in qwen3: plays one device only\n")
        sys.exit(2)
    if fl["lora_rank"] > 0 or fl["precision_check"]:
        sys.stderr.write("stand-in qwen3: does not play LoRA or --precision_check\n")
        sys.exit(2)
    if fl["device"] == "cuda" and not cuda:
        _die_no_cuda(log)  # model->To(Device(kCUDA, 0)) on a CPU build
    B, T, total = fl["batch_size"], fl["sequence_length"], fl["total_batch_size"]
    log.check_eq(total % (B * T), 0, "FLAGS_total_batch_size % tokens_per_fwdbwd == 0", "", "main.cc:161")
    ga = total // (B * T)  # main.cc:162
    log.info(f"total desired batch size: {total} => calculated gradient accumulation steps: {ga}", "main.cc:164")
    if not fl["llmc_filepath"]:
        sys.stderr.write("stand-in qwen3: no --llmc_filepath: InfiniTrain would build Qwen3-8B from config.h\n")
        sys.exit(2)
    check_header(fl["llmc_filepath"], log)
    if fl["dtype"] not in ("float32", "bfloat16"):
        log.fatal(f"Rank 0: Datatype {fl['dtype']} not supported.", "main.cc:210")

    import torch  # only a run that trains pays for it (--helpxml and the checks above do not)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, config = hf_model(fl["llmc_filepath"])
    log.info("Rank 0: Model loaded to device.", "main.cc:202")
    toks = read_tokens(fl["input_bin"], log)
    nbatches = (toks.size // T - 1) // B
    log.check(nbatches >= 1, "dataset has at least one batch", f"({fl['input_bin']}: {toks.size} tokens)")
    if int(toks.max(initial=0)) >= config.vocab_size:
        sys.stderr.write(f"stand-in qwen3: token id {int(toks.max())} in {fl['input_bin']} is outside the "
                         f"model's {config.vocab_size}-token vocabulary\n")
        sys.exit(2)
    optimizer = torch.optim.Adam(model.parameters(), lr=fl["learning_rate"], betas=BETAS, eps=EPS)
    bf16 = fl["dtype"] == "bfloat16"
    unit = 0
    log.info("Rank 0: start training", "main.cc:290")
    for step in range(fl["num_iteration"]):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        lossf = np.float32(0)
        for _ in range(ga):  # main.cc:335-365
            start = (unit % nbatches) * B * T
            unit += 1
            chunk = torch.from_numpy(toks[start:start + B * T + 1].copy())
            x, y = chunk[:-1].reshape(B, T), chunk[1:].reshape(B, T)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                     y.reshape(-1)) / ga
            lossf = np.float32(lossf + np.float32(loss.item()))
            loss.backward()
        optimizer.step()
        dur = time.perf_counter() - t0
        log.error(f"step {step + 1:4d}/{fl['num_iteration']} | train loss {float(lossf):.6f} | "
                  f"lr {fl['learning_rate']:.2e} | ({dur * 1e3:.2f} ms | {total / max(dur, 1e-9):.0f} tok/s | "
                  f"peak used: {0:5d} MB | peak reserved: {0:5d} MB, DP=1, TP=1, SP=1, PP=1)", STEP_LINE)


if __name__ == "__main__":
    main(sys.argv[1:])
