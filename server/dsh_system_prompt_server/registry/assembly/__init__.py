"""How one assembly is made: the plan from the layers, its steps, the tool order, the invariants
every returned assembly satisfies, and the provenance it records.

Imported by the registry's own modules (`registry.py`) and, for the plan, by `rpc/assemble/`.
"""
