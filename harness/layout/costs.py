"""The cost spec of --pipeline_layer_costs: "1x8,L:4.5".

Entries, comma-separated, in any order: `c` (one layer of relative cost c), `cxN` (N layers of
cost c), `E:c` (embedding, added to the first stage), `L:c` (final norm + lm head + loss, added to
the last stage). Layer entries are taken in order: layer 0 first.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from .errors import COSTS_FLAG, MAX_COUNT, LayoutError, flag_value, split_entries

EXPECTED = "comma-separated costs 'c' or 'cxN' per layer, plus optional 'E:c' and 'L:c', e.g. '1x8,L:4.5'"
TAGS = {"E": "embedding", "L": "lm_head"}


@dataclass(frozen=True)
class LayerCosts:
    layers: tuple[float, ...]
    embedding: float = 0.0
    lm_head: float = 0.0

    def __post_init__(self) -> None:
        # Built directly (by the profile reader, by tests) it gets the same checks as a parsed spec.
        object.__setattr__(self, "layers", tuple(_checked(c, "layer cost") for c in self.layers))
        for name in TAGS.values():
            object.__setattr__(self, name, _checked(getattr(self, name), f"{name} cost"))

    def check_layers(self, num_layers: int, text: str | None = None) -> None:
        if len(self.layers) != num_layers:
            raise LayoutError(f"{flag_value(COSTS_FLAG, self.to_spec() if text is None else text)} gives {len(self.layers)} layer costs, "
                              f"but the model has {num_layers} layers; expected one cost per layer")

    def to_spec(self) -> str:
        """The canonical spec string: runs of equal costs as `cxN`, tags last when non-zero."""
        parts: list[str] = []
        run_value, run_len = None, 0
        for c in (*self.layers, None):
            if c == run_value and c is not None:
                run_len += 1
                continue
            if run_len:
                parts.append(_num(run_value) if run_len == 1 else f"{_num(run_value)}x{run_len}")
            run_value, run_len = c, 1
        parts += [f"{tag}:{_num(getattr(self, name))}" for tag, name in TAGS.items() if getattr(self, name)]
        return ",".join(parts)


def parse_costs(text: str, num_layers: int | None = None) -> LayerCosts:
    """Parse a cost spec; with num_layers, the number of layer costs must match it."""
    layers: list[float] = []
    tagged: dict[str, float] = {}
    for entry in split_entries(COSTS_FLAG, text, EXPECTED):
        if ":" in entry:
            tag, _, value = (p.strip() for p in entry.partition(":"))
            if tag not in TAGS:
                raise LayoutError(f"{flag_value(COSTS_FLAG, text)}: unknown tag {tag!r} in {entry!r}; "
                                  f"expected E (embedding) or L (lm head)")
            if tag in tagged:
                raise LayoutError(f"{flag_value(COSTS_FLAG, text)}: tag {tag!r} is given more than once; "
                                  f"expected at most one {tag}:c")
            tagged[tag] = _cost(text, entry, value)
        else:
            # The repeat is bounded before it is expanded: '1x99999999999' is refused here
            # instead of asking for a list of 10^11 floats.
            layers += _layer_run(text, entry, MAX_COUNT - len(layers))
    costs = LayerCosts(tuple(layers), tagged.get("E", 0.0), tagged.get("L", 0.0))
    if not layers:
        raise LayoutError(f"{flag_value(COSTS_FLAG, text)} has no layer costs; expected {EXPECTED}")
    if num_layers is not None:
        costs.check_layers(num_layers, text)
    return costs


def _layer_run(text: str, entry: str, room: int) -> list[float]:
    """The layer costs of one entry; `room`: how many more layer costs may follow."""
    value, sep, count = entry.partition("x")
    if not sep:
        return [_cost(text, entry, value)]
    count = count.strip()
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses.
    if not re.fullmatch(r"[0-9]+", count) or not count.strip("0"):
        raise LayoutError(f"{flag_value(COSTS_FLAG, text)}: repeat count {count!r} in {entry!r} is not a "
                          f"positive integer; expected {EXPECTED}")
    if len(count.lstrip("0")) > 9 or int(count) > room:
        raise LayoutError(f"{flag_value(COSTS_FLAG, text)}: repeat count {count!r} in {entry!r} makes more "
                          f"than {MAX_COUNT} layer costs; expected one cost per layer of the model")
    return [_cost(text, entry, value.strip())] * int(count)


def _cost(text: str, entry: str, value: str) -> float:
    what = repr(value) if value == entry else f"{value!r} in {entry!r}"
    try:
        cost = float(value)
    except ValueError:
        raise LayoutError(f"{flag_value(COSTS_FLAG, text)}: {what} is not a number; "
                          f"expected {EXPECTED}") from None
    if not math.isfinite(cost):
        raise LayoutError(f"{flag_value(COSTS_FLAG, text)}: cost {what} is not finite; "
                          f"expected a finite cost >= 0")
    if cost < 0:
        raise LayoutError(f"{flag_value(COSTS_FLAG, text)}: cost {what} is negative; "
                          f"expected a finite cost >= 0")
    return cost + 0.0  # -0.0 becomes 0.0, so equal specs compare and render equal


def _checked(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise LayoutError(f"{what} {value!r} is invalid; expected a finite number >= 0 ({COSTS_FLAG})")
    return float(value) + 0.0


def _num(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
