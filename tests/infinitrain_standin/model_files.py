"""The smallest model files InfiniTrain master's loaders accept, for runs of its own config on
the stand-in: GPT-2 with 12 heads (its loader leaves n_kv_head at 12) and LLaMA 3 with a
128256-token vocabulary (its loader leaves original_vocab_size at 128256). Otherwise as small
as the config's layouts allow: 8 layers (PP 8, and PP 4 x VPP 2), widths 24 and 16; LLaMA 3
with 4 heads and 4 KV heads (TP 4 divides both, as InfiniTrain requires). The token files are
the `infinitrain` preset's."""

from __future__ import annotations

from pathlib import Path


def micro_model_vars(root: Path) -> list[str]:
    """Write the two checkpoints into `root`; the `--harness-var` options of InfiniTrain's
    config variables that point at them and at the preset's token files."""
    from harness.assets import ensure_assets
    from harness.assets.generate import init_weights
    from harness.contracts.llmc.checkpoint import write_checkpoint
    from harness.contracts.models import GPT2Config, LLaMA3Config

    assets = ensure_assets("infinitrain")
    configs = {
        "gpt2": GPT2Config(block_size=64, vocab_size=128, n_layer=8, n_head=12, n_embd=24,
                           padded_vocab_size=160),
        "llama3": LLaMA3Config(block_size=64, vocab_size=128256, n_layer=8, n_head=4,
                               n_kv_head=4, n_embd=16, ffn_dim_multiplier=1.0, multiple_of=16,
                               norm_eps=1e-5, rope_theta=10000.0, use_scaled_rope=True),
    }
    variables = {}
    for model, config in configs.items():
        path = Path(root) / f"{model}_micro.bin"
        write_checkpoint(path, config, init_weights(config, seed=0))
        variables[f"{model.upper()}_LLMC_FILEPATH"] = path
        variables[f"{model.upper()}_INPUT_BIN"] = assets.tokens(model, "train")
    return [f"--harness-var={k}={v}" for k, v in variables.items()]


def mixtral_model_vars(root: Path) -> list[str]:
    """Write a small tiny Mixtral checkpoint into `root` (tiny_mixtral.write_checkpoint: the real
    256-int32 header, magic 20260513 / version 2, and seeded weights of tiny_mixtral.SMALL_CONFIG
    in the loader's order), which loads on a stand-in build compiled with the file's own config
    (`make_build_dir(..., mixtral_config="file")` or STANDIN_MIXTRAL_CONFIG=file); the
    `--harness-var` options of feat/support_moe's MIXTRAL_LLMC_FILEPATH / MIXTRAL_INPUT_BIN
    (feat/support_moe:scripts/test_config.json:14-15). The token file is the preset's LLaMA 3 one
    (the real config trains tiny Mixtral on LLaMA 3 token ids; the preset's are bytes, inside the
    small config's 256-token vocabulary)."""
    from harness.assets import ensure_assets
    from tests.infinitrain_standin.tiny_mixtral import SMALL_CONFIG, write_checkpoint

    assets = ensure_assets("infinitrain")
    path = Path(root) / "tiny_mixtral_standin.bin"
    write_checkpoint(path, weights=True, **SMALL_CONFIG)
    return [f"--harness-var=MIXTRAL_LLMC_FILEPATH={path}",
            f"--harness-var=MIXTRAL_INPUT_BIN={assets.tokens('llama3', 'train')}"]
