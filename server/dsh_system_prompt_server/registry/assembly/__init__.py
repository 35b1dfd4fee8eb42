"""How one assembly is made: the plan from the layers, its steps, the tool order, the invariants
every returned assembly satisfies, and the provenance it records.

Imported by the registry's own modules (`registry.py`) and, for the plan, by `rpc/assemble/`.
"""

from .plan import Plan, plan_of
from .steps import assemble_plan
from .tool_order import validate_tool_order

__all__ = ["Plan", "assemble_plan", "plan_of", "validate_tool_order"]
