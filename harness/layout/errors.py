"""The one exception type of the layout engine, and the flag names its messages use.

Messages name the trainer's flag even when a constructor is called directly, so the text a
user sees is the same whether the trainer, the suggestion tool or a test raised it.
"""

PARTITION_FLAG = "--pipeline_layer_partition"
COSTS_FLAG = "--pipeline_layer_costs"
CHUNK_LAYOUT_FLAG = "--pipeline_chunk_layout"
MEGATRON_FLAG = "--pipeline_model_parallel_layout"
PP_FLAG = "--pipeline_parallel"
VPP_FLAG = "--virtual_pipeline_parallel"


class LayoutError(ValueError):
    """A pipeline layout value is invalid; the message names the flag, the value and why."""


def flag_value(flag: str, value: object) -> str:
    """`--flag 'value'`: the prefix every message about a flag's value starts with."""
    return f"{flag} {str(value)!r}"


def split_entries(flag: str, text: str, what: str) -> list[str]:
    """Comma-separated entries, stripped; an empty entry is an error (it is always a typo)."""
    if not isinstance(text, str):
        raise LayoutError(f"{flag} must be a string, got {type(text).__name__} {text!r}")
    entries = [e.strip() for e in text.split(",")]
    if text.strip() == "":
        raise LayoutError(f"{flag_value(flag, text)} is empty; expected {what}")
    for i, entry in enumerate(entries):
        if entry == "":
            raise LayoutError(
                f"{flag_value(flag, text)} has an empty entry at position {i + 1}; expected {what}")
    return entries


def parse_int(flag: str, text: str, entry: str, what: str, minimum: int) -> int:
    """A base-10 integer entry >= minimum ('1.5' and '0x3' are refused)."""
    try:
        value = int(entry, 10)
    except ValueError:
        raise LayoutError(
            f"{flag_value(flag, text)}: entry {entry!r} is not an integer; expected {what}") from None
    if value < minimum:
        kind = "positive" if minimum == 1 else f">= {minimum}"
        raise LayoutError(
            f"{flag_value(flag, text)}: entry {entry!r} is not {kind}; expected {what}")
    return value


# Upper bound on any count a layout is built from (layers, stages, chunks per stage, chunks):
# every one of them sizes a list, so a count taken from input is bounded before anything is
# allocated from it. No pipeline has 65536 stages or a model 65536 layers.
MAX_COUNT = 1 << 16


def check_count(flag: str, value: object, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """A size argument such as pp or num_layers: an int in [minimum, maximum] (bool is not an
    int here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LayoutError(f"{flag} must be an integer, got {value!r}")
    if value < minimum:
        raise LayoutError(f"{flag} must be >= {minimum}, got {value}")
    if value > maximum:
        raise LayoutError(f"{flag} must be <= {maximum}, got {value}")
    return value


def check_chunk_count(pp: int, vpp: int) -> None:
    """pp * vpp chunks, each a list entry: bounded like every other count."""
    if pp * vpp > MAX_COUNT:
        raise LayoutError(f"{PP_FLAG} {pp} x {VPP_FLAG} {vpp} = {pp * vpp} pipeline chunks; "
                          f"expected at most {MAX_COUNT}")
