"""python -m harness.assets --preset tiny --out DIR [--seed N] [--model gpt2|llama3|all]"""

from __future__ import annotations

import argparse
import sys

from harness.contracts.models import MODEL_SPECS

from .generate import MODELS, generate_assets
from .presets import PRESETS


def _size(c) -> str:
    heads = f"H{c.n_head}" + (f"/{c.n_kv_head}kv" if hasattr(c, "n_kv_head") else "")
    ffn = f" ffn{c.ffn_dim}" if hasattr(c, "ffn_dim") else ""
    vocab = f"V{c.vocab_size}" + (f"->{c.padded_vocab_size}" if hasattr(c, "padded_vocab_size") else "")
    return f"L{c.n_layer} C{c.n_embd} {heads}{ffn} T{c.block_size} {vocab}"


def _describe(p) -> str:
    models = "; ".join(f"{MODEL_SPECS[m].title} {_size(c)}" for m, c in p.configs.items())
    return (f"  {p.name:6s} {p.purpose}: {models}; "
            f"{p.train_tokens} train + {p.val_tokens} val tokens")


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
