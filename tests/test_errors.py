"""Every construction and feed error: the right class, the op, the operand types, the user's line."""

import os
import re

import numpy as np
import pytest

import cortado as ct

HERE = os.path.basename(__file__)


def check_error(kind, build, *fragments, located=False):
    """``build()`` raises ``kind`` whose message holds ``fragments`` (and, if ``located``, names
    the line of this file that built the rejected term)."""
    with pytest.raises(kind) as info:
        build()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    if located:
        lines = [entry.lineno + 1 for entry in info.traceback if os.path.basename(str(entry.path)) == HERE]
        assert re.search(rf"built at .*{re.escape(HERE)}:(\d+)", message), message
        assert int(re.search(rf"{re.escape(HERE)}:(\d+)", message).group(1)) in lines
    return message


x = ct.var("x", (4, 6))
W = ct.var("W", (6, 3))
i8 = ct.var("i8", (3,), "int8")
flags = ct.var("flags", (3,), "bool")

SHAPE_ERRORS = {
    "matmul mismatch": (lambda: x @ x, "matmul(float32[4,6], float32[4,6])", "contracted dimensions differ: 6", "and 4"),
    "matmul scalar": (lambda: ct.matmul(x, ct.var("s", ())), "matmul(float32[4,6], float32[])", "rank 1 or more"),
    "matmul batch": (lambda: ct.var("a", (2, 3, 4)) @ ct.var("b", (5, 4, 2)), "float32[2,3,4], float32[5,4,2]",
                     "do not broadcast"),
    "broadcast": (lambda: x + ct.var("v", (5,)), "add(float32[4,6], float32[5])", "(4, 6) and (5,) do not broadcast"),
    "where broadcast": (lambda: ct.where(x > 0, x, W), "where(bool[4,6], float32[4,6], float32[6,3])", "broadcast"),
    "einsum bad char": (lambda: ct.einsum("i1,jk", x, W), "einsum(", "'1' is not a subscript label"),
    "einsum operand count": (lambda: ct.einsum("ij,jk,kl", x, W), "name 3 operand(s) but 2 were given"),
    "einsum rank": (lambda: ct.einsum("ijk,jk", x, W), "operand 0 has 2 dimensions but its subscripts 'ijk' name 3"),
    "einsum sizes": (lambda: ct.einsum("ij,ik", x, W), "label 'i' has size 4 in one operand and 6 in operand 1"),
    "einsum output label": (lambda: ct.einsum("ij,jk->iz", x, W), "output label 'z' does not appear in any input"),
    "einsum repeated output": (lambda: ct.einsum("ij,jk->ii", x, W), "repeats label 'i'"),
    "einsum two arrows": (lambda: ct.einsum("ij->i->j", x), "more than one '->'"),
    "einsum two ellipses": (lambda: ct.einsum("......", x), "more than one '...'"),
    "einsum ellipsis output": (lambda: ct.einsum("...j->j", ct.var("t", (2, 3, 6))), "has no '...' to put them in"),
    "einsum not a string": (lambda: ct.einsum(3, x), "must be a string"),
    "einsum diagonal": (lambda: ct.einsum("ii->i", x), "repeats label 'i' over dimensions of different sizes (4 and 6)"),
    "sum axis range": (lambda: ct.sum(x, axis=2), "sum(float32[4,6])", "axis 2 is out of range for a tensor of rank 2"),
    "mean negative axis": (lambda: ct.mean(x, axis=-3), "axis -3 is out of range"),
    "max repeated axes": (lambda: ct.max(x, axis=(1, -1)), "repeats axis 1"),
    "softmax axis": (lambda: ct.softmax(x, axis=5), "softmax(float32[4,6])", "out of range"),
    "logsumexp axis type": (lambda: ct.logsumexp(x, axis=1.5), "axis (when not None) must be an int or a tuple of ints"),
    "max of nothing": (lambda: ct.max(ct.var("e", (0, 3)), axis=0), "axis 0, which has size 0"),
    "reshape size": (lambda: ct.reshape(x, (5, 5)), "reshape(float32[4,6])", "cannot reshape 24 elements into (5, 5)"),
    "reshape float": (lambda: ct.reshape(x, (2.5, 2)), "a shape must be an int or a tuple of ints"),
    "transpose float axes": (lambda: ct.transpose(x, (0.0, 1)), "axes must be an int or a tuple of ints"),
    "reshape two -1": (lambda: ct.reshape(x, (-1, -1)), "more than one -1"),
    "reshape -1 size": (lambda: ct.reshape(x, (-1, 5)), "cannot reshape 24 elements into (-1, 5)"),
    "transpose perm": (lambda: ct.transpose(x, (0, 0)), "axes (0, 0) are not a permutation of range(2)"),
    "transpose range": (lambda: ct.transpose(x, (0, 2)), "not a permutation"),
    "broadcast_to": (lambda: ct.broadcast_to(x, (4, 5)), "broadcast_to(float32[4,6])", "cannot broadcast (4, 6) to (4, 5)"),
    "broadcast_to fewer dims": (lambda: ct.broadcast_to(x, (6,)), "cannot broadcast (4, 6) to (6,)"),
    "var shape negative": (lambda: ct.var("n", (2, -1)), "var:", "non-negative sizes"),
    "var shape float": (lambda: ct.var("n", (2.0,)), "a shape must be an int or a tuple of ints, not (2.0,)"),
    "var name": (lambda: ct.var("", (2,)), "non-empty string"),
}

DTYPE_ERRORS = {
    "var dtype": (lambda: ct.var("c", (2,), "complex64"), "var:", "unsupported dtype 'complex64'", "float32"),
    "var dtype None": (lambda: ct.var("c", (2,), None), "unsupported dtype None"),
    "var dtype float": (lambda: ct.var("c", (2,), "float"), "'float' is float64 in NumPy and float32 in PyTorch"),
    "cast dtype int": (lambda: ct.cast(x, "int"), "'int' is int64 in NumPy and int32 in PyTorch: name its width"),
    "cast dtype": (lambda: ct.cast(x, "float128"), "cast(float32[4,6])", "unsupported dtype 'float128'"),
    "const dtype": (lambda: ct.const(1, dtype="foo"), "const: dtype:", "unsupported dtype 'foo'"),
    "weak overflow": (lambda: i8 + 1000, "add(int8[3], 1000)", "Python integer 1000 out of bounds for int8"),
    "negative int power": (lambda: i8 ** -1, "power(int8[3], int8[])", "integers to negative integer powers"),
    "relu of bool": (lambda: ct.relu(flags), "relu(bool[3])", "numeric operand"),
    "no loop": (lambda: ct.sign(flags), "sign(bool[3])", "NumPy's sign is not defined for (bool)"),
    "negative of bool": (lambda: -flags, "negative(bool[3])"),
}


@pytest.mark.parametrize("case", SHAPE_ERRORS)
def test_shape_errors(case):
    build, *fragments = SHAPE_ERRORS[case]
    check_error(ct.ShapeError, build, *fragments, located=True)


@pytest.mark.parametrize("case", DTYPE_ERRORS)
def test_dtype_errors(case):
    build, *fragments = DTYPE_ERRORS[case]
    check_error(ct.DTypeError, build, *fragments, located=True)


def test_constants_of_unsupported_values_are_refused():
    for value, fragment in [(1 + 2j, "complex"), ("text", "str 'text'"), ([1, "a"], "list"),
                            (2 ** 70, "fits in neither int64 nor uint64"), (object(), "object")]:
        with pytest.raises(ct.DTypeError, match=re.escape(fragment)):
            ct.const(value)
    with pytest.raises(ct.DTypeError, match="Python integer 300 out of bounds for int8"):
        ct.const(300, dtype="int8")
    with pytest.raises(ct.DTypeError, match="already a term"):
        ct.const(x)


def test_errors_belong_to_one_family_and_to_pythons():
    assert issubclass(ct.ShapeError, ct.CortadoError) and issubclass(ct.ShapeError, ValueError)
    assert issubclass(ct.DTypeError, ct.CortadoError) and issubclass(ct.DTypeError, TypeError)
    assert issubclass(ct.FeedError, ct.CortadoError) and issubclass(ct.FeedError, KeyError)


# -- feeds -----------------------------------------------------------------------------------

y = ct.var("y", (4, 3))
loss = ct.sum((x @ W - y) ** 2)
GOOD = {"x": np.ones((4, 6), np.float32), "W": np.ones((6, 3), np.float32), "y": np.ones((4, 3), np.float32)}


def test_good_feeds_by_name_or_by_variable():
    by_name = ct.evaluate(loss, GOOD)
    by_var = ct.evaluate(loss, {x: GOOD["x"], W: GOOD["W"], y: GOOD["y"]})
    assert by_name == by_var == 4 * 3 * 25


def test_missing_feed_is_named_with_its_declaration():
    message = check_error(ct.FeedError, lambda: ct.evaluate(loss, {"x": GOOD["x"], "W": GOOD["W"]}),
                          "no feed for variable 'y' : float32[4,3]", f"declared at tests/{HERE}")
    assert "'x'" not in message


def test_extra_feed_is_named():
    check_error(ct.FeedError, lambda: ct.evaluate(loss, {**GOOD, "z": 1.0}),
                "feeds ['z'] name no variable of the graph", "its variables: W, x, y")
    counter = ct.var("counter", (3,))  # a program of state alone is no constant, as the evaluator's message said
    step = ct.compile([counter], state={counter: np.zeros(3, np.float32)}, updates={counter: counter + 1})
    check_error(ct.FeedError, lambda: step(x=np.ones(3, np.float32)),
                "feeds ['x'] name no input of the program (its inputs: none; its state: counter)")


def test_an_update_keyed_by_another_variable_of_a_state_variables_name_says_so():
    """It said the variable was not in state, where one of its name was."""
    a, other = ct.var("A", (3,)), ct.var("A", (3,))
    check_error(ct.FeedError, lambda: ct.compile([a], state={a: np.ones(3, np.float32)}, updates={other: a + 1}),
                "compile: two variables are both named 'A'")


def test_a_state_variables_first_value_or_a_value_written_to_it_is_called_so_not_a_feed():
    w, x = ct.var("W", (2,)), ct.var("x", (2,))
    check_error(ct.ShapeError, lambda: ct.compile([x * w], inputs=[x], state={w: np.ones(3, np.float32)}),
                "the first value of variable 'W' : float32[2]", "has shape (3,)")
    step = ct.compile([x * w], inputs=[x], state={w: np.ones(2, np.float32)})

    def write():
        step.state["W"] = np.ones(2)
    check_error(ct.DTypeError, write, "the value written to variable 'W' : float32[2]", "has dtype float64")


def test_a_feed_for_a_constant_says_it_is_one():
    """A gradient that does not depend on its variable (of a sum: ones) reads no variable, so a feed for it is extra,
    and the error says why."""
    x = ct.var("x", (3,))
    (gradient,) = ct.grad(ct.sum(x), [x])
    check_error(ct.FeedError, lambda: ct.evaluate(gradient, {"x": np.ones(3, np.float32)}),
                "its variables: none): it is a constant", "evaluate it with no feeds")
    np.testing.assert_array_equal(ct.evaluate(gradient, {}), np.ones(3, np.float32))


def test_a_feed_naming_the_programs_state_says_how_to_set_it():
    x, w = ct.var("x", (2,)), ct.var("W", (2,))
    step = ct.compile([ct.sum(x * w)], inputs=[x], state={w: np.ones(2, np.float32)})
    with pytest.raises(ct.FeedError, match=r"feeds \['W'\] name the program's state, which a call does not feed "
                                           r"\(its inputs: x\): set it with program.state\['W'\] = value"):
        step(x=np.ones(2, np.float32), W=np.ones(2, np.float32))


def test_numpys_functions_and_tensors_methods_refuse_terms_naming_cortados():
    t = ct.var("t", (2,))
    with pytest.raises(TypeError, match="NumPy's sum does not take a symbolic term: use ct.sum"):
        np.sum(t)
    with pytest.raises(TypeError, match="use ct.concatenate"):
        np.concatenate([t, t])
    with pytest.raises(TypeError, match="a symbolic term is no array: ct.evaluate"):
        np.asarray(t)
    with pytest.raises(AttributeError, match=r"a term has no attribute 'numpy': it is a symbolic expression, whose "
                                             r"value ct.evaluate\(term, feeds\)"):
        t.numpy()
    with pytest.raises(AttributeError, match=r"ct.argmax\(x, ...\) is cortado's function"):
        t.argmax(0)
    with pytest.raises(AttributeError, match=r"gives$"):  # ct.nn is a module, no function to send anyone to
        _ = t.nn
    with pytest.raises(TypeError, match="NumPy's exp does not take a symbolic term: use ct.exp"):  # a ufunc
        np.exp(t)
    array = np.ones(2, np.float32)
    with pytest.raises(TypeError, match="an array cannot hold a term: write a = a"):
        array += t
    assert (array - t).head == "subtract" and (array < t).head == "greater" and (np.float64(2) * t).dtype == np.float64


def test_a_convolution_kernel_with_an_empty_axis_is_refused():
    """It made an output larger than its input."""
    with pytest.raises(ct.ShapeError, match=r"a kernel of \(0, 0\) has an empty axis"):
        ct.conv2d(ct.var("im", (1, 1, 4, 4)), ct.var("w", (2, 1, 0, 0)))


def test_misshapen_feed():
    check_error(ct.ShapeError, lambda: ct.evaluate(loss, {**GOOD, "y": np.ones((3, 4), np.float32)}),
                "the feed for variable 'y' : float32[4,3]", "has shape (3, 4)")


def test_mistyped_feed_says_how_to_fix_it():
    check_error(ct.DTypeError, lambda: ct.evaluate(loss, {**GOOD, "W": np.ones((6, 3))}),
                "the feed for variable 'W' : float32[6,3]", "has dtype float64", ".astype('float32')")


def test_python_values_are_converted_when_the_kind_fits():
    v = ct.var("v", (2,))
    assert ct.evaluate(v * 2.0, {"v": [1, 2]}).tolist() == [2.0, 4.0]
    check_error(ct.DTypeError, lambda: ct.evaluate(ct.var("k", (2,), "int32") + 1, {"k": [1.5, 2.0]}),
                "the feed for variable 'k' : int32[2]", "holds float64 values")
    check_error(ct.DTypeError, lambda: ct.evaluate(v, {"v": [[1], [2, 3]]}), "is not array-like")


def test_two_variables_with_one_name_are_refused():
    other = ct.var("x", (6,))
    check_error(ct.FeedError, lambda: ct.evaluate(x @ other, {"x": GOOD["x"]}),
                "two variables are both named 'x'", "test_errors.py:", "Each ct.var call declares a new variable")


def test_feed_keys_must_be_names_or_variables():
    check_error(ct.FeedError, lambda: ct.evaluate(loss, {**GOOD, x + 1: GOOD["x"]}), "is not a variable")
    check_error(ct.FeedError, lambda: ct.evaluate(loss, {**GOOD, 3: GOOD["x"]}), "not int 3")
    check_error(ct.FeedError, lambda: ct.evaluate(loss, {**GOOD, x: GOOD["x"]}), "variable 'x' is fed twice")


def test_a_feed_keyed_by_another_variable_of_the_same_name_is_refused():
    """Keyed by a variable, a feed is for that variable: one of another shape under the same name is not
    the graph's, even when the value fits the graph's variable."""
    other = ct.var("x", (5,))
    feeds = {**GOOD, "x": None}
    del feeds["x"]
    check_error(ct.FeedError, lambda: ct.evaluate(loss, {**feeds, other: GOOD["x"]}),
                "keyed by variable 'x' : float32[5]", "not the graph's variable 'x' : float32[4,6]")
    program = ct.compile([x * 2], inputs=[x])
    check_error(ct.FeedError, lambda: program({other: GOOD["x"]}), "not the graph's variable 'x'")


def test_bad_precision():
    check_error(ct.DTypeError, lambda: ct.evaluate(loss, GOOD, precision="float32"), "precision must be one of")


def test_operands_that_are_no_tensor_name_the_op_and_the_line():
    check_error(ct.DTypeError, lambda: x + "a", "add(float32[4,6], 'a'): cannot make a tensor of str 'a'", located=True)
    check_error(ct.DTypeError, lambda: ct.const(2 ** 70), "const: the Python int", "fits in neither", located=True)
    check_error(ct.DTypeError, lambda: ct.where(x > 0, ct.var("big", (4, 6), "int64"), 2 ** 63),
                "where(bool[4,6], int64[4,6], 9223372036854775808): Python integer 9223372036854775808 out of bounds for int64",
                located=True)


def test_feeds_from_python_values_are_range_checked_not_wrapped():
    small = ct.var("small", (3,), "int8")
    check_error(ct.DTypeError, lambda: ct.evaluate(small, {"small": [1000, -200, 5]}),
                "holds a value out of range: Python integer 1000 out of bounds for int8")
    unsigned = ct.var("unsigned", (3,), "uint8")
    assert ct.evaluate(unsigned, {"unsigned": [1, 2, 255]}).tolist() == [1, 2, 255]
    check_error(ct.DTypeError, lambda: ct.evaluate(unsigned, {"unsigned": [1, 2, -3]}), "out of range")
    check_error(ct.DTypeError, lambda: ct.evaluate(small, {"small": [1.5, 2, 3]}), "holds float64 values")
    half = ct.var("half", (3,), "float16")  # a finite number past float16's largest would be infinite
    check_error(ct.DTypeError, lambda: ct.evaluate(half, {"half": [1.0, 1e6, 2.0]}),
                "holds 1000000.0 at (1,), beyond float16's largest, 65504")
    check_error(ct.DTypeError, lambda: ct.evaluate(half, {"half": [1, 70000, 2]}), "holds 70000 at (1,)")
    assert np.isinf(ct.evaluate(half, {"half": [1.0, float("inf"), 2.0]})[1])  # an infinity stays one


def test_feeds_that_are_not_values():
    check_error(ct.DTypeError, lambda: ct.evaluate(x * 2.0, {"x": x}), "is a cortado term; feeds are values")
    check_error(ct.FeedError, lambda: ct.evaluate(ct.const(1.0), None), "feeds must be a mapping")
    check_error(ct.DTypeError, lambda: ct.evaluate(3, {}), "expected a cortado term or a list of them, not int")
    check_error(ct.DTypeError, lambda: ct.Graph([loss, 3]), "expected cortado terms as outputs, got int 3")


def test_the_cpu_backend_refuses_what_only_gpu_lowering_makes():
    from cortado.backends.cupy.lowering.gemm_op import gemm

    a, b = ct.var("a", (3, 4)), ct.var("b", (4, 5))
    with pytest.raises(ct.errors.BackendError, match="numpy backend has no kernel for gemm"):
        ct.compile(gemm(a, b), inputs=[a, b])


def test_the_cpu_backend_names_the_emitter_an_op_of_the_table_lacks(monkeypatch):
    from cortado.backends.numpy import kernels
    from cortado.exprgraph.ops import OVERLAP_ADD

    monkeypatch.delitem(kernels.EMITTERS, OVERLAP_ADD)
    x = ct.var("x", (3, 2))
    check_error(ct.errors.BackendError, lambda: ct.compile(ct.overlap_add(x, shape=(4,)), inputs=[x]),
                "numpy backend has no kernel for overlap_add", "no emitter in cortado/backends/numpy/kernels.py")
