"""Static memory planning: liveness, in-place sharing, offsets in one arena, and its report.

Empty until the memory-planner issue lands; the package exists so the layout of DESIGN.md holds.
"""
