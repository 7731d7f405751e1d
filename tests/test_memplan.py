"""The memory planner on its own: liveness, in-place sharing, offsets, the checker, the picture."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortado.errors import PlanError
from cortado.memplan import (MemoryPlan, Placement, ReadBeforeWrite, Request, Step, best_placement, intervals,
                             memory_order, place, plan_memory, verify)
from cortado.memplan.liveness import matched_in_order
from cortado.memplan.order import _peak


def test_a_value_lives_from_its_step_to_its_last_read_through_views():
    steps = [Step(("a",)), Step(("t",), ("a",), view_of="a"), Step(("b",), ("a",)), Step(("c",), ("t", "b"))]
    lives = intervals(steps, live_out=["c"])
    assert (lives["a"].start, lives["a"].end) == (0, 3)  # read through its view t at step 3
    assert (lives["b"].start, lives["b"].end) == (2, 3)
    assert (lives["c"].start, lives["c"].end) == (3, 4)  # an output: read after the last step
    assert "t" not in lives  # a view owns no storage


def test_inplace_chains_share_one_buffer_and_dead_values_are_reused():
    steps = [
        Step(("a",)),
        Step(("b",), ("a",), inplace=(("b", "a"),)),
        Step(("c",), ("b",), inplace=(("c", "b"),)),
        Step(("d",), ("c",)),
        Step(("e",), ("d",)),
    ]
    plan = plan_memory(steps, dict.fromkeys("abcde", 256), live_out=["e"])
    verify(plan)
    assert plan["b"].takes_from == "a" and plan["c"].takes_from == "b"
    assert plan["a"].offset == plan["b"].offset == plan["c"].offset
    assert plan.peak_bytes == plan.lower_bound_bytes == 512
    assert plan.naive_bytes == 5 * 256


def test_inplace_needs_the_donor_to_die_at_that_step_and_the_same_size():
    steps = [
        Step(("a",)),
        Step(("b",), ("a",), inplace=(("b", "a"),)),  # a is read again later: no sharing
        Step(("c",), ("a", "b"), inplace=(("c", "b"),)),  # b is smaller than c: no sharing
    ]
    plan = plan_memory(steps, {"a": 64, "b": 64, "c": 128}, live_out=["c"])
    assert plan["b"].takes_from is None and plan["c"].takes_from is None
    verify(plan)


def test_external_values_are_not_placed_and_workspace_lives_for_its_step():
    steps = [Step(("a",), ("W",)), Step(("b",), ("a", "W"), workspace=100, label="k1")]
    plan = plan_memory(steps, {"a": 64, "b": 64}, external=["W"], live_out=["b"])
    assert "W" not in plan
    workspace = plan[("workspace", 1)]
    assert (workspace.start, workspace.end, workspace.nbytes) == (1, 1, 100)
    assert plan.peak_bytes == 64 + 64 + 128  # 100 bytes aligned to 64
    verify(plan)


def test_alignment_rounds_every_size_and_must_be_a_power_of_two():
    plan = plan_memory([Step(("a",)), Step(("b",), ("a",))], {"a": 1, "b": 300}, live_out=["b"], alignment=256)
    assert all(p.offset % 256 == 0 for p in plan.placements)
    assert plan.peak_bytes == 256 + 512
    with pytest.raises(PlanError, match="power of two"):
        plan_memory([Step(("a",))], {"a": 1}, alignment=48)


def test_best_fit_takes_the_smallest_gap_that_holds_the_buffer():
    from cortado.memplan.offsets import _best_fit

    taken = [0, 100, 228, 300, 556, 600]  # free: 128 bytes at 100, 256 at 300, everything from 600
    assert _best_fit(taken, 64) == 100
    assert _best_fit(taken, 200) == 300
    assert _best_fit(taken, 300) == 600
    assert _best_fit([], 300) == 0
    assert _best_fit([64, 128], 64) == 0


def test_a_buffer_goes_into_a_gap_left_by_a_dead_one():
    # during steps 1..3 only the two long buffers are live: the 600 bytes between them are free
    requests = [Request("long", 1000, 0, 3), Request("short", 600, 0, 0), Request("top", 500, 0, 3),
                Request("late", 200, 2, 3)]
    offsets, peak = place(requests, 4, "size-first")
    assert offsets["late"] == offsets["short"] == 1000
    assert peak == 2100


def test_the_smaller_of_the_two_orders_is_kept():
    # size-first puts the big short buffer low; lifetime-first stacks the long ones first
    requests = [Request("long1", 64, 0, 9), Request("short_big", 512, 0, 0), Request("long2", 64, 1, 9),
                Request("mid", 448, 1, 9)]
    order, offsets, peak = best_placement(requests, 10)
    assert peak == min(place(requests, 10, o)[1] for o in ("size-first", "lifetime-first"))


def _placements(draw, count, overlap_ok):
    placements = []
    for k in range(count):
        start = draw(st.integers(0, 12))
        end = draw(st.integers(start, 14))
        size = draw(st.sampled_from([0, 64, 128, 192, 256]))
        offset = draw(st.integers(0, 8)) * 64
        placements.append(Placement(k, f"v{k}", offset, size, start, end))
    return placements


def _overlapping_pairs(placements):
    return [(p, q) for p, q in itertools.combinations(placements, 2)
            if p.nbytes and q.nbytes and p.start <= q.end and q.start <= p.end
            and p.offset < q.offset + q.nbytes and q.offset < p.offset + p.nbytes]


@given(st.data())
def test_verify_agrees_with_checking_every_pair(data):
    placements = _placements(data.draw, data.draw(st.integers(1, 12)), True)
    plan = MemoryPlan(placements, 15, 64, "size-first", 0)
    if _overlapping_pairs(placements):
        with pytest.raises(PlanError, match="overlaps"):
            verify(plan)
    else:
        assert verify(plan)


def test_verify_allows_only_a_declared_inplace_take():
    a = Placement("a", "a", 0, 64, 0, 2)
    b_declared = Placement("b", "b", 0, 64, 2, 3, takes_from="a")
    b_undeclared = Placement("b", "b", 0, 64, 2, 3)
    assert verify(MemoryPlan([a, b_declared], 4, 64, "size-first", 0))
    with pytest.raises(PlanError, match="overlaps"):
        verify(MemoryPlan([a, b_undeclared], 4, 64, "size-first", 0))
    early = Placement("b", "b", 0, 64, 1, 3, takes_from="a")  # a is still read at step 2
    with pytest.raises(PlanError, match="not dying"):
        verify(MemoryPlan([a, early], 4, 64, "size-first", 0))


@st.composite
def programs(draw):
    """Random steps: each defines one value, reads some earlier ones, maybe views or shares one."""
    count = draw(st.integers(1, 25))
    steps, sizes = [], {}
    for k in range(count):
        earlier = list(range(k))
        reads = tuple(draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True))) if earlier else ()
        sizes[k] = draw(st.sampled_from([0, 8, 64, 100, 256, 1000]))
        view = draw(st.booleans()) and reads
        inplace = tuple((k, r) for r in reads if draw(st.booleans()))
        steps.append(Step((k,), reads, view_of=reads[0] if view else None, inplace=() if view else inplace,
                          workspace=draw(st.sampled_from([0, 0, 32, 500]))))
    outputs = draw(st.lists(st.sampled_from(range(count)), max_size=3))
    return steps, sizes, outputs


@given(programs(), st.sampled_from([64, 256]))
def test_random_plans_verify_and_never_beat_the_lower_bound(program, alignment):
    steps, sizes, outputs = program
    plan = plan_memory(steps, sizes, live_out=outputs, alignment=alignment)
    assert verify(plan)
    assert plan.lower_bound_bytes <= plan.peak_bytes <= plan.naive_bytes


@st.composite
def regions(draw):
    """A region's in-place pairs as a ``ReadBeforeWrite`` (results written and operands last read at random places of
    its body, of two kinds, an operand maybe read twice), with random costs (most results' pairs each of one cost, one
    result's maybe of two) and which values are free or may take a place."""
    outputs, operands = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    written = draw(st.lists(st.integers(0, 4), min_size=outputs, max_size=outputs))
    last_read = draw(st.lists(st.integers(-1, 4), min_size=operands, max_size=operands))
    kinds = st.sampled_from(["a", "b"])
    defined_kinds = draw(st.lists(kinds, min_size=outputs, max_size=outputs))
    read_kinds = draw(st.lists(kinds, min_size=operands, max_size=operands))
    reads = [f"r{draw(st.integers(0, operands - 1))}" for _ in range(operands)]  # a value may be read twice
    at_write = frozenset((k, m) for k in range(outputs) for m in range(operands)
                         if last_read[m] == written[k] and draw(st.booleans()))
    pairs = ReadBeforeWrite(tuple(f"d{k}" for k in range(outputs)), tuple(written), tuple(defined_kinds), tuple(reads),
                            tuple(last_read), tuple(read_kinds), at_write)
    listed = list(pairs)
    costs = {}
    for defined in draw(st.lists(st.sampled_from(pairs.defined), max_size=2, unique=True)):
        cost = draw(st.sampled_from([10, 50, 90]))
        costs.update({pair: cost for pair in listed if pair[0] == defined})
    if listed and draw(st.booleans()):
        costs[draw(st.sampled_from(listed))] = draw(st.sampled_from([10, 50, 90]))  # pairs of one result may differ
    values = sorted(set(pairs.defined) | set(pairs.reads))
    free = set(draw(st.lists(st.sampled_from(values), unique=True)))
    takers = set(draw(st.lists(st.sampled_from(values), unique=True)))
    sizes = {v: draw(st.sampled_from([64, 64, 128])) for v in values}
    return pairs, listed, costs, free, takers, sizes


@settings(max_examples=300)
@given(regions(), st.data())
def test_a_regions_pairs_are_taken_as_its_listed_pairs_would_be(region, data):
    pairs, listed, costs, free, takers, sizes = region
    assert listed == [(pairs.defined[k], pairs.reads[m]) for k in range(len(pairs.defined)) for m in pairs.candidates(k)]
    for value in sorted(set(pairs.defined) | set(pairs.reads)):
        other = data.draw(st.sampled_from(sorted(set(pairs.reads) | {"nothing"})))
        assert ((value, other) in pairs) == ((value, other) in listed)
    expected = matched_in_order(sorted(listed, key=lambda pair: costs.get(pair, 50)), takers.__contains__,
                                free.__contains__, sizes.get)
    assert pairs.matched(costs, 50, takers.__contains__, free.__contains__, sizes.get) == expected


def test_a_step_plans_the_same_with_its_pairs_listed_or_not():
    # a region reading a0..a3 and writing d0..d3 where each operand is last read before each result is written
    pairs = ReadBeforeWrite(("d0", "d1", "d2", "d3"), (5, 6, 7, 8), ("f",) * 4, ("a0", "a1", "a2", "a3"), (1, 2, 3, 4),
                            ("f",) * 4)
    loads = [Step((read,)) for read in pairs.reads]
    later = [Step(("out",), ("d0", "d1", "d2", "d3"))]
    sizes = dict.fromkeys(["a0", "a1", "a2", "a3", "d0", "d1", "d2", "d3", "out"], 64)
    plans = [plan_memory(loads + [Step(pairs.defined, pairs.reads, inplace=inplace)] + later, sizes, live_out=["out"])
             for inplace in (pairs, tuple(pairs))]
    assert [(p.key, p.offset, p.takes_from) for p in plans[0].placements] == \
        [(p.key, p.offset, p.takes_from) for p in plans[1].placements]
    assert [p.takes_from for p in plans[0].placements if p.key in pairs.defined] == ["a0", "a1", "a2", "a3"]


def test_planning_a_long_nested_program_is_fast_enough_to_be_linear():
    # forward values live until their mirror-image backward step: every pair overlaps in time
    n = 4000
    steps = [Step((k,), (k - 1,) if k else ()) for k in range(n)]
    steps += [Step((n + k,), (n - 1 - k, n + k - 1)) for k in range(n)]
    plan = plan_memory(steps, dict.fromkeys(range(2 * n), 64), live_out=[2 * n - 1])
    assert plan.peak_bytes == plan.lower_bound_bytes
    assert verify(plan)


def test_the_plan_draws_as_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    steps = [Step(("a",)), Step(("b",), ("a",), inplace=(("b", "a"),)), Step(("c",), ("b",), workspace=64)]
    plan = plan_memory(steps, {"a": 128, "b": 128, "c": 64}, live_out=["c"])
    path = plan.plot(tmp_path / "plan.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_memory_order_runs_a_step_that_frees_a_value_as_soon_as_it_can():
    # a (big) is read by b and by the late c; the depth-first order computes d and e (both big) first
    steps = [Step(("a",)), Step(("b",), ("a",)), Step(("d",), ("b",)), Step(("e",), ("d",)), Step(("c",), ("a",)),
             Step(("f",), ("e", "c"))]
    sizes = {"a": 1000, "b": 10, "c": 10, "d": 1000, "e": 1000, "f": 10}
    order = memory_order(steps, sizes, live_out=["f"])
    assert order.index(4) < order.index(2)  # c, a's last reader, before d is made
    assert _peak([steps[i] for i in order], sizes, (), ["f"]) < _peak(steps, sizes, (), ["f"])


def test_an_ordering_constraint_holds_a_step_back():
    steps = [Step(("W",)), Step(("u",), ("W",)), Step(("r",), ("W",))]  # u would overwrite W: r must read it first
    assert memory_order(steps, dict.fromkeys("Wur", 8), live_out=["u", "r"], after=[(2, 1)]) == [0, 2, 1]


@given(programs(), st.data())
def test_the_memory_order_respects_every_dependency_and_never_keeps_more_alive(program, data):
    steps, sizes, outputs = program
    after = data.draw(st.lists(st.tuples(st.integers(0, len(steps) - 1), st.integers(0, len(steps) - 1))
                               .map(sorted).map(tuple), max_size=3))  # earlier before later: never a cycle
    order = memory_order(steps, sizes, live_out=outputs, after=after)
    assert sorted(order) == list(range(len(steps)))
    position = {step: i for i, step in enumerate(order)}
    for j, step in enumerate(steps):
        assert all(position[r] < position[j] for r in step.reads)  # values are keys and indices alike here
    assert all(position[i] <= position[j] for i, j in after)
    assert _peak([steps[i] for i in order], sizes, (), outputs) <= _peak(steps, sizes, (), outputs)


def test_a_group_lies_side_by_side_for_its_members_whole_span_and_shares_nothing_in_place():
    steps = [Step(("g1",)), Step(("x",), ("g1",), inplace=(("x", "g1"),)), Step(("g2",), ("x",)),
             Step(("r",), ("x", "g2")), Step(("y",), ("r",))]
    plan = plan_memory(steps, {"g1": 100, "x": 100, "g2": 64, "r": 64, "y": 64}, live_out=["y"], alignment=64,
                       groups=[("g2", "g1")])
    verify(plan)
    assert plan["g1"].offset == plan["g2"].offset + 64  # in the group's order, each aligned
    assert plan["x"].takes_from is None  # g1 dies at step 1 but is grouped: x takes nothing of it
    left_out = plan_memory(steps, {"g1": 100, "x": 100, "g2": 64, "r": 64, "y": 64}, external=["g2"],
                           live_out=["y"], groups=[("g2", "g1")])
    assert left_out["x"].takes_from == "g1"  # a group with a member the arena does not hold is no group


def test_an_asynchronous_step_runs_early_and_what_waits_for_it_last_in_the_order_they_were_issued():
    from cortado.memplan import joins, overlapped

    steps = [Step(("g1",)), Step(("a1",), ("g1",)), Step(("g2",)), Step(("a2",), ("g2",)), Step(("h",)),
             Step(("u2",), ("a2",)), Step(("u1",), ("a1",)), Step(("k",), ("h",))]
    order = overlapped(range(len(steps)), steps, [1, 3])
    assert order == [0, 1, 2, 3, 4, 7, 6, 5]  # u1 waits for the first all-reduce: it runs first of the late
    placed = [steps[i] for i in order]
    assert joins(placed, [1, 3]) == {1: 6, 3: 7}


def test_a_step_beside_the_others_is_waited_for_where_its_values_are_needed_and_holds_its_reads_until_then():
    from cortado.memplan import beside_joins

    # u1 and u2 write state s1, s2 in place (sinks); w writes s3, which u2 reads; r reads u3's result
    steps = [Step(("g1",)), Step(("u1",), ("g1", "s1")), Step(("g2",)), Step(("u2",), ("g2", "s2", "s3")),
             Step(("w",), ("g2",)), Step(("u3",), ("g1",), workspace=64), Step(("r",), ("u3",))]
    sinks = {"u1": "s1", "u2": "s2", "w": "s3"}
    assert beside_joins(steps, [1, 3], sinks) == {1: 7, 3: 4}  # u2 is waited for before w writes over s3
    assert beside_joins(steps, [3, 5], sinks) == {3: 4, 5: 6}  # r reads what u3 defines
    sizes = {k: 64 for k in ("g1", "g2", "w", "u3", "r")}
    external = ["s1", "s2", "s3", "u1", "u2"]
    plan = plan_memory(steps, sizes, external=external, live_out=["r"], held={"g2": 7, ("workspace", 5): 7})
    verify(plan)
    assert plan["g2"].offset not in (plan["u3"].offset, plan["r"].offset)  # read beside until the end: kept
    assert plan[("workspace", 5)].end == 7
    alone = plan_memory(steps, sizes, external=external, live_out=["r"])
    assert alone["g2"].offset == alone["u3"].offset and alone[("workspace", 5)].end == 5  # without: shared


def test_a_step_runs_beside_only_where_holding_what_it_reads_adds_nothing_to_the_most_bytes_live():
    from cortado.memplan import affordable, beside_joins

    steps = [Step(("a",)), Step(("b",), ("a",)), Step(("u1",), ("a", "s1")), Step(("c",), ("b",)),
             Step(("d",), ("c",)), Step(("u2",), ("d", "s2"), workspace=8), Step(("e",), ("d",))]
    sizes = {"a": 100, "b": 100, "c": 300, "d": 10, "e": 10}
    sinks = {"u1": "s1", "u2": "s2"}
    joins = beside_joins(steps, [2, 5], sinks)
    assert joins == {2: 7, 5: 7}
    # u1 holding a (100 bytes) until the end would lie beside b and c, the most live (400): it runs in order
    assert affordable(steps, sizes, ["s1", "s2", "u1", "u2"], ["e"], joins) == {5: 7}
    assert affordable(steps, {**sizes, "a": 0}, ["s1", "s2", "u1", "u2"], ["e"], joins) == joins


@st.composite
def programs_with_updates(draw):
    """Random steps (each reading earlier values and state), some of them updates written over their state."""
    n = draw(st.integers(2, 12))
    steps, sinks = [], {}
    for j in range(n):
        reads = tuple(f"v{i}" for i in range(j) if draw(st.integers(0, 3)) == 0)
        reads += tuple(f"s{k}" for k in range(3) if draw(st.integers(0, 3)) == 0)
        steps.append(Step((f"v{j}",), reads))
        if draw(st.integers(0, 2)) == 0:
            sinks[f"v{j}"] = f"s{draw(st.integers(0, 2))}"
    beside = [j for j in range(n) if f"v{j}" in sinks and draw(st.booleans())]
    return steps, sinks, beside


@given(programs_with_updates())
def test_a_step_beside_is_waited_for_before_anything_needs_it(program):
    from cortado.memplan import affordable, beside_joins

    steps, sinks, beside = program
    found = beside_joins(steps, beside, sinks)
    assert sorted(found) == sorted(beside)
    def needs(i, k):  # step k reads what step i writes or writes over what it reads
        return {f"v{i}", sinks.get(f"v{i}")} & set(steps[k].reads) or sinks.get(f"v{k}") in steps[i].reads

    for i, j in found.items():
        assert i < j <= len(steps)
        assert not any(needs(i, k) for k in range(i + 1, j)) and (j == len(steps) or needs(i, j))
    sizes = {f"v{j}": 64 * (1 + j % 3) for j in range(len(steps))}
    external = [f"s{k}" for k in range(3)] + list(sinks)
    taken = affordable(steps, sizes, external, [steps[-1].defines[0]], found)
    held = {value: j for i, j in taken.items() for value in steps[i].reads}
    plans = [plan_memory(steps, sizes, external, [steps[-1].defines[0]], held=h) for h in (held, {})]
    verify(plans[0])
    assert plans[0].lower_bound_bytes <= plans[1].lower_bound_bytes  # waiting for them adds nothing at the most


def test_an_in_place_group_takes_the_place_of_the_group_it_reads_where_each_value_dies_there():
    steps = [Step(("g1",)), Step(("g2",)), Step(("r1", "r2"), ("g1", "g2")), Step(("u",), ("r1", "r2"))]
    sizes = {"g1": 64, "g2": 128, "r1": 64, "r2": 128, "u": 64}
    plan = plan_memory(steps, sizes, live_out=["u"], in_place_groups=[(("g1", "g2"), ("r1", "r2"))])
    verify(plan)
    assert (plan["r1"].takes_from, plan["r2"].takes_from) == ("g1", "g2")
    assert plan["g2"].offset == plan["g1"].offset + 64 == plan["r2"].offset
    kept = plan_memory(steps, sizes, live_out=["u", "g2"], in_place_groups=[(("g1", "g2"), ("r1", "r2"))])
    verify(kept)  # g2 is read after the step: both groups lie apart, each side by side
    assert kept["r1"].takes_from is None
    assert kept["g2"].offset == kept["g1"].offset + 64 and kept["r2"].offset == kept["r1"].offset + 64


@st.composite
def asynchronous_programs(draw):
    """Random steps (each reading earlier ones), some asynchronous, issued in index order, and some orderings."""
    n = draw(st.integers(2, 12))
    steps = [Step((f"v{j}",), tuple(f"v{i}" for i in range(j) if draw(st.booleans()) and draw(st.booleans())))
             for j in range(n)]
    asynchronous = [j for j in range(n) if draw(st.integers(0, 2)) == 0]
    after = [(i, j) for i in range(n) for j in range(i + 1, n) if draw(st.integers(0, 19)) == 0]
    return steps, asynchronous, after


@given(asynchronous_programs())
def test_overlapping_keeps_every_step_and_dependency_and_issues_in_sequence(program):
    from cortado.memplan import overlapped
    from cortado.memplan.order import _waits

    steps, asynchronous, after = program
    order = overlapped(list(range(len(steps))), steps, asynchronous, after)
    assert sorted(order) == list(range(len(steps)))
    at = {j: k for k, j in enumerate(order)}
    assert all(at[i] < at[j] for j, waits in enumerate(_waits(steps, after)) for i in waits)
    assert [j for j in order if j in asynchronous] == asynchronous
