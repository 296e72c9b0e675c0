"""Which pipeline stage and transformer layer a parameter belongs to, from the run's recorded
layout (run.json `layout`: {"chunks": [[stage, start, end], ...], ...} in global order).

`h.{i}.…` is layer i, on the stage whose chunk holds i; `wte` / `wpe` (embedding) are on the
first chunk's stage; `ln_f` / `lm_head` on the last chunk's. GPT-2's `wte` is tied to the head,
so it lives on both ends when they differ.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LAYER = re.compile(r"^h\.(\d+)\.")


@dataclass(frozen=True)
class Locator:
    chunks: tuple[tuple[int, int, int], ...] = ()
    tied_embedding: bool = False  # GPT-2

    @classmethod
    def from_layout(cls, layout: dict | None, model: str | None = None) -> "Locator":
        chunks = ()
        if isinstance(layout, dict) and isinstance(layout.get("chunks"), list):
            try:
                chunks = tuple((int(s), int(a), int(b)) for s, a, b in layout["chunks"])
            except (TypeError, ValueError):
                chunks = ()
        return cls(chunks, tied_embedding=(model == "gpt2"))

    def locate(self, name: str) -> tuple[str, str]:
        """(stage, layer) as text; '?' where the layout is unknown, '-' for no layer."""
        match = _LAYER.match(name)
        if match:
            layer = int(match.group(1))
            for stage, start, end in self.chunks:
                if start <= layer < end:
                    return str(stage), str(layer)
            return "?", str(layer)
        if not self.chunks:
            return "?", "-"
        first, last = self.chunks[0][0], self.chunks[-1][0]
        if name.startswith(("wte.", "wpe.")):
            if name.startswith("wte.") and self.tied_embedding and first != last:
                return f"{first}+{last} (tied embedding / lm head)", "-"
            return f"{first} (embedding)", "-"
        if name.startswith("ln_f."):
            return f"{last} (final norm)", "-"
        if name.startswith("lm_head."):
            return f"{last} (lm head)", "-"
        return "?", "-"
