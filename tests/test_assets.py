"""Synthetic assets: deterministic from the seed, valid llm.c files, cached and repaired."""

import json
import subprocess
import sys
import threading

import numpy as np
import pytest

import harness.assets.generate as generate
from harness.assets import PRESETS, ensure_assets, file_names, generate_assets
from harness.assets.__main__ import main
from harness.contracts.llmc import read_checkpoint, read_tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    return out, generate_assets(out, "tiny", seed=0)


def test_same_seed_gives_identical_bytes(tiny, tmp_path):
    out, manifest = tiny
    again = generate_assets(tmp_path, "tiny", seed=0)
    assert again == manifest
    for name in [*manifest["files"], "assets.json"]:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_other_seed_gives_other_weights_and_tokens(tiny, tmp_path):
    _, manifest = tiny
    other = generate_assets(tmp_path, "tiny", seed=1, models=("llama3",))
    assert set(other["files"]) == set(file_names("tiny", "llama3").values())
    for name, info in other["files"].items():
        assert info["sha256"] != manifest["files"][name]["sha256"], name


def test_one_model_alone_gives_the_same_bytes(tiny, tmp_path):
    _, manifest = tiny
    alone = generate_assets(tmp_path, "tiny", seed=0, models=("gpt2",))
    for name, info in alone["files"].items():
        assert info == manifest["files"][name]


def test_files_are_valid_llmc_files_of_the_preset(tiny):
    out, manifest = tiny
    preset = PRESETS["tiny"]
    for model in ("gpt2", "llama3", "mixtral"):
        names = file_names("tiny", model)
        ckpt = read_checkpoint(out / names["checkpoint"])
        assert ckpt.model == model and ckpt.config == preset.config(model)
        assert manifest["configs"][model]["n_layer"] == 8
        train = read_tokens(out / names["train"], vocab_size=ckpt.config.vocab_size)
        val = read_tokens(out / names["val"], vocab_size=ckpt.config.vocab_size)
        assert (len(train), len(val)) == (preset.train_tokens, preset.val_tokens)
    gpt2 = read_checkpoint(out / "gpt2_tiny.bin")
    padded = gpt2.tensors["wte.weight"][256:]
    assert padded.shape == (64, 32) and np.all(padded != 0)  # rows beyond vocab_size exist
    # Norms and biases are near, not exactly, 1 and 0, so a loader that skips them shows.
    ln = gpt2.tensors["h.3.ln_1.weight"]
    assert abs(ln.mean() - 1) < 0.02 and np.all(ln != 1)
    assert np.all(gpt2.tensors["h.3.mlp.c_fc.bias"] != 0)
    assert gpt2.tensors["h.0.attn.c_proj.weight"].std() < gpt2.tensors["h.0.mlp.c_fc.weight"].std()
    # tiny Mixtral: its experts' projections scaled like the other c_proj, its tokens LLaMA 3's
    mixtral = read_checkpoint(out / "mixtral_tiny.bin")
    assert mixtral.version == 2 and mixtral.config.num_experts == 4
    expert = "h.5.mlp.experts.expert_3."
    assert mixtral.tensors[expert + "c_proj.weight"].std() < \
        mixtral.tensors[expert + "c_fc2.weight"].std()
    assert (out / "tokens_mixtral_tiny_train.bin").read_bytes() == \
        (out / "tokens_llama3_tiny_train.bin").read_bytes()


def test_token_streams_are_english_text(tiny):
    out, _ = tiny
    gpt2 = read_tokens(out / "tokens_gpt2_tiny_train.bin")
    llama3 = read_tokens(out / "tokens_llama3_tiny_train.bin")
    np.testing.assert_array_equal(gpt2, llama3)  # same ids, two formats
    text = bytes(np.asarray(gpt2, dtype=np.uint8)).decode("ascii")
    assert " the " in text and "river" in text
    # Structure a model can learn: the byte distribution is far from uniform over 256 ids.
    counts = np.bincount(gpt2, minlength=256) / len(gpt2)
    entropy_bits = -(counts[counts > 0] * np.log2(counts[counts > 0])).sum()
    assert entropy_bits < 5.0  # uniform would be 8
    val = read_tokens(out / "tokens_gpt2_tiny_val.bin")
    assert not np.array_equal(val[:1000], gpt2[:1000])


@pytest.fixture
def count_generations(monkeypatch):
    calls = []
    real = generate.generate_assets

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(generate, "generate_assets", counting)
    return calls


def test_ensure_assets_generates_once_and_reuses(tmp_path, count_generations):
    paths = ensure_assets("tiny", tmp_path)
    assert paths.root == tmp_path / "tiny-seed0" and len(count_generations) == 1
    for model in ("gpt2", "llama3"):
        assert paths.checkpoint(model).is_file()
        assert paths.tokens(model, "train").is_file() and paths.tokens(model, "val").is_file()
    manifest = json.loads(paths.manifest.read_text())
    assert manifest["preset"] == "tiny" and manifest["seed"] == 0
    assert ensure_assets("tiny", tmp_path) == paths
    assert len(count_generations) == 1


@pytest.mark.parametrize("damage", ["flip a byte", "delete", "truncate manifest"])
def test_ensure_assets_regenerates_after_damage(tmp_path, count_generations, damage):
    paths = ensure_assets("tiny", tmp_path)
    original = paths.checkpoint("llama3").read_bytes()
    if damage == "flip a byte":
        data = bytearray(original)
        data[5000] ^= 0xFF
        paths.checkpoint("llama3").write_bytes(bytes(data))
    elif damage == "delete":
        paths.tokens("gpt2", "val").unlink()
    else:
        paths.manifest.write_text("{")
    ensure_assets("tiny", tmp_path)
    assert len(count_generations) == 2
    assert paths.checkpoint("llama3").read_bytes() == original
    assert paths.tokens("gpt2", "val").is_file()


def test_concurrent_callers_generate_once(tmp_path, count_generations):
    results = []
    threads = [threading.Thread(target=lambda: results.append(ensure_assets("tiny", tmp_path)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(set(results)) == 1
    assert len(count_generations) == 1


def test_default_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_ASSETS_DIR", str(tmp_path / "cache"))
    assert ensure_assets("tiny", seed=3).root == tmp_path / "cache" / "tiny-seed3"


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'huge'; known: tiny, small, bench"):
        ensure_assets("huge")


def test_cli_help_lists_presets(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for name in PRESETS:
        assert name in help_text
    assert "--model {gpt2,llama3,qwen3,mixtral,all}" in help_text


def test_cli_writes_assets(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "harness.assets", "--preset", "tiny", "--out", str(tmp_path),
         "--seed", "7", "--model", "llama3"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "assets.json").read_text())
    assert manifest["seed"] == 7 and manifest["models"] == ["llama3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["assets.json", *file_names("tiny", "llama3").values()])
    assert "llama3_tiny.bin" in done.stdout
