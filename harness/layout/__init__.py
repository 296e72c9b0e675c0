"""Pipeline layouts: which transformer layers, and the embedding / final norm / lm head, live on
which pipeline stage and virtual chunk. Pure Python; importing it never imports torch.

See docs/pipeline_layout_guide.md.
"""

from .costs import LayerCosts, parse_costs
from .errors import LayoutError
from .layout import PipelineLayout
from .profile import RECORD_FORMAT, read_profile
from .resolve import layout_from_flags, resolve_layout
from .solver import balance_stages, stage_costs

__all__ = ["RECORD_FORMAT", "LayerCosts", "LayoutError", "PipelineLayout", "balance_stages", "parse_costs",
           "layout_from_flags", "read_profile", "resolve_layout", "stage_costs"]
