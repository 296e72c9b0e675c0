"""A GPT-2 124M-shaped checkpoint (12 layers, width 768, 12 heads, vocab 50257 padded to 50304,
context 1024; seeded synthetic weights and tokens) and a test config that runs it PP2 `4,8` and
TP2 against its single-device reference, for the 124M rows of benchmarks/sensitivity.py.

    python benchmarks/make_124m.py DIR
    python -m pytest -p harness.plugin --harness-config DIR/config_124m.json --gpus 2 \\
        --harness-keep-dumps all --harness-output DIR/out
    python benchmarks/sensitivity.py DIR/out/sessions/<session> --case numerics_124m/gpt2/pp2-4-8
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from harness.assets.generate import init_weights, token_stream
from harness.assets.presets import PRESETS
from harness.contracts.llmc import write_checkpoint, write_tokens


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "reports/numerics-124m")
    out.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(PRESETS["tiny"].config("gpt2"), block_size=1024, vocab_size=50257,
                                 padded_vocab_size=50304, n_layer=12, n_head=12, n_embd=768)
    write_checkpoint(out / "gpt2_124m.bin", config, init_weights(config, 0))
    write_tokens(out / "tokens_124m.bin", token_stream(64 * 1024, 0, "train"), kind="gpt2")
    test_config = {
        "models": ["gpt2"],
        "model_files": {"gpt2": {"checkpoint": "gpt2_124m.bin", "input_bin": "tokens_124m.bin"}},
        "defaults": {"batch_size": 2, "sequence_length": 32, "total_batch_size": 128,
                     "num_iteration": 2, "learning_rate": 0.001, "optimizer": "sgd",
                     "seed": 42, "dtype": "float32"},
        "test_groups": [{"tag": "numerics_124m", "tests": [
            {"id": "pp2-4-8", "args": {"pipeline_parallel": 2,
                                       "pipeline_layer_partition": "4,8"}},
            {"id": "tp2", "args": {"tensor_parallel": 2}}]}],
    }
    (out / "config_124m.json").write_text(json.dumps(test_config, indent=2) + "\n")
    print(f"wrote {out}/gpt2_124m.bin, tokens_124m.bin, config_124m.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
