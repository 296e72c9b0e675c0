"""A fake trainer for the plugin's fast tests, launched through the command-template backend.

It mimics what the harness reads from a trainer: InfiniTrain-style step lines on stdout, one
log per rank under --log_dir, `<name>.npy` gradients under --gradients_dir, and a run.json with
the layout. Its behaviour comes from the case id (the last part of --case):

    crash        the last rank raises (a traceback in its log) and exits 3
    hang         starts a child process, writes its pid to <output_dir>/child.pid, sleeps
    nan          step 2's loss is NaN and h.0.attn.c_proj.weight holds a NaN
    missing-grad omits h.1.mlp.c_fc.weight          extra-grad   adds h.9.bogus.weight
    bad-loss     step 3's loss is off by 0.01       bad-grad     scales h.5.attn.c_proj.weight
    slow         sleeps 0.15 s (for lease overlap tests)
    sigkill      starts world_size - 1 "rank" children that sleep, then SIGKILLs itself
    inf-grad     h.2.mlp.c_fc.weight holds an inf     corrupt-grad  h.3.mlp.c_fc.weight.npy is junk
    bad-last-stage  ln_f.weight (and LLaMA's lm_head.weight) scaled by 1.5: parameters only the
                 last pipeline stage holds
    exit-after-outputs  writes every step and gradient, then exits 1
    grad-at-atol / grad-above-atol / grad-at-rtol / grad-above-rtol  the pinned element
                 h.4.mlp.c_fc.weight[0, 0] (1.5 in every run) moved by exactly ATOL (2**-14) /
                 RTOL * 1.5 (RTOL 2**-10), or by the next float32 above that
    loss-at-atol / loss-above-atol / loss-at-rtol / loss-above-rtol  step 2's loss (4.75) moved
                 by exactly ATOL / LOSS_RTOL * 4.75 (both 2**-14), or the next float64 above; written to
                 steps.jsonl at full precision
    run-json     run.json holds a layout of the trainer's choosing (PP 2, layers 3 + 5), an
                 environment, the layout as text and the schedule run
    from-step-2  logs steps 2.. only (a resumed run)
    bad-update   with --dump_parameter_updates: h.6.mlp.c_fc.weight's update scaled by 1.5
    no-logs      writes no per-rank log (its stdout and stderr are all there is)
    scale-free-loss  step 2's loss (4.75) up by 1e-4: within the case's loosened atol (1e-3),
                 over float32's scale-free 1e-5 relative (2.1e-5)
    rounding-update  ln_f.weight's update (about 1e-6 per element, as a norm weight's is) moved
                 by one float32 step at 1.0 (2**-23): rounding that UPDATE_RESOLUTION allows
    small-update-diff  h.6.mlp.c_fc.weight's update 0.5 % off: over float32's scale-free update
                 threshold (1e-3), within bfloat16's (2e-2)
    corrupt-update  h.3.mlp.c_fc.weight's update file is a pickle (never loaded)
    fatal-line   prints a FATAL line after its steps, and exits 0 (a backend's `problem`)
With --dump_parameter_updates DIR it writes every parameter's change over the run there, as the
bundled trainer does; with --own_updates, an unrelated `updates` folder in its output; with
--save DIR, an (empty) DIR/checkpoint_step_<last step, 6 digits>.
Anything else matches the reference exactly, unless FAKE_GRAD_NOISE / FAKE_LOSS_NOISE = E is
set: then every run (references too) scales each gradient and each step's loss by its own
1 + E * u, u uniform in [-1, 1) and drawn afresh every run (a GPU's run-to-run noise; the exact
losses go to steps.jsonl). With FAKE_RECORD_DIR set it appends its lease
(slots, start, end, port) and every reference run to JSON-lines files there, and the pid and
argv of every process it starts (itself included) to pids.jsonl.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

LAYERS = 8
PINNED = "h.4.mlp.c_fc.weight"  # element [0, 0] is 1.5 in every run: exact tolerance tests
ATOL = 2.0**-14
RTOL = 2.0**-10
LOSS_RTOL = 2.0**-14  # bf16's scale-free loss threshold (1e-4) stays out of the way


def moved(value, mode, what, atol_delta, rtol_delta, dtype):
    """`value` moved by exactly the atol / rtol bound, or the next float above it."""
    if not mode.startswith(what + "-"):
        return value
    delta = atol_delta if mode.endswith("-atol") else rtol_delta
    bound = dtype(value + delta)
    assert float(bound) - float(value) == delta  # exact: the test is about the boundary
    return np.nextafter(bound, dtype(np.inf)) if "-above-" in mode else bound


def parameter_names(model):
    names = ["wte.weight"] + (["wpe.weight"] if model == "gpt2" else [])
    for i in range(LAYERS):
        names += [f"h.{i}.attn.c_proj.weight", f"h.{i}.mlp.c_fc.weight"]
    names += ["ln_f.weight"] + (["lm_head.weight"] if model == "llama3" else [])
    return names


def gradient(name, seed):
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return rng.standard_normal((4, 3)).astype(np.float32)


def record(kind, entry):
    folder = os.environ.get("FAKE_RECORD_DIR")
    if folder:
        with open(Path(folder) / f"{kind}.jsonl", "a") as stream:
            stream.write(json.dumps(entry) + "\n")


def main():
    parser = argparse.ArgumentParser()
    for name in ("case", "output_dir", "gradients_dir", "log_dir", "model", "devices", "port"):
        parser.add_argument(f"--{name}", default="")
    parser.add_argument("--world_size", type=int, default=1)
    parser.add_argument("--num_iteration", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--pipeline_parallel", type=int, default=1)
    parser.add_argument("--pipeline_layer_partition", default=None)
    parser.add_argument("--dump_parameter_updates", default="")
    parser.add_argument("--save", default="")
    parser.add_argument("--own_updates", default="")
    args, _unknown = parser.parse_known_args()
    mode = args.case.rsplit("/", 1)[-1]
    started = time.time()
    out, logs = Path(args.output_dir), Path(args.log_dir)
    out.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    for rank in range(0 if "no-logs" in mode else args.world_size):
        (logs / f"rank{rank}.log").write_text(f"rank {rank} of {args.world_size} starting\n")
    record("pids", {"case": args.case, "pid": os.getpid(), "argv": sys.argv})
    if args.case == "reference":
        record("references", {"model": args.model, "pid": os.getpid(), "time": started,
                              "argv": sys.argv})

    if "crash" in mode:
        rank = args.world_size - 1
        with open(logs / f"rank{rank}.log", "a") as stream:
            stream.write("Traceback (most recent call last):\n  File \"fake\", line 1\n"
                         "RuntimeError: planted crash on the last rank\n")
        sys.exit(3)
    # The children play ranks as torch 2.13's torchrun starts them: each in a session of its
    # own, out of reach of a kill of the trainer's process group (harness.launch.reaper).
    if "hang" in mode:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 start_new_session=True)
        record("pids", {"case": args.case, "pid": child.pid, "child": True})
        (out / "child.pid").write_text(str(child.pid))
        time.sleep(600)
    if "sigkill" in mode:
        for rank in range(1, args.world_size):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                     start_new_session=True)
            record("pids", {"case": args.case, "pid": child.pid, "child": True})
        os.kill(os.getpid(), signal.SIGKILL)
    if "slow" in mode:
        time.sleep(0.15)

    if args.pipeline_parallel > 1 or args.pipeline_layer_partition:
        from harness.layout import resolve_layout

        # run-json: a trainer that chose its own partition, and says so
        partition = "3,5" if "run-json" in mode else args.pipeline_layer_partition
        run = {"layout": resolve_layout(LAYERS, args.pipeline_parallel,
                                        partition=partition).to_dict()}
        if "run-json" in mode:
            run.update(parallel={"schedule": "GPipe"},
                       environment={"trainer": "fake-1", "world_size": args.world_size},
                       layout_text="fake layout: stage 0 layers 0-2, stage 1 layers 3-7")
        (out / "run.json").write_text(json.dumps(run))
    exact_steps = []
    for step in range(2 if "from-step-2" in mode else 1, args.num_iteration + 1):
        loss = 5.0 - 0.125 * step
        if "nan" in mode and step == 2:
            loss = float("nan")
        if "bad-loss" in mode and step == 3:
            loss += 0.01
        if step == 2:
            loss = float(moved(loss, mode, "loss", ATOL, LOSS_RTOL * abs(loss), np.float64))
        exact_steps.append({"step": step, "loss": loss})
        print(f"step {step:4d}/{args.num_iteration} | train loss {loss:.6f} | lr 1.00e-04 | "
              f"(1.0 ms | {1000 * args.world_size} tok/s | peak used: {10 + args.world_size} MB | "
              f"DP=1, TP=1, PP={args.pipeline_parallel})", flush=True)
    if "fatal-line" in mode:
        print("FATAL fake: rank 1: planted fatal log line after the last step", flush=True)
    if "scale-free-loss" in mode:  # within an atol of 1e-3, over float32's scale-free 1e-5
        exact_steps[1]["loss"] += 1e-4
    noise = np.random.default_rng()  # fresh every run: FAKE_*_NOISE is run-to-run noise
    loss_noise = float(os.environ.get("FAKE_LOSS_NOISE") or 0)
    for entry in exact_steps if loss_noise else ():
        entry["loss"] *= 1 + loss_noise * noise.uniform(-1, 1)
    # The step lines round to 6 decimals: the exact losses.
    if mode.startswith("loss-") or "scale-free-loss" in mode or loss_noise:
        (out / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in exact_steps))
    if args.gradients_dir:
        grads = Path(args.gradients_dir)
        grads.mkdir(parents=True, exist_ok=True)
        for name in parameter_names(args.model):
            if "missing-grad" in mode and name == "h.1.mlp.c_fc.weight":
                continue
            value = gradient(name, args.seed)
            if name == PINNED:
                value[0, 0] = 1.5
                value[0, 0] = moved(value[0, 0], mode, "grad", ATOL, RTOL * 1.5, np.float32)
            if "bad-last-stage" in mode and name in ("ln_f.weight", "lm_head.weight"):
                value *= 1.5
            if "nan" in mode and name == "h.0.attn.c_proj.weight":
                value[1, 1] = np.nan
            if "bad-grad" in mode and name == "h.5.attn.c_proj.weight":
                value *= 1.5
            if "inf-grad" in mode and name == "h.2.mlp.c_fc.weight":
                value[0, 2] = np.inf
            if os.environ.get("FAKE_GRAD_NOISE"):
                value *= np.float32(1 + float(os.environ["FAKE_GRAD_NOISE"])
                                    * noise.uniform(-1, 1))
            np.save(grads / f"{name}.npy", value)
            if "corrupt-grad" in mode and name == "h.3.mlp.c_fc.weight":
                (grads / f"{name}.npy").write_bytes(b"\x93NUMPY junk, not an array")
        if "extra-grad" in mode:
            np.save(grads / "h.9.bogus.weight.npy", np.zeros((2,), np.float32))
    if args.dump_parameter_updates:
        updates = Path(args.dump_parameter_updates)
        updates.mkdir(parents=True, exist_ok=True)
        for name in parameter_names(args.model):
            value = gradient(name, args.seed + 1) * np.float32(1e-3)
            if name == "ln_f.weight":  # a norm weight near 1.0 moves by a few float32 steps
                value *= np.float32(1e-3)
                if "rounding-update" in mode:
                    value[0, 0] += np.float32(2.0**-23)  # one step: rounding, not a bug
            if "bad-update" in mode and name == "h.6.mlp.c_fc.weight":
                value *= 1.5
            if "small-update-diff" in mode and name == "h.6.mlp.c_fc.weight":
                value *= np.float32(1.005)
            np.save(updates / f"{name}.npy", value)
            if "corrupt-update" in mode and name == "h.3.mlp.c_fc.weight":  # a pickle
                np.save(updates / f"{name}.npy", np.full(value.shape, None, object),
                        allow_pickle=True)
    if args.own_updates:  # a trainer's own folder that happens to be called "updates"
        (out / "updates").mkdir(exist_ok=True)
        np.save(out / "updates" / "junk.npy", np.zeros(3, np.float32))
    if args.save:
        (Path(args.save) / f"checkpoint_step_{args.num_iteration:06d}").mkdir(parents=True)
    if "exit-after-outputs" in mode:  # every output is whole, but the run did not succeed
        print("fake: exiting 1 after writing every output", file=sys.stderr, flush=True)
        sys.exit(1)
    if args.case != "reference":
        record("leases", {"case": args.case, "slots": args.devices, "start": started,
                          "end": time.time(), "pid": os.getpid(), "port": args.port})


if __name__ == "__main__":
    main()
