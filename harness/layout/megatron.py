"""The Megatron-style layout string of --pipeline_model_parallel_layout.

    layout := item*          item := atom ('*' count)?
    atom   := 'E' | 't' | 'N' | 'L' | '|' | '(' item* ')'

`E` embedding, `t` one transformer layer, `N` final norm, `L` lm head and loss; `|` ends a
segment (chunk). Commas and whitespace are ignored. Segment i goes to stage i % pp, virtual chunk
i // pp. Stricter than Megatron, which treats E and L as free-floating markers: E exactly once, in
the first segment, before any t; L exactly once, the very last symbol; N optional, at most once,
directly before L (the final norm always lives with the head, so N adds nothing but is accepted
for Megatron users). Positions in messages are 0-based offsets into the string as given.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import MEGATRON_FLAG, PP_FLAG, LayoutError, check_count, flag_value

SYMBOLS = "EtNL|"
EXPECTED = "one of E t N L | ( ) or *count"


@dataclass(frozen=True)
class _Node:
    pos: int            # where the atom starts in the text
    symbol: str         # one of SYMBOLS, or "(" for a group
    times: int = 1
    body: tuple[_Node, ...] = ()


def parse_megatron(num_layers: int, pp: int, text: str) -> list[int]:
    """Layer count of each segment (chunk) in global order."""
    check_count("num_layers", num_layers)
    check_count(PP_FLAG, pp)
    if not isinstance(text, str):
        raise LayoutError(f"{MEGATRON_FLAG} must be a string, got {text!r}")
    try:
        items = _Parser(text).items(top=True)
    except RecursionError:
        raise LayoutError(f"{flag_value(MEGATRON_FLAG, text)}: groups nest too deeply; "
                          f"expected a few levels of '(...)' at most") from None
    # Bound the expansion before doing it: a valid layout has num_layers t's, E, N, L and a
    # modest number of separators, so 't*1000000000' is refused here instead of eating memory.
    limit = 4 * (num_layers + pp) + 64
    if _length(items) > limit:
        raise LayoutError(f"{flag_value(MEGATRON_FLAG, text)} expands to more than {limit} symbols; "
                          f"with {num_layers} layers on {pp} stages it cannot be a valid layout")
    symbols: list[tuple[str, int]] = []
    _expand(items, symbols)
    return _segments(num_layers, pp, text, symbols)


def render_megatron(counts: list[int]) -> str:
    """The canonical string for segment layer counts: E first, N L last, `t*k` for k > 1."""
    runs = ["" if k == 0 else "t" if k == 1 else f"t*{k}" for k in counts]
    runs[0] = "E" + runs[0]
    runs[-1] += "NL"
    return "|".join(runs)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def error(self, what: str, pos: int | None = None, expected: str = "") -> LayoutError:
        where = self.pos if pos is None else pos
        return LayoutError(f"{flag_value(MEGATRON_FLAG, self.text)}: {what} at position {where}"
                           + (f"; expected {expected}" if expected else ""))

    def peek(self) -> str:
        while self.pos < len(self.text) and (self.text[self.pos].isspace() or self.text[self.pos] == ","):
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def items(self, top: bool) -> tuple[_Node, ...]:
        nodes: list[_Node] = []
        while (ch := self.peek()) and ch != ")":
            start = self.pos
            self.pos += 1
            if ch == "(":
                body = self.items(top=False)
                if self.peek() != ")":
                    raise self.error("'(' is never closed", start, "a matching ')'")
                self.pos += 1
                node = _Node(start, "(", body=body)
            elif ch in SYMBOLS:
                node = _Node(start, ch)
            elif ch == "*":
                raise self.error("'*' has nothing to repeat", start, "a symbol or ')' before '*'")
            else:
                hint = " (Megatron's MTP layer is not supported)" if ch == "m" else ""
                raise self.error(f"unknown symbol {ch!r}", start, EXPECTED + hint)
            nodes.append(self.repeat(node))
        if top and self.peek() == ")":
            raise self.error("')' has no matching '('", None, "'(' before it")
        return tuple(nodes)

    def repeat(self, node: _Node) -> _Node:
        if self.peek() != "*":
            return node
        star = self.pos
        self.pos += 1
        self.peek()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789":
            self.pos += 1
        digits = self.text[start:self.pos]
        if not digits or int(digits) < 1:
            got = digits or self.peek() or "the end"
            raise self.error(f"'*' is followed by {got!r}", star, "a positive repeat count after '*'")
        return _Node(node.pos, node.symbol, int(digits), node.body)


def _length(nodes: tuple[_Node, ...]) -> int:
    return sum(n.times * (_length(n.body) if n.symbol == "(" else 1) for n in nodes)


def _expand(nodes: tuple[_Node, ...], out: list[tuple[str, int]]) -> None:
    for node in nodes:
        for _ in range(node.times):
            if node.symbol == "(":
                _expand(node.body, out)
            else:
                out.append((node.symbol, node.pos))


def _segments(num_layers: int, pp: int, text: str, symbols: list[tuple[str, int]]) -> list[int]:
    def fail(what: str) -> LayoutError:
        return LayoutError(f"{flag_value(MEGATRON_FLAG, text)}: {what}")

    first: dict[str, int] = {}
    for sym, pos in symbols:
        if sym in "ENL" and sym in first:
            how = "through a repeat" if pos == first[sym] else f"first at position {first[sym]}"
            raise fail(f"{sym} at position {pos} appears a second time ({how}); expected it at most once")
        first.setdefault(sym, pos)
    n_segments = 1 + sum(s == "|" for s, _ in symbols)
    segment, counts = 0, [0]
    for i, (sym, pos) in enumerate(symbols):
        if sym == "|":
            segment += 1
            counts.append(0)
        elif sym == "t":
            counts[-1] += 1
        elif sym == "E" and (segment != 0 or counts[0]):
            where = f"in segment {segment}" if segment else "after a t"
            raise fail(f"E at position {pos} is {where}; expected it in the first segment, before any t")
        elif sym == "N" and (i + 1 >= len(symbols) or symbols[i + 1][0] != "L"):
            raise fail(f"N at position {pos} is not directly before L; "
                       f"expected the final norm right before the lm head, in the last segment")
        elif sym == "L" and i != len(symbols) - 1:
            raise fail(f"L at position {pos} is not the last symbol; expected it at the end of the last segment")
    for sym, name in (("E", "embedding"), ("L", "lm head")):
        if sym not in first:
            raise fail(f"has no {sym}; expected the {name} exactly once")
    if n_segments % pp:
        raise fail(f"has {n_segments} segments, but {PP_FLAG} is {pp}; "
                   f"expected a multiple of {pp} (segment i goes to stage i % {pp})")
    layers = sum(counts)
    if layers != num_layers:
        raise fail(f"has {layers} t, but the model has {num_layers} layers; expected one t per layer")
    return counts
