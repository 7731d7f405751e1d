"""compile() and the CPU executor against the reference interpreter; state, updates, errors, memory."""

import re
import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cortado as ct
from cortado import nn, optim
from cortado.exprgraph.dtypes import is_float
from cortado.memplan import verify
from cortado.testing import graphs_with_feeds
from reference_checks import made_in

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from mlp_numpy import initial_values, mlp  # noqa: E402

TOLERANCE = {"bfloat16": (3e-2, 4e-3), "float16": (1e-2, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}


def assert_same(ours, expected, computed_in=None):
    """Equal, to the tolerance of the values' dtype, or of ``computed_in`` where they were computed from values of
    that (narrower) dtype: the rules may round those otherwise than the reference (``log(exp(x))`` is ``x``)."""
    assert ours.shape == expected.shape and ours.dtype == expected.dtype
    if is_float(ours.dtype):
        rtol, atol = TOLERANCE[(computed_in or ours.dtype).name]
        np.testing.assert_allclose(ours.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True)
    else:
        np.testing.assert_array_equal(ours, expected)


# -- against the reference interpreter --------------------------------------------------------


@given(graphs_with_feeds(dtypes=("float16", "float32", "float64", "bfloat16")))
def test_random_graphs_compile_to_the_values_the_reference_computes(case):
    graph, feeds = case
    program = ct.compile(list(graph.outputs), inputs=graph.inputs, debug=True)
    for output, ours, expected in zip(graph.outputs, program(**feeds), ct.evaluate(graph.outputs, feeds)):
        assert_same(ours, expected, made_in(output))
    assert verify(program.memory)
    assert program.memory.peak_bytes >= program.memory.lower_bound_bytes


@given(graphs_with_feeds(), st.data())
def test_random_state_and_updates_follow_the_reference_call_after_call(case, data):
    graph, feeds = case
    state = {v: feeds[v.name] for v in graph.inputs[:1]}
    inputs = graph.inputs[1:]
    updates = {}
    for v in state:  # each update reads the old values of everything: its variable and the outputs
        out = graph.outputs[data.draw(st.integers(0, len(graph.outputs) - 1))]
        mixed = ct.sum(ct.cast(out, v.dtype)) * 0.001 if out.dtype.kind in "fiub" else 0.0
        updates[v] = v * 0.5 + mixed
    program = ct.compile(list(graph.outputs), inputs=inputs, state=state, updates=updates, debug=True)
    current = dict(feeds)
    for _ in range(2):
        expected = ct.evaluate(list(graph.outputs) + list(updates.values()), current)
        results = program(**{v.name: current[v.name] for v in inputs})
        for output, ours, theirs in zip(graph.outputs, results, expected):
            assert_same(ours, theirs, made_in(output))
        for v, theirs in zip(updates, expected[len(graph.outputs):]):
            ours = np.array(program.state[v.name])
            assert_same(ours, theirs, made_in(updates[v]))
            current[v.name] = ours  # the next call from the same state: a value made in a narrower dtype may round
            # otherwise than the reference (log(1 + x) is log1p(x))


def test_every_op_family_compiles_exactly():
    x = ct.var("x", (6, 5))
    y = ct.var("y", (5, 6), "float64")
    n = ct.var("n", (6, 5), "int32")
    terms = [
        ct.sigmoid(x), ct.softplus(x), ct.relu(x - 0.5), ct.where(x > 0, x, -x), ct.cast(x, "int16"),
        ct.sum(x, axis=0), ct.mean(x, axis=1, keepdims=True), ct.max(x), ct.logsumexp(x, axis=1),
        ct.softmax(x, axis=0), ct.log_softmax(x), x @ ct.cast(y, "float32"), ct.einsum("ij,jk->ik", x, y),
        ct.transpose(x).reshape(30), ct.broadcast_to(ct.sum(x, axis=0), (3, 5)),
        ct.mean(n, axis=0), ct.sigmoid(n), ct.logsumexp(n), ct.sum(ct.cast(x, "float16") * 2, axis=1),
        ct.mean(ct.cast(x, "float16")), ct.gelu(x), ct.gelu_grad(x), ct.gelu(ct.cast(x, "bfloat16")),
    ]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((6, 5)).astype(np.float32), "y": rng.standard_normal((5, 6)),
             "n": rng.integers(-3, 4, (6, 5)).astype(np.int32)}
    program = ct.compile(terms, inputs=[x, y, n], debug=True)
    for ours, expected in zip(program(**feeds), ct.evaluate(terms, feeds)):
        assert_same(ours, expected)


# -- the MLP training step of the examples ----------------------------------------------------


def _training_step(batch, sizes=(2, 32, 32, 3), seed=0, learning_rate=0.5):
    rng = np.random.default_rng(seed)
    loss, _, x, y, parameters = mlp(batch, sizes)
    gradients = ct.grad(loss, parameters)
    values = initial_values(parameters, rng)
    step = ct.compile([loss], inputs=[x, y], state={p: values[p.name] for p in parameters},
                      updates={p: p - learning_rate * g for p, g in zip(parameters, gradients)}, debug=True)
    feeds = {"x": rng.standard_normal((batch, sizes[0])).astype(np.float32),
             "y": np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], batch)]}
    return step, loss, gradients, parameters, values, feeds


def test_the_mlp_step_trains_exactly_as_the_reference_interpreter_does():
    step, loss, gradients, parameters, values, feeds = _training_step(64)
    for _ in range(3):
        loss_value, *grads = ct.evaluate([loss, *gradients], {**feeds, **values})
        (ours,) = step(**feeds)
        assert_same(ours, loss_value)
        values = {p.name: values[p.name] - 0.5 * g for p, g in zip(parameters, grads)}
        for p in parameters:
            np.testing.assert_allclose(step.state[p.name], values[p.name], rtol=1e-6, atol=1e-7)


def test_the_mlp_step_plan_is_optimal_and_beats_one_buffer_per_value():
    step = _training_step(256)[0]
    memory = step.memory
    assert memory.peak_bytes == memory.lower_bound_bytes
    assert memory.naive_bytes / memory.peak_bytes >= 1.3
    assert "computed in place" in step.explain()  # the updates write straight into the parameters


def test_a_steady_state_call_allocates_nothing_but_its_outputs():
    step, *_, feeds = _training_step(256, sizes=(64, 512, 512, 10))
    limit = 16 * 1024
    assert len([p for p in step.memory.placements if p.nbytes > limit]) >= 10  # copying any of these would show
    step(**feeds)
    tracemalloc.start()
    try:
        for _ in range(3):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            results = step(**feeds)
            extra = tracemalloc.get_traced_memory()[1] - before - sum(r.nbytes for r in results)
            # NumPy's own bookkeeping per call (its iterators, a few Python objects) is about 1 KiB
            assert extra < limit
    finally:
        tracemalloc.stop()


def test_repeated_calls_with_the_same_feeds_are_bit_identical():
    x, W = ct.var("x", (32, 16)), ct.var("W", (16, 8))
    out = ct.softmax(ct.tanh(x @ W) * 3, axis=1)
    program = ct.compile([out, ct.sum(out)], inputs=[x, W])
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((32, 16)).astype(np.float32), "W": rng.standard_normal((16, 8)).astype(np.float32)}
    first = program(**feeds)
    for _ in range(3):
        for a, b in zip(first, program(**feeds)):
            assert a.tobytes() == b.tobytes()


# -- state and updates -------------------------------------------------------------------------


def test_updates_are_all_computed_from_the_old_values():
    a, b = ct.var("a", (3,)), ct.var("b", (3,))
    program = ct.compile([a + b], state={a: np.ones(3, np.float32), b: np.full(3, 10, np.float32)},
                         updates={a: b, b: a})  # a swap
    (total,) = program()
    np.testing.assert_array_equal(total, 11)
    np.testing.assert_array_equal(program.state["a"], 10)
    np.testing.assert_array_equal(program.state["b"], 1)


def follow_the_reference(outputs, state, updates, calls=3):
    """Run a program ``calls`` times, each call against ``ct.evaluate`` on the state before it."""
    program = ct.compile(outputs, state=state, updates=updates, debug=True)
    current = {v.name: value for v, value in state.items()}
    for _ in range(calls):
        expected = ct.evaluate(list(outputs) + list(updates.values()), current)
        results = program()
        for ours, value in zip(results, expected):
            np.testing.assert_allclose(ours, value, rtol=1e-6)
        current = {v.name: value for v, value in zip(updates, expected[len(outputs):])}
        for name, value in current.items():
            np.testing.assert_allclose(program.state[name], value, rtol=1e-6)
    return program


COUPLED = {
    "sum and difference": lambda a, b: {a: a + b, b: a - b},
    "rotation": lambda a, b: {a: 0.8 * a - 0.6 * b, b: 0.6 * a + 0.8 * b},
    "leapfrog": lambda a, b: {a: a + 0.1 * b, b: b - 0.1 * (a + 0.1 * b)},
    "three-way": lambda a, b: {a: ct.tanh(b), b: a * b},
}


@pytest.mark.parametrize("couple", COUPLED.values(), ids=COUPLED.keys())
@pytest.mark.parametrize("with_output", [False, True])
def test_coupled_updates_each_read_the_old_values(couple, with_output):
    """Updates that read each other's variables cannot all be written in place: the compiler writes one
    in place where it can and computes the others into buffers of their own."""
    a, b = ct.var("a", (4,)), ct.var("b", (4,))
    state = {a: np.linspace(0.5, 1, 4).astype(np.float32), b: np.linspace(-1, 1, 4).astype(np.float32)}
    updates = couple(a, b)
    program = follow_the_reference([a * b + 1] if with_output else [], state, updates)
    assert len(program.kernels) >= 1


def test_an_output_of_a_state_variable_is_its_value_before_the_update():
    W = ct.var("W", (2, 2))
    program = ct.compile([W, W * 2], state={W: np.eye(2, dtype=np.float32)}, updates={W: W + 1})
    old, doubled = program()
    np.testing.assert_array_equal(old, np.eye(2))
    np.testing.assert_array_equal(doubled, 2 * np.eye(2))
    np.testing.assert_array_equal(program.state["W"], np.eye(2) + 1)


def test_calls_from_several_threads_run_one_at_a_time():
    """Eight threads share one program: every call sees a whole state and writes a whole update."""
    count, x = ct.var("count", ()), ct.var("x", (64, 32))
    W = ct.var("W", (32, 16))
    state = {count: np.float32(0), W: np.ones((32, 16), np.float32) / 32}
    program = ct.compile([count, ct.sum(ct.tanh(x @ W), axis=1)], inputs=[x], state=state, updates={count: count + 1})
    feeds = [np.random.default_rng(k).standard_normal((64, 32)).astype(np.float32) for k in range(8)]
    expected = [ct.evaluate(ct.sum(ct.tanh(x @ W), axis=1), {"x": f, "W": program.state["W"]}) for f in feeds]
    seen, failures = [], []

    def work(k):
        for _ in range(50):
            before, rows = program(x=feeds[k])
            seen.append(int(before))
            if not np.allclose(rows, expected[k], rtol=1e-5):
                failures.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert sorted(seen) == list(range(400)) and program.state["count"] == 400


def test_state_is_read_through_views_and_can_be_replaced():
    W = ct.var("W", (2, 3))
    program = ct.compile([ct.sum(W)], state={W: np.zeros((2, 3), np.float32)}, updates={W: W + 1})
    view = program.state["W"]
    with pytest.raises(ValueError):
        view[0, 0] = 5
    program.state["W"] = np.full((2, 3), 2, np.float32)
    assert program()[0] == 12
    np.testing.assert_array_equal(view, 3)  # a live view of the state
    with pytest.raises(ct.ShapeError):
        program.state["W"] = np.zeros((3, 2), np.float32)
    with pytest.raises(ct.FeedError, match="no state variable 'V'"):
        program.state["V"]


def test_a_rejected_call_changes_no_state():
    x, W = ct.var("x", (4, 3)), ct.var("W", (3,))
    program = ct.compile([ct.sum(x * W)], inputs=[x], state={W: np.ones(3, np.float32)}, updates={W: W * 2})
    for bad in [{"x": np.ones((4, 4), np.float32)}, {"x": np.ones((4, 3))}, {}, {"x": np.ones((4, 3), np.float32), "z": 1}]:
        with pytest.raises(ct.CortadoError):
            program(**bad)
    np.testing.assert_array_equal(program.state["W"], 1)


def test_a_failing_call_leaves_the_state_as_it_was():
    n, W = ct.var("n", (3,), "int64"), ct.var("W", (3,), "int64")
    program = ct.compile([ct.sum(W ** n)], inputs=[n], state={W: np.array([2, 3, 4])}, updates={W: W + 1})
    with pytest.raises(ct.BackendError, match="power"):
        program(n=np.array([1, -1, 2]))
    np.testing.assert_array_equal(program.state["W"], [2, 3, 4])
    assert program(n=np.array([1, 1, 1]))[0] == 9


def test_a_power_that_cannot_fail_keeps_updates_in_place():
    k, W = ct.var("k", (3,), "uint8"), ct.var("W", (3,), "int64")
    # an unsigned exponent or one non-negative constant cannot fail; any other integer exponent might
    for exponent, in_place in ((k, True), (ct.const(np.array(3)), True), (ct.const(np.array([0, 2, 3])), False),
                               (ct.var("n", (3,), "int64"), False)):
        inputs = [exponent] if exponent.op.name == "var" else []
        program = ct.compile([], inputs=inputs, state={W: np.array([2, 3, 4])}, updates={W: W ** exponent + W})
        assert ("computed in place" in program.explain()) is in_place, program.explain()


# -- the call and its errors ------------------------------------------------------------------


def test_one_term_gives_one_array_and_feeds_come_as_keywords_or_a_mapping():
    x = ct.var("x", (2,))
    program = ct.compile(x * 2, inputs=[x])
    np.testing.assert_array_equal(program(x=[1, 2]), [2, 4])
    np.testing.assert_array_equal(program({"x": np.array([1, 2], np.float32)}), [2, 4])
    np.testing.assert_array_equal(program({x: np.array([3, 4], np.float32)}), [6, 8])
    with pytest.raises(ct.FeedError, match="not both"):
        program({"x": [1, 2]}, x=[1, 2])


def test_compile_refuses_what_it_cannot_run():
    x, W, b = ct.var("x", (2, 3)), ct.var("W", (3, 3)), ct.var("b", (3,))
    with pytest.raises(ct.FeedError, match="'W'.*neither an input nor state"):
        ct.compile([x @ W], inputs=[x])
    with pytest.raises(ct.FeedError, match="needs 'b' in state"):
        ct.compile([x @ W], inputs=[x], state={W: np.eye(3, dtype=np.float32)}, updates={b: b})
    with pytest.raises(ct.ShapeError, match="update of 'W' has shape"):
        ct.compile([x @ W], inputs=[x], state={W: np.eye(3, dtype=np.float32)}, updates={W: ct.sum(W)})
    with pytest.raises(ct.DTypeError, match="ct.cast"):
        ct.compile([x @ W], inputs=[x], state={W: np.eye(3, dtype=np.float32)}, updates={W: ct.cast(W, "float64")})
    with pytest.raises(ct.FeedError, match="both an input and state"):
        ct.compile([x @ W], inputs=[x, W], state={W: np.eye(3, dtype=np.float32)})
    with pytest.raises(ct.FeedError, match="must be variables"):
        ct.compile([x @ W], inputs=[x @ W])
    with pytest.raises(ct.ShapeError, match="shape"):
        ct.compile([x @ W], inputs=[x], state={W: np.eye(2, dtype=np.float32)})
    with pytest.raises(ct.BackendError, match="no backend 'torch'"):
        ct.compile([x @ W], inputs=[x, W], backend="torch")
    with pytest.raises(ct.FeedError, match=r"state must be a dict mapping each variable to its initial value"):
        ct.compile([x @ W], inputs=[x], state=[W])
    with pytest.raises(ct.FeedError, match=r"updates must be a dict mapping each state variable"):
        ct.compile([x @ W], inputs=[x], state={W: np.eye(3, dtype=np.float32)}, updates=[W])


def test_one_input_may_be_given_alone():
    x = ct.var("x", (2, 3))
    (doubled,) = ct.compile([x * 2], inputs=x)(x=np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(doubled, 2)


def test_values_too_large_to_hold_are_plan_errors():
    huge = ct.var("huge", (10**10, 10**10))
    with pytest.raises(ct.PlanError, match="more than any array can hold"):
        ct.compile([ct.exp(huge)], inputs=[huge])
    large = ct.var("large", (10**9, 10**9))  # 4 EB: past any address space, even with memory overcommitted
    with pytest.raises(ct.PlanError, match="needs an arena of 4000000000000000000 bytes"):
        ct.compile([ct.exp(large)], inputs=[large])


def test_explain_lists_rules_kernels_and_the_plan():
    x, b = ct.var("x", (4, 3)), ct.var("b", (3,))
    program = ct.compile([ct.log(1 + ct.exp(x + b))], inputs=[x, b])
    text = program.explain()
    assert "stability: " in text and "softplus" in text
    assert "fusion: 1 rewrite: fuse-elementwise x1" in text
    assert "primitives: 1 rewrite: spell-out-softplus x1" in text  # the composite, in primitives for the kernel
    assert ("fused(x, b) {add(maximum(add(in0, in1), 0.0), log1p(exp(where(greater_equal(add(in0, in1), 0.0), "
            "negative(add(in0, in1)), add(in0, in1)))))}") in text
    assert "lower bound" in text and "one buffer per value" in text
    assert repr(program).startswith("<Program (x: float32[4,3], b: float32[3]) -> 1 outputs")


def test_explain_names_each_kernels_operands_by_the_kernels_that_make_them():
    """An unfused kernel's operands printed as ``...`` (``matmul(..., ...)``): the data flow could not be read."""
    x, w, b = ct.var("x", (8, 4)), ct.var("w", (4, 5)), ct.var("b", (5,))
    h = ct.tanh(x @ w + b)
    text = ct.compile([ct.sum(h @ ct.transpose(w))], inputs=[x], state={w: np.ones((4, 5), np.float32),
                                                                        b: np.ones(5, np.float32)}).explain()
    lines = [line.split("  -> ")[0].split(None, 1) for line in text.splitlines() if line.startswith("  k")]
    labels = {label: i for i, (label, _) in enumerate(lines)}
    assert "..." not in text.split("kernels")[1].split("memory:")[0]
    for label, what in lines:  # every operand a kernel reads is named by an earlier kernel, or is a variable
        for name in re.findall(r"\b(k\d+)\.", what):
            assert labels[name] < labels[label], (label, what)


def test_a_long_regions_body_is_written_as_steps_each_value_once():
    """A gelu region of several outputs printed 2000 characters of nested calls, repeating shared subterms and
    cutting them to ``...``: written as steps, each value once, nothing cut."""
    x = ct.var("x", (8, 16))
    g = ct.gelu(x)
    text = ct.compile([g, ct.grad(ct.sum(g * g), [x])[0]], inputs=[x]).explain()
    (line,) = [line for line in text.splitlines() if line.startswith("  k") and "%0 = " in line]
    body = line[line.index("{"):line.index("}")]
    assert "..." not in body and "-> %" in body
    steps = re.findall(r"%(\d+) = ", body)
    assert steps == [str(i) for i in range(len(steps))] and len(steps) > 8


def test_explain_says_which_guarded_rewrites_it_kept_and_what_fast_math_would_do():
    x, w = ct.var("x", (4,)), ct.var("w", (4,))
    text = ct.compile([x - x + w * 0, w + 0.0], inputs=[x, w]).explain()
    assert ("self-difference at subtract(x, x): kept: a float may be infinite or NaN there, where the rewrite changes "
            "the value; fast_math=True makes it") in text
    assert "multiply-zero at multiply(0.0, w): kept" in text and "multiply-zero-right" not in text  # rewritten after
    assert "add-zero at add(0.0, w): kept: it would change the sign of a zero result" in text
    assert "kept" not in ct.compile([x - x], inputs=[x], fast_math=True).explain()


def test_the_memory_plan_draws(tmp_path):
    pytest.importorskip("matplotlib")
    step = _training_step(64)[0]
    path = step.memory.plot(tmp_path / "plan.png")
    assert path.stat().st_size > 1000


# -- regressions found in review ----------------------------------------------------------------


def test_an_operand_read_through_a_transpose_is_never_written_over():
    x = ct.var("x", (3, 3), "float64")
    value = np.arange(9.0).reshape(3, 3)
    for out in [x + (x + ct.transpose(x)), ct.exp(x) + ct.transpose(x)]:
        program = ct.compile(out, inputs=[x], debug=True)
        np.testing.assert_array_equal(program(x=value), ct.evaluate(out, {"x": value}))
    W = ct.var("W", (3, 3), "float64")
    program = ct.compile([], state={W: value}, updates={W: W + (W + ct.transpose(W))})
    program()
    np.testing.assert_array_equal(program.state["W"], value + value + value.T)


def test_no_copy_of_an_operand_that_overlaps_the_output():
    n = 512
    x, v = ct.var("x", (n, n), "float64"), ct.var("v", (n,), "float64")
    program = ct.compile(ct.matmul(x + ct.transpose(x), v), inputs=[x, v])
    feeds = {"x": np.ones((n, n)), "v": np.ones(n)}
    program(**feeds)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        program(**feeds)
        assert tracemalloc.get_traced_memory()[1] - before < 16 * 1024 + n * 8
    finally:
        tracemalloc.stop()


def test_two_variables_updated_by_one_term_both_take_it():
    W, m = ct.var("W", (3,), "float64"), ct.var("m", (3,), "float64")
    new = W + 1.0
    program = ct.compile([], state={W: np.zeros(3), m: np.zeros(3)}, updates={W: new, m: new})
    program()
    np.testing.assert_array_equal(program.state["W"], 1)
    np.testing.assert_array_equal(program.state["m"], 1)


def test_feeding_a_view_of_the_state_gives_its_value_before_the_call():
    W, x = ct.var("W", (3,), "float64"), ct.var("x", (3,), "float64")
    out = ct.sum(W + 1.0) + x
    program = ct.compile(out, inputs=[x], state={W: np.zeros(3)}, updates={W: W + 1.0})
    np.testing.assert_array_equal(program(x=program.state["W"]), [3, 3, 3])


def test_one_large_region_compiles_in_linear_time():
    import time

    def seconds(n):
        y0 = y = ct.var("y0", (4,))
        xs = [ct.var(f"x{i}", (4,)) for i in range(n)]
        for x in xs:
            y = y + x
        start = time.perf_counter()
        ct.compile(y, inputs=[y0, *xs])
        return time.perf_counter() - start

    seconds(100)
    assert seconds(2000) < 40 * seconds(200) + 0.5  # quadratic would be 100 times


def test_a_cpu_profile_times_every_kernel_and_steps_as_a_call_does():
    """On the CPU each kernel's calls are timed one by one (a step makes consecutive C calls as one): every kernel
    that runs has its line, the step's state moves on as a call moves it, and a failing value fails as in a call."""
    x, w, count = ct.var("x", (64, 32)), ct.var("w", (32, 16)), ct.var("count", ())
    h = ct.relu(x @ w)
    loss = ct.sum(ct.gelu(h) * h)
    step = ct.compile([loss], inputs=[x], state={w: np.ones((32, 16), np.float32), count: np.float32(0)},
                      updates={w: w - 0.01 * ct.grad(loss, w), count: count + 1.0})
    twin = ct.compile([loss], inputs=[x], state={w: np.ones((32, 16), np.float32), count: np.float32(0)},
                      updates={w: w - 0.01 * ct.grad(loss, w), count: count + 1.0})
    feed = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    table = step.profile(x=feed)
    lines = table.splitlines()
    assert lines[0].startswith(f"{len(lines) - 1} kernels, ") and "ms in all" in lines[0]
    # explain, the program's repr and the profile count the same kernels: those that do work, not the views
    assert step.kernels_run == len(lines) - 1 < len(step.kernels)
    assert f"kernels ({len(step.kernels)} in order; {step.kernels_run} do work each step" in step.explain()
    assert f"; {step.kernels_run} kernels run on numpy;" in repr(step)
    assert any(".load x (64, 32)" in line for line in lines[1:])  # a load named as explain names it
    text = step.explain(examples=1)
    assert "... and " in text and " more (explain(examples=n) shows n of each stage)" in text
    labels = [line.split("%", 1)[1].strip() for line in lines[1:]]
    assert any(label.startswith("k") and ".matmul (64, 16)" in label for label in labels)
    assert any(".fused " in label for label in labels)
    twin(x=feed)
    assert step.state["count"] == 1.0
    np.testing.assert_array_equal(step.state["w"], twin.state["w"])  # the same step as a call
    i = ct.var("i", (2,), "int32")
    gathered = ct.compile(ct.take(x, i, axis=0), inputs=[x, i])
    with pytest.raises(ct.IndexRangeError):
        gathered.profile(x=feed, i=np.array([0, 64], np.int32))


def test_a_call_failing_on_an_index_leaves_the_state_as_it_was():
    """A training step whose label is outside its classes fails in the loss's gather (``IndexRangeError`` on the
    CPU) after the batch norm's count and the optimizer's step were computed: no update may be written in place
    before the last kernel that can fail, so the state is the one before the call."""
    model = nn.Sequential(nn.BatchNorm(8), nn.Dropout(0.2), nn.Linear(8, 3))
    x, y = ct.var("x", (4, 8)), ct.var("y", (4,), "int64")
    loss = nn.cross_entropy(model(x), y)
    params = model.parameters()
    state, updates = optim.AdamW(lr=1e-2).updates(params, ct.grad(loss, params))
    step = ct.compile([loss], inputs=[x, y], state={**model.initial_values(0), **state},
                      updates={**updates, **model.state_updates(loss)})
    feed = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    step(feed, np.array([0, 1, 2, 0]))
    before = {name: np.array(value) for name, value in step.state.items()}
    with pytest.raises(ct.IndexRangeError, match="index 7 is out of range"):
        step(feed, np.array([0, 1, 2, 7]))
    assert all(np.array_equal(value, step.state[name]) for name, value in before.items())
    assert step._sinks  # the updates made after the gather still written in place
