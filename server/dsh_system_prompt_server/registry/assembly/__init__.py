"""How one assembly is made: the plan from the layers, its steps, the tool order, the invariants
every returned assembly satisfies, and the provenance it records.

Inside `registry/`: it may import the registry's own modules and `callbacks/`' face; the
registry's face re-exports what the floors above need (the plan).
"""

from .plan import Plan, plan_of
from .steps import assemble_plan
from .tool_order import validate_tool_order

__all__ = ["Plan", "assemble_plan", "plan_of", "validate_tool_order"]
