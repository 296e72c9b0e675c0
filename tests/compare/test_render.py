"""One diff renderer: the failure text and the report's markdown show the same worst
parameters from the same table code."""

from __future__ import annotations

import numpy as np

from harness.compare import compare_gradients, gradient_lines
from harness.compare.render import MARKDOWN, gradient_markdown, table, worst_table
from harness.spec.tolerance import Tolerance


def _dump(folder, arrays):
    folder.mkdir()
    for name, values in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(values, dtype=np.float32))


def test_text_and_markdown_share_the_worst_parameters(tmp_path):
    _dump(tmp_path / "ref", {"h.0.attn.weight": [1.0, 2.0, 3.0], "wte": [0.5, 0.5]})
    _dump(tmp_path / "got", {"h.0.attn.weight": [1.0, 2.5, 3.0], "wte": [0.5, 0.5]})
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", Tolerance(1e-5, 0))
    text = "\n".join(gradient_lines(diff))
    markdown = "\n".join(gradient_markdown(diff.to_dict()))
    assert "worst parameters:" in text and "Worst parameters:" in markdown
    for shown in (text, markdown):
        assert "h.0.attn.weight" in shown and "1/3" in shown and "wte" not in shown.split(
            "orst parameters:")[1]
    assert worst_table(diff.to_dict()["worst"], MARKDOWN)[0].startswith("| parameter")


def test_markdown_cells_are_escaped():
    assert table([["a|b", "x\ny"]], ["h|1", "h2"], MARKDOWN)[2] == "| a\\|b   | x y  |"
