"""Static memory planning: live intervals, in-place sharing, offsets in one arena, and a checker.

    order = memory_order(steps, nbytes, external=state, live_out=outputs)   # the steps' best order
    plan = plan_memory(steps, nbytes, external=state, live_out=outputs, alignment=64)
    plan.peak_bytes, plan.lower_bound_bytes, plan.naive_bytes
    verify(plan)            # PlanError unless no two live values overlap
    plan.plot("plan.png")   # time across, address up
"""

from .liveness import Interval, ReadBeforeWrite, Step, intervals, owners
from .order import affordable, beside_joins, joins, memory_order, overlapped
from .offsets import ORDERS, Request, best_placement, live_bytes, most_live, place, sweep
from .plan import Buffer, MemoryPlan, Placement, aligned, plan_memory, read_through_view, unallocatable
from .verify import verify

__all__ = ["Step", "ReadBeforeWrite", "Interval", "intervals", "owners", "memory_order", "overlapped", "joins",
           "beside_joins", "affordable",
           "Request", "place", "sweep", "best_placement",
           "live_bytes", "most_live", "ORDERS", "MemoryPlan", "Placement", "Buffer", "plan_memory", "aligned",
           "read_through_view", "unallocatable", "verify"]
