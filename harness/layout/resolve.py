"""A layout from flags: `layout_from_flags` is the one function the trainer, the runner's plan
stage and the coverage table build a layout with; resolve_layout takes the values one by one."""

from __future__ import annotations

from typing import Any, Mapping

from .errors import (CHUNK_LAYOUT_FLAG, COSTS_FLAG, MEGATRON_FLAG, PARTITION_FLAG, PP_FLAG, VPP_FLAG,
                     LayoutError, check_chunk_count, check_count, flag_value)
from .layout import PipelineLayout

# The layout's flags by name (as harness.contracts.flags names them), and resolve_layout's argument
# each one is.
LAYOUT_OPTIONS = {"pipeline_layer_partition": "partition", "pipeline_layer_costs": "costs",
                  "pipeline_chunk_layout": "chunk_layout",
                  "pipeline_model_parallel_layout": "megatron_layout"}


def layout_from_flags(num_layers: int, flags: Mapping[str, Any]) -> PipelineLayout:
    """The layout a run of these flags places (flag name -> value; absent: the default)."""
    return resolve_layout(num_layers, int(flags.get("pipeline_parallel") or 1),
                          int(flags.get("virtual_pipeline_parallel") or 1),
                          **{arg: flags.get(name) for name, arg in LAYOUT_OPTIONS.items()})


def resolve_layout(num_layers: int, pp: int, vpp: int = 1, partition: str | None = None,
                   costs: str | None = None, chunk_layout: str | None = None,
                   megatron_layout: str | None = None) -> PipelineLayout:
    """The layout the flags ask for: the one layout option given, or the uniform split.

    An option that is None or blank counts as not given (gflags-style string flags default to "").
    At most one option may be given. Partition and costs place one chunk per stage, so they need
    vpp == 1. A chunk layout or Megatron string fixes vpp itself; vpp == 1 (the default) accepts
    whatever it says, any other vpp must agree with it.
    """
    check_count("num_layers", num_layers)
    check_count(PP_FLAG, pp)
    check_count(VPP_FLAG, vpp)
    check_chunk_count(pp, vpp)
    given = {flag: value for flag, value in ((PARTITION_FLAG, partition), (COSTS_FLAG, costs),
                                             (CHUNK_LAYOUT_FLAG, chunk_layout), (MEGATRON_FLAG, megatron_layout))
             if value is not None and not (isinstance(value, str) and value.strip() == "")}
    if len(given) > 1:
        named = " and ".join(flag_value(f, v) for f, v in given.items())
        raise LayoutError(f"{named} are given together; expected at most one pipeline layout option")
    if not given:
        return PipelineLayout.uniform(num_layers, pp, vpp)
    (flag, value), = given.items()
    if flag in (PARTITION_FLAG, COSTS_FLAG) and vpp != 1:
        raise LayoutError(f"{flag_value(flag, value)} places one chunk per stage, but {VPP_FLAG} is {vpp}; "
                          f"expected {VPP_FLAG} 1, or use {CHUNK_LAYOUT_FLAG} or {MEGATRON_FLAG} for virtual stages")
    if flag == PARTITION_FLAG:
        return PipelineLayout.from_partition(num_layers, value, pp=pp)
    if flag == COSTS_FLAG:
        return PipelineLayout.from_costs(num_layers, pp, value)
    build = PipelineLayout.from_chunk_layout if flag == CHUNK_LAYOUT_FLAG else PipelineLayout.from_megatron
    layout = build(num_layers, pp, value)
    if vpp != 1 and layout.vpp != vpp:
        raise LayoutError(f"{flag_value(flag, value)} gives {layout.vpp} chunks per stage, but {VPP_FLAG} is {vpp}; "
                          f"expected them to agree (or leave {VPP_FLAG} at 1 to take the layout's)")
    return layout
