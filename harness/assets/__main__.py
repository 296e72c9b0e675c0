"""python -m harness.assets --preset tiny --out DIR [--seed N] [--model gpt2|llama3|all]"""

from __future__ import annotations

import argparse
import sys

from .generate import MODELS, generate_assets
from .presets import PRESETS


def _describe(p) -> str:
    g, l = p.gpt2, p.llama3
    return (f"  {p.name:6s} {p.purpose}: GPT-2 L{g.n_layer} C{g.n_embd} H{g.n_head} "
            f"T{g.block_size} V{g.vocab_size}->{g.padded_vocab_size}; LLaMA 3 L{l.n_layer} "
            f"C{l.n_embd} H{l.n_head}/{l.n_kv_head}kv ffn{l.ffn_dim} T{l.block_size} "
            f"V{l.vocab_size}; {p.train_tokens} train + {p.val_tokens} val tokens")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.assets",
        description="Write deterministic synthetic llm.c checkpoints and token files "
                    "(byte-level English text) plus an assets.json manifest.",
        epilog="presets:\n" + "\n".join(_describe(p) for p in PRESETS.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", choices=list(PRESETS), default="tiny")
    parser.add_argument("--out", required=True, help="directory to write into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=[*MODELS, "all"], default="all")
    args = parser.parse_args(argv)
    models = MODELS if args.model == "all" else (args.model,)
    manifest = generate_assets(args.out, args.preset, args.seed, models)
    for name, info in manifest["files"].items():
        print(f"{args.out}/{name}  {info['bytes']} bytes  sha256 {info['sha256'][:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
