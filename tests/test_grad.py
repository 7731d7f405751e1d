"""Gradients: right (against finite differences and hand-derived formulas), clean, and of any order."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import cortado as ct
from cortado.exprgraph.ops import OPS
from cortado.gradcheck import check_grads, gradient_check
from cortado.rules import Derivative, Trace, derivatives
from cortado.testing import graphs

seeds = st.integers(0, 2**32 - 1)
CONTRACTIONS = ["matmul", "einsum", "transpose", "reshape", "broadcast_to", "sum", "add", "multiply", "tanh"]
REDUCTIONS = ["sum", "mean", "max", "logsumexp", "softmax", "log_softmax", "exp", "multiply", "broadcast_to"]
PIECEWISE = ["relu", "abs", "maximum", "minimum", "where", "greater", "sign", "max", "multiply", "add"]


def uniform_feeds(graph, seed):
    """Values spread over each variable's bounds: ties and kinks have probability zero."""
    rng = np.random.default_rng(seed)
    return {v.name: rng.uniform(*graph.bounds[v.name], v.shape) for v in graph.inputs}


def agrees(graph, seed, order):
    check = gradient_check(graph.outputs, graph.inputs, uniform_feeds(graph, seed), order=order, seed=seed)
    assume(check.smooth)  # a kink within the step: finite differences tell nothing there
    assert check.close(1e-6, 1e-12), (check, check.error)


@pytest.mark.parametrize("ops", [None, CONTRACTIONS, REDUCTIONS, PIECEWISE],
                         ids=["all", "contractions", "reductions", "piecewise"])
@given(data=st.data(), seed=seeds, order=st.sampled_from([1, 2]))
def test_gradients_agree_with_central_differences_in_float64(ops, data, seed, order):
    graph = data.draw(graphs(ops=ops, dtypes=("float64",), max_steps=10))
    agrees(graph, seed, order)


# -- the contractions, case by case ----------------------------------------------------------

MATMUL_SHAPES = [((4,), (4,)), ((4,), (4, 3)), ((2, 4), (4,)), ((2, 4), (4, 3)), ((5, 2, 4), (4, 3)),
                 ((5, 2, 4), (5, 4, 3)), ((2, 1, 2, 4), (5, 4, 3)), ((4,), (5, 4, 3)), ((5, 2, 4), (4,)),
                 ((2, 4), (5, 4, 3))]


@pytest.mark.parametrize("left, right", MATMUL_SHAPES)
@pytest.mark.parametrize("order", [1, 2])
def test_matmul_gradients_in_every_rank_and_batch_case(left, right, order):
    a, b = ct.var("a", left, "float64"), ct.var("b", right, "float64")
    rng = np.random.default_rng(0)
    check_grads(ct.tanh(a @ b), [a, b], {"a": rng.standard_normal(left), "b": rng.standard_normal(right)}, order=order)


EINSUMS = [("ij,jk->ik", [(2, 3), (3, 4)]), ("ii->i", [(3, 3)]), ("ii", [(3, 3)]), ("iij->j", [(2, 2, 3)]),
           ("ij->", [(2, 3)]), ("ij->j", [(2, 3)]), ("ij,j->i", [(2, 3), (1,)]), ("ij,ij->ij", [(1, 3), (2, 3)]),
           ("...ij,...jk->...ik", [(5, 2, 3), (3, 4)]), ("a...,...->...", [(2, 3, 4), (1, 4)]),
           ("i,j->ij", [(2,), (3,)]), ("bij,bjk,k->bi", [(2, 3, 4), (2, 4, 5), (5,)]), ("ij->ji", [(2, 3)])]


@pytest.mark.parametrize("subscripts, shapes", EINSUMS)
def test_einsum_gradients_with_diagonals_broadcasts_and_ellipses(subscripts, shapes):
    operands = [ct.var(f"x{i}", s, "float64") for i, s in enumerate(shapes)]
    rng = np.random.default_rng(1)
    feeds = {v.name: rng.standard_normal(v.shape) for v in operands}
    for order in (1, 2):
        check_grads(ct.tanh(ct.einsum(subscripts, *operands)), operands, feeds, order=order)


@pytest.mark.parametrize("build", [
    lambda x: ct.transpose(ct.reshape(x, (3, 2, 2)), (2, 0, 1)),
    lambda x: ct.broadcast_to(ct.reshape(x, (3, 1, 4)), (2, 3, 5, 4)),
    lambda x: ct.cast(ct.cast(x, "float32") * 2, "float64"),
    lambda x: ct.where(x > 0, x * x, -x) + ct.where(ct.sum(x, axis=0, keepdims=True) > 0, 1.0, x),
    lambda x: ct.softmax(x, axis=(0, 1)) + ct.log_softmax(x, axis=0) + ct.logsumexp(x, axis=1, keepdims=True),
    lambda x: ct.max(ct.broadcast_to(x, (2, 3, 4)), axis=(0, 2)) + ct.mean(x, axis=1),
    lambda x: ct.power(x * x + 1, 1.5) + ct.power(2.0, x) + ct.power(x * x + 1, x),
    lambda x: ct.sqrt(x * x + 1) + ct.log1p(x * x) + ct.expm1(x) + ct.sigmoid(x) + ct.softplus(x) / (x * x + 2),
    lambda x: ct.gelu(3 * x) * ct.gelu_grad(x),
], ids=["transpose-reshape", "broadcast", "cast", "where", "softmaxes", "max-of-broadcast", "powers", "unary", "gelu"])
@pytest.mark.parametrize("order", [1, 2])
def test_gradients_of_each_kind_of_op(build, order):
    x = ct.var("x", (3, 4), "float64")
    check_grads(build(x), [x], {"x": np.random.default_rng(2).standard_normal((3, 4))}, order=order)


def test_gradients_of_a_float32_model_are_float32_and_agree_in_float64():
    x, W = ct.var("x", (5, 4)), ct.var("W", (4, 3), "float16")
    loss = ct.sum(ct.tanh(x @ ct.cast(W, "float32")))
    (gW,) = ct.grad(loss, [W])
    assert (gW.shape, gW.dtype) == ((4, 3), np.float16)
    rng = np.random.default_rng(3)
    check_grads(loss, [W], {"x": rng.standard_normal((5, 4)).astype(np.float32),
                            "W": rng.standard_normal((4, 3)).astype(np.float16)}, rtol=1e-6)


# -- subgradients: what the docs promise -----------------------------------------------------


def evaluate_reading(terms, feeds):
    """``ct.evaluate`` fed only the variables ``terms`` read (a gradient may read fewer)."""
    read = {v.name for v in ct.Graph(terms).variables}
    return ct.evaluate(terms, {k: v for k, v in feeds.items() if k in read})


def _value(expression, wrt, feeds):
    return evaluate_reading(ct.grad(ct.sum(expression), wrt), feeds)


def test_the_documented_subgradients():
    x, z = ct.var("x", (3,), "float64"), ct.var("z", (3,), "float64")
    at = {"x": np.array([-1.0, 0.0, 2.0])}
    np.testing.assert_array_equal(_value(ct.relu(x), x, at), [0, 0, 1])
    np.testing.assert_array_equal(_value(ct.abs(x), x, at), [-1, 0, 1])
    np.testing.assert_array_equal(_value(ct.sign(x), x, at), [0, 0, 0])
    ties = {"x": np.array([1.0, 2.0, 3.0]), "z": np.array([1.0, 5.0, 0.0])}
    np.testing.assert_array_equal(_value(ct.maximum(x, z), x, ties), [0.5, 0, 1])
    np.testing.assert_array_equal(_value(ct.minimum(x, z), z, ties), [0.5, 0, 1])
    np.testing.assert_array_equal(_value(ct.maximum(x, x), x, ties), [1, 1, 1])
    np.testing.assert_array_equal(_value(ct.max(x), x, {"x": np.array([3.0, 1.0, 3.0])}), [0.5, 0, 0.5])
    np.testing.assert_array_equal(_value(x ** z, z, {"x": np.zeros(3), "z": np.ones(3)}), [0, 0, 0])


# -- known models, against formulas derived by hand ------------------------------------------


def test_mlp_with_softmax_cross_entropy_matches_the_hand_derived_gradients():
    rng = np.random.default_rng(4)
    B, D, H, C = 8, 5, 6, 3
    x, y = ct.var("x", (B, D), "float64"), ct.var("y", (B, C), "float64")
    W1, b1, W2, b2 = (ct.var(n, s, "float64") for n, s in [("W1", (D, H)), ("b1", (H,)), ("W2", (H, C)), ("b2", (C,))])
    h = ct.relu(x @ W1 + b1)
    logits = h @ W2 + b2
    loss = ct.mean(ct.logsumexp(logits, axis=1) - ct.sum(logits * y, axis=1))
    v = {"x": rng.standard_normal((B, D)), "y": np.eye(C)[rng.integers(0, C, B)], "W1": rng.standard_normal((D, H)),
         "b1": rng.standard_normal(H), "W2": rng.standard_normal((H, C)), "b2": rng.standard_normal(C)}
    pre = v["x"] @ v["W1"] + v["b1"]
    hv = np.maximum(pre, 0)
    z = hv @ v["W2"] + v["b2"]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = (p - v["y"]) / B
    dh = dz @ v["W2"].T * (pre > 0)
    expected = [v["x"].T @ dh, dh.sum(0), hv.T @ dz, dz.sum(0)]
    for got, want in zip(ct.evaluate(ct.grad(loss, [W1, b1, W2, b2]), v), expected):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_two_layer_tanh_net_with_squared_error_matches_the_hand_derived_gradients():
    rng = np.random.default_rng(5)
    x, t = ct.var("x", (7, 3), "float64"), ct.var("t", (7, 2), "float64")
    W1, W2 = ct.var("W1", (3, 4), "float64"), ct.var("W2", (4, 2), "float64")
    h = ct.tanh(x @ W1)
    loss = 0.5 * ct.sum((ct.tanh(h @ W2) - t) ** 2)
    v = {"x": rng.standard_normal((7, 3)), "t": rng.standard_normal((7, 2)),
         "W1": rng.standard_normal((3, 4)), "W2": rng.standard_normal((4, 2))}
    hv = np.tanh(v["x"] @ v["W1"])
    out = np.tanh(hv @ v["W2"])
    d2 = (out - v["t"]) * (1 - out ** 2)
    d1 = d2 @ v["W2"].T * (1 - hv ** 2)
    got = ct.evaluate(ct.grad(loss, [W1, W2]), v)
    np.testing.assert_allclose(got[0], v["x"].T @ d1, rtol=1e-12)
    np.testing.assert_allclose(got[1], hv.T @ d2, rtol=1e-12)


# -- clean gradient graphs -------------------------------------------------------------------


def mlp_loss(batch=32, features=64, hidden=32, classes=10):
    """Softmax cross-entropy of a two-layer tanh MLP: ``(loss, [x, y, W1, b1, W2, b2])``."""
    x, y = ct.var("x", (batch, features)), ct.var("y", (batch, classes))
    W1, b1 = ct.var("W1", (features, hidden)), ct.var("b1", (hidden,))
    W2, b2 = ct.var("W2", (hidden, classes)), ct.var("b2", (classes,))
    logits = ct.tanh(x @ W1 + b1) @ W2 + b2
    return ct.mean(ct.logsumexp(logits, axis=1) - ct.sum(logits * y, axis=1)), [x, y, W1, b1, W2, b2]


def _ops(terms):
    return [t.op.name for t in ct.Graph(terms).schedule if t.op.kind != "leaf"]


def test_simple_gradients_are_what_one_would_write():
    x, W = ct.var("x", (3, 4)), ct.var("W", (3, 4))
    assert ct.grad(ct.sum(x * W), W) is x
    assert ct.grad(ct.sum(x * x), x) is 2 * x
    assert ct.grad(ct.sum(x), x) is ct.const(np.ones((3, 4), np.float32))
    b = ct.var("b", (4,))
    assert ct.grad(ct.sum(x + b), b) is ct.const(np.full(4, 3, np.float32))


def test_mlp_gradient_has_exactly_the_work_backpropagation_needs():
    loss, (x, y, W1, b1, W2, b2) = mlp_loss()
    grads = ct.grad(loss, [W1, b1, W2, b2])
    both = _ops([loss, *grads])
    assert both.count("matmul") == 2 + 3  # forward: two; backward: dW2, dh, dW1 (no dx: nobody asked)
    assert both.count("tanh") == 1 and both.count("softmax") == 1  # the gradient reuses the model's terms
    assert "broadcast_to" not in both and "reshape" not in both  # folded or never built
    (only_W2,) = ct.grad(loss, [W2])
    assert _ops([loss, only_W2]).count("matmul") == 3  # nothing flows past what W2 needs
    for term in ct.Graph(grads).schedule:
        if term.op.name == "multiply":
            assert not any(a.op.name == "const" and a.attrs[0].scalar == 1 for a in term.args), term


def test_gradients_share_the_model_as_written_even_where_it_simplifies():
    x, W = ct.var("x", (8, 4)), ct.var("W", (4, 3))
    loss = ct.sum(ct.tanh(2.0 * (3.0 * (x @ W)) * 1.0))
    both = _ops([loss, ct.grad(loss, W)])
    assert both.count("tanh") == 1 and both.count("matmul") == 2


def test_gradient_graphs_hold_no_duplicated_subterms():
    loss, variables = mlp_loss()
    grads = ct.grad(loss, variables[2:])
    seen = set()
    commutative = {"add", "multiply", "maximum", "minimum"}
    for t in ct.Graph(grads).schedule:
        key = (t.op.name, frozenset(t.args) if t.op.name in commutative else t.args, t.attrs)
        assert key not in seen, f"{t!r} is computed twice"
        seen.add(key)


def test_unrelated_variables_get_zeros_of_their_shape_and_dtype():
    x, u, k = ct.var("x", (3,)), ct.var("u", (2, 5), "float64"), ct.var("k", (4,), "float16")
    gu, gk = ct.grad(ct.sum(ct.exp(x)), [u, k])
    assert (gu.shape, gu.dtype, gk.shape, gk.dtype) == ((2, 5), np.float64, (4,), np.float16)
    assert gu.op.name == "const" and gu.attrs[0].scalar == 0
    assert ct.grad(ct.sum(ct.exp(x)) + ct.sum(ct.cast(ct.greater(u, 0), "float32")), u) is gu  # no path through bools


def test_gradients_flow_only_through_floating_values():
    x = ct.var("x", (3,), "float64")
    n = ct.cast(x * 10, "int32")
    assert ct.grad(ct.sum(ct.cast(n, "float64") + x), x).attrs[0].scalar == 1


# -- higher order ----------------------------------------------------------------------------


def test_grad_of_grad_and_hessian_vector_products():
    x, v = ct.var("x", (3,), "float64"), ct.var("v", (3,), "float64")
    assert ct.grad(ct.sum(ct.grad(ct.sum(x ** 3), x)), x) is 6.0 * x
    A = ct.var("A", (3, 3), "float64")
    quadratic = 0.5 * ct.sum(x * (A @ x))
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal(3), "v": rng.standard_normal(3), "A": rng.standard_normal((3, 3))}
    Hv = evaluate_reading(ct.hvp(quadratic, x, v), feeds)
    np.testing.assert_allclose(Hv, 0.5 * (feeds["A"] + feeds["A"].T) @ feeds["v"], rtol=1e-12)
    hx, hA = ct.hvp(quadratic, [x, A], [v, ct.const(np.eye(3))])
    assert (hx.shape, hA.shape) == ((3,), (3, 3))


def test_third_derivatives():
    x = ct.var("x", (), "float64")
    g = ct.tanh(x)
    for _ in range(3):
        g = ct.grad(g, x)
    t = np.tanh(0.3)
    np.testing.assert_allclose(ct.evaluate(g, {"x": np.float64(0.3)}), -2 * (1 - t * t) * (1 - 3 * t * t), rtol=1e-12)


# -- errors ----------------------------------------------------------------------------------


def test_errors_say_what_is_wrong():
    x, n = ct.var("x", (3,)), ct.var("n", (3,), "int32")
    with pytest.raises(ct.ShapeError, match=r"grad needs a scalar output.*shape \(3,\).*ct.vjp"):
        ct.grad(ct.exp(x), x)
    with pytest.raises(ct.GradError, match=r"wrt\[0\] is <exp\(x\).*not a variable"):
        ct.grad(ct.sum(x), [ct.exp(x)])
    with pytest.raises(ct.GradError, match="must be a variable or a list of variables, not float"):
        ct.grad(ct.sum(x), 3.0)
    with pytest.raises(ct.DTypeError, match="wrt is <n : int32.*only floating variables"):
        ct.grad(ct.sum(x), n)
    with pytest.raises(ct.DTypeError, match="dtype int64 is not floating"):
        ct.grad(ct.sum(n), x)
    with pytest.raises(ct.GradError, match="as many cotangents"):
        ct.vjp([x, x], [x], [np.ones(3)])
    with pytest.raises(ct.GradError, match=r"has shape \(2,\)"):
        ct.vjp(x, x, np.ones(2))
    with pytest.raises(ct.GradError, match=r"must be a float32\[3\], not a float64\[3\]"):
        ct.vjp(x, x, ct.var("c", (3,), "float64"))
    with pytest.raises(ct.GradError, match="must hold real numbers, not complex"):
        ct.vjp(x, x, 1j)
    with pytest.raises(ct.GradError, match="not values NumPy holds only as Python objects"):
        ct.vjp(x, x, 10 ** 400)
    with pytest.raises(ct.GradError, match="too large for float16"):
        h = ct.var("h", (2,), "float16")
        ct.vjp(h, h, 1e6)
    with pytest.raises(ct.GradError, match="must be a list or tuple, not a dict of 1"):
        ct.vjp([x], [x], {0: 1})
    with pytest.raises(ct.GradError, match="must be a list or tuple, not a set of 1"):
        ct.grad(ct.sum(x), {x})
    assert list(ct.grad(ct.sum(x * x), {"x": x})) == ["x"]  # a dict of variables gives a dict
    with pytest.raises(ct.GradError, match="one vector per variable"):
        ct.hvp(ct.sum(x * x), [x], np.ones(3))
    with pytest.raises(ct.GradError, match="rules must be a set of derivative rules"):
        ct.grad(ct.sum(x), x, rules=[derivatives["exp"]])
    with pytest.raises(ct.GradError, match="one scalar output"):
        ct.grad([ct.sum(x)], x)
    assert isinstance(ct.GradError("m"), ct.CortadoError)


def test_vjp_takes_numbers_arrays_and_terms_as_cotangents():
    x = ct.var("x", (3,), "float64")
    c = ct.var("c", (3,), "float64")
    assert ct.vjp(ct.exp(x), x, c) is c * ct.exp(x)
    assert ct.vjp(2 * x, x, 1) is ct.const(np.full(3, 2.0))
    np.testing.assert_array_equal(ct.evaluate(ct.vjp([x, 3 * x], [x], [np.arange(3.0), 1.0])[0], {}), [3, 4, 5])


# -- the rules themselves --------------------------------------------------------------------


def test_every_op_has_a_derivative_rule_or_a_formula_to_differentiate():
    """A composite without a rule of its own (silu) is differentiated through its formula in primitives."""
    differentiable = [name for name, op in OPS.items() if op.kind not in ("leaf", "fused", "lowered")]
    missing = [name for name in differentiable if name not in {r.op for r in derivatives} and OPS[name].formula is None]
    assert not missing


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_softmaxs_gradient_is_computed_in_float32_and_rounded_once(dtype):
    """As PyTorch's kernels compute it: ``y (dy - sum(dy y))`` cancels, and rounded op by op a float16 gradient was 3
    times further from the exact one than PyTorch's."""
    x, w = ct.var("x", (8, 50), dtype), ct.var("w", (8, 50), dtype)
    rng = np.random.default_rng(1)
    feeds = {"x": (rng.standard_normal((8, 50)) * 4).astype(x.dtype), "w": rng.standard_normal((8, 50)).astype(x.dtype)}
    for op, formula in ((ct.softmax, lambda y, dy: y * (dy - (dy * y).sum(1, keepdims=True))),
                        (ct.log_softmax, lambda y, dy: dy - np.exp(y) * dy.sum(1, keepdims=True))):
        y = op(x, axis=1)
        (gradient,) = ct.grad(ct.sum(ct.cast(y * w, "float32")), [x])
        forward, got = ct.evaluate([y, gradient], feeds)
        expected = formula(forward.astype(np.float32), feeds["w"].astype(np.float32)).astype(x.dtype)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_means_gradient_is_its_adjoint_over_the_count_rounded_once(dtype):
    """``dy * (1 / n)`` in float16 took ``1 / n`` as a float16 subnormal: over 5 million values the gradient was 11%
    small, and 0 past 3.4e7."""
    n = 5_000_000
    x = ct.var("x", (n,), dtype)
    (gradient,) = ct.grad(ct.mean(x) * 1000.0, [x])
    got = ct.evaluate(gradient, {})
    assert got.dtype == x.dtype and (got == np.float32(1000.0 / n).astype(x.dtype)).all()


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_the_gradient_of_a_power_at_the_smallest_integer_exponent_is_the_derivative(dtype):
    """``z - 1`` in the exponent's own dtype wrapped at its minimum: int8's -128 - 1 is 127."""
    x, z = ct.var("x", (2,), "float64"), ct.var("z", (2,), dtype)
    (gradient,) = ct.grad(ct.sum(x ** z), [x])
    xv, zv = np.array([1.0001, 0.5]), np.array([np.iinfo(dtype).min, 3], dtype)
    expected = zv * xv ** (zv.astype(np.float64) - 1)
    np.testing.assert_allclose(ct.evaluate(gradient, {"x": xv, "z": zv}), expected, rtol=1e-12)


def test_the_gradient_of_a_bfloat16_power_at_int8s_smallest_exponent_is_the_derivative():
    x, z = ct.var("x", (2,), "bfloat16"), ct.var("z", (2,), "int8")
    (gradient,) = ct.grad(ct.sum(x ** z), [x])
    xv, zv = np.array([1.5, 1.0], np.float32).astype(x.dtype), np.array([-128, 3], np.int8)
    got = ct.evaluate(gradient, {"x": xv, "z": zv}).astype(np.float64)
    exact = zv * xv.astype(np.float64) ** (zv.astype(np.float64) - 1)
    np.testing.assert_allclose(got, exact, rtol=2e-2)  # (it was -2.97e+24 for -2.46e-21)


def test_a_gradient_keeps_its_stop_gradients_so_that_its_own_gradient_is_right():
    """Gradients were simplified with ``stop_gradient(x) -> x``: the gradient of ``sum(stop_gradient(x) * x)`` became
    ``x``, so its Hessian was 1 where it is 0 (JAX's answer), and a VJP written with ``stop_gradient`` lost it."""
    x = ct.var("x", (3,), "float64")
    f = ct.sum(ct.stop_gradient(x) * x)
    (gradient,) = ct.grad(f, [x])
    assert gradient.op.name == "stop_gradient"
    np.testing.assert_array_equal(ct.evaluate(ct.grad(ct.sum(gradient), x), {}), 0.0)
    frozen = ct.rules.derivatives + Derivative("tanh-frozen", "tanh(_x)", _x="_dy * (1 - stop_gradient(_y * _y))")
    hessian = ct.hvp(ct.sum(ct.tanh(x)), [x], [np.ones(3)], rules=frozen)
    np.testing.assert_array_equal(ct.evaluate(hessian, {}), 0.0)
    values = np.array([1.0, -2.0, 3.0])
    np.testing.assert_array_equal(ct.compile([gradient], inputs=[x])(values)[0], values)  # a program computes x


def test_check_grads_takes_a_step_small_enough_to_step_over_a_relu_networks_kinks():
    """At its fixed step of 1e-3 a small relu network's check said only that a kink lay within it."""
    rng = np.random.default_rng(0)
    x, w1, w2 = ct.var("x", (64, 20), "float64"), ct.var("w1", (20, 64), "float64"), ct.var("w2", (64, 1), "float64")
    feeds = {"x": rng.standard_normal((64, 20)), "w1": rng.standard_normal((20, 64)) * 0.3,
             "w2": rng.standard_normal((64, 1)) * 0.3}
    loss = ct.mean((ct.relu(x @ w1) @ w2) ** 2)
    with pytest.raises(AssertionError, match="a kink lies within the step, 0.001: a smaller step= may step over none"):
        check_grads(loss, [w1, w2], feeds)
    assert check_grads(loss, [w1, w2], feeds, step=1e-5).error < 1e-8


def test_derivative_rules_refuse_to_be_incomplete():
    with pytest.raises(ct.RewriteError, match=r"gives VJPs for \['_x'\].*inputs \['_x', '_z'\]"):
        Derivative("bad", "_x * _z", _x="_dy * _z")
    with pytest.raises(ct.RewriteError, match="placeholders"):
        Derivative("bad", "exp(log(_x))", _x="_dy")
    with pytest.raises(ct.RewriteError, match="attributes .* must be placeholders"):
        Derivative("bad", "sum(_x, axis=0)", _x="_dy")
    with pytest.raises(ct.RewriteError, match="'foo' is no cortado op"):
        Derivative("bad", "foo(_x)", _x="_dy")
    with pytest.raises(ct.RewriteError, match=r"derivative 'bad': the VJP of _x uses _w, which neither the pattern "
                                              r"tanh\(_x\) binds nor is _y \(the output\) or _dy"):
        Derivative("bad", "tanh(_x)", _x="_dy * _w")  # refused where it is written, not at ct.grad
    assert repr(Derivative("tanh", "tanh(_x)", _x="_dy * (1 - _y * _y)")).endswith("_x=_dy * (1 - (_y * _y)))")


def test_derivative_patterns_that_cannot_match_every_term_of_their_op_are_refused_where_written():
    """Not at ct.grad, where such a pattern said only that it does not match the term."""
    with pytest.raises(ct.RewriteError, match=r"derivative 'bad': its pattern flip\(_x, axes=_a\) cannot match every "
                                              r"term of flip: flip takes no axes= \(its keywords: axis=\)"):
        Derivative("bad", "flip(_x, axes=_a)", _x="flip(_dy, axis=_a)")
    with pytest.raises(ct.RewriteError, match=r"it leaves out keepdims= \(a derivative's pattern binds every keyword "
                                              r"of its op; sum's: axis=, keepdims=\)"):
        Derivative("bad", "sum(_x, axis=_a)", _x="_dy")
    with pytest.raises(ct.RewriteError, match="pad takes no width="):
        Derivative("bad", "pad(_x, pad_width=_w, constant_values=_c, width=_n)", _x="_dy")
    with pytest.raises(ct.RewriteError, match=r"the VJP of _x, flip\(_dy, axes=_a\), cannot be built: flip takes no "
                                              r"axes= \(its keywords: axis=\)"):
        Derivative("bad", "flip(_x, axis=_a)", _x="flip(_dy, axes=_a)")


def test_a_wrong_rule_is_caught_by_the_gradient_check_and_rules_can_be_replaced():
    x = ct.var("x", (4,), "float64")
    feeds = {"x": np.linspace(-1, 1, 4)}
    wrong = derivatives + Derivative("tanh", "tanh(_x)", _x="_dy * (1 + _y * _y)")
    assert not gradient_check(ct.tanh(x), [x], feeds, rules=wrong).close(1e-6, 1e-12)
    with pytest.raises(AssertionError, match="disagree with finite differences"):
        check_grads(ct.tanh(x), [x], feeds, rules=wrong)
    straight_through = derivatives + Derivative("sign", "sign(_x)", _x="_dy")
    assert ct.grad(ct.sum(ct.sign(x)), x, rules=straight_through).attrs[0].scalar == 1


def test_a_vjp_of_another_shape_or_no_floating_dtype_is_refused_not_summed():
    """A VJP broadcast past its elementwise term's shape was summed back: the gradient silently doubled. A boolean
    one was cast to the input's dtype."""
    x = ct.var("x", (3,))
    widened = derivatives + Derivative("tanh", "tanh(_x)", _x="broadcast_to(_dy * _y, shape=(2, 3))")
    with pytest.raises(ct.ShapeError, match=r"gave a VJP of shape \(2, 3\) for the input .*: an elementwise op's VJP "
                                            r"has the input's shape, or the term's \(3,\) along the axes"):
        ct.grad(ct.sum(ct.tanh(x)), x, rules=widened)
    boolean = derivatives + Derivative("tanh", "tanh(_x)", _x="_dy * _y > 0")
    with pytest.raises(ct.DTypeError, match="gave a VJP of bool .*; a VJP is floating"):
        ct.grad(ct.sum(ct.tanh(x)), x, rules=boolean)


def test_the_trace_explains_which_derivative_rules_fired():
    x = ct.var("x", (3,))
    trace = Trace()
    ct.grad(ct.sum(ct.exp(x) * 3.0), x, trace=trace)
    counts = trace.counts()
    assert counts["dexp/d_x"] == 1 and counts["dsum/d_x"] == 1 and counts["dmultiply/d_x"] == 1
    assert "dexp/d_x: exp(x)  ->  multiply(" in trace.explain()


def test_check_grads_needs_a_smooth_finite_point():
    x = ct.var("x", (), "float64")
    with pytest.raises(AssertionError, match="not smooth"):
        check_grads(ct.abs(x), [x], {"x": np.float64(1e-5)})
    assert not gradient_check(ct.relu(x), x, {"x": 0.0}).smooth  # the kink at the point itself
    assert not gradient_check(ct.abs(x), x, {"x": -5.588e-05}).smooth  # where central differences agree
    near_tie = ct.var("v", (3,), "float64")
    assert not gradient_check(ct.max(near_tie), near_tie, {"v": np.array([1.07, 1.49308, 1.49371])}).smooth
    with pytest.raises(AssertionError, match="not finite"):
        check_grads(ct.log(x), x, {"x": -1.0})
    with pytest.raises(ct.FeedError, match=r"no feed for the variable\(s\) \['x'\]"):
        check_grads(2 * x, x, {})


def test_check_grads_is_exact_for_mixed_precision_models():
    X = ct.var("X", (3,), "float64")
    at = {"X": np.array([0.3, -0.2, 0.5])}
    assert check_grads(ct.cast(X, "float16") * 3, X, at).error < 1e-10
    assert check_grads(ct.sum(ct.cast(X, "float32") * ct.cast(X, "float16")), X, at, order=2).error < 1e-10


def test_review_regressions():
    """Each of these once gave a wrong value, crashed, or left work a person would not write."""
    h = ct.var("h", (70000,), "float16")
    np.testing.assert_allclose(ct.evaluate(ct.grad(ct.mean(h), h), {})[:2], 1 / 70000, rtol=1e-2)  # subnormal, not 0
    ties = ct.grad(ct.max(ct.broadcast_to(h, (2, 70000))), h)  # 140000 ties split the adjoint
    assert ct.evaluate(ties, {"h": np.zeros(70000, np.float16)})[0] > 0
    a, b = ct.var("a", (2, 3, 0), "float64"), ct.var("b", (0, 5), "float64")
    assert [g.shape for g in ct.grad(ct.sum(a @ b), [a, b])] == [(2, 3, 0), (0, 5)]
    E, B = ct.var("E", (0, 3), "float64"), ct.var("B", (1,), "float64")
    assert ct.grad(ct.einsum("ij->", E), E).shape == (0, 3)
    A = ct.var("A", (2, 0), "float64")
    assert [g.shape for g in ct.grad(ct.einsum("ij,j->", A, B), [A, B])] == [(2, 0), (1,)]
    x, p = ct.var("x", (3,), "float64"), ct.var("p", (3,), "float64")
    np.testing.assert_array_equal(ct.evaluate(ct.grad(ct.sum(x ** p), x), {"x": np.zeros(3), "p": np.zeros(3)}), 0)
    n, z = ct.var("n", (3,), "int8"), ct.var("z", (3,), "float32")
    got = ct.evaluate(ct.grad(ct.sum(n ** z), z), {"n": np.array([2, 3, 0], np.int8), "z": np.ones(3, np.float32)})
    np.testing.assert_allclose(got, [2 * np.log(2), 3 * np.log(3), 0], rtol=1e-6)  # log taken in float32
    v, s, m = ct.var("v", (4,)), ct.var("s", ()), ct.var("m", (3, 4))
    assert ct.grad(v @ v, v) is 2.0 * v
    assert ct.grad(ct.sum(m * s), m) is ct.broadcast_to(s, (3, 4))
    assert ct.grad(ct.sum(x ** 2), x) is 2.0 * x
