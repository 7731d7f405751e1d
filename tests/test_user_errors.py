"""Errors name what the user wrote: the call, its operands' types and its line, never the ops cortado built from it
(a pooling's windows, a gradient's gather); and a step is called the ways JAX and PyTorch users call one."""

import inspect
import re

import numpy as np
import pytest

import cortado as ct


def _line():
    """The line of the caller's next statement."""
    return f"test_user_errors.py:{inspect.currentframe().f_back.f_lineno + 1}"


# -- pooling: a window larger than its input ---------------------------------------------------


def test_a_pooling_window_larger_than_the_input_names_the_pooling():
    x = ct.var("x", (1, 3, 2, 2))
    with pytest.raises(ct.ShapeError) as error:
        where = _line()
        ct.max_pool2d(x, 3)
    message = str(error.value)
    assert message.startswith("max_pool2d(float32[1,3,2,2], kernel_size=3): the 3x3 window is larger than the "
                              "input's 2x2")
    assert where in message and "windows" not in message


def test_a_padded_pooling_says_the_padded_size():
    x = ct.var("x", (1, 3, 1, 1))
    with pytest.raises(ct.ShapeError, match=re.escape("avg_pool2d(float32[1,3,1,1], kernel_size=4, padding=1): the 4x4 "
                                                      "window is larger than the input's 1x1 padded by (1, 1) on each "
                                                      "side to 3x3")):
        ct.avg_pool2d(x, 4, padding=1)


def test_a_pooling_window_that_fits_is_built():
    assert ct.max_pool2d(ct.var("x", (1, 3, 2, 2)), 2).shape == (1, 3, 1, 1)


# -- convolution and pooling arguments: the call, never the conv or windows built from it ----------------------

_X = (1, 3, 8, 8)
BAD_CALLS = {
    "channels": (lambda x: ct.conv2d(x, ct.var("w", (4, 2, 3, 3))), "conv2d(float32[1,3,8,8], float32[4,2,3,3]): "),
    "stride": (lambda x: ct.conv2d(x, ct.var("w", (4, 3, 3, 3)), stride=0),
               "conv2d(float32[1,3,8,8], float32[4,3,3,3], stride=0): "),
    "same and stride": (lambda x: ct.conv2d(x, ct.var("w", (4, 3, 3, 3)), stride=2, padding="same"),
                        "conv2d(float32[1,3,8,8], float32[4,3,3,3], stride=2, padding='same'): "),
    "kernel too large": (lambda x: ct.conv2d(x, ct.var("w", (4, 3, 9, 9))), "conv2d(float32[1,3,8,8], float32[4,3,9,9]): "),
    "pool stride": (lambda x: ct.max_pool2d(x, 2, stride=0), "max_pool2d(float32[1,3,8,8], kernel_size=2, stride=0): "),
    "pool padding": (lambda x: ct.avg_pool2d(x, 2, padding=3), "avg_pool2d(float32[1,3,8,8], kernel_size=2, padding=3): "),
    "pool kernel": (lambda x: ct.max_pool2d(x, (2, 2, 2)), "max_pool2d(float32[1,3,8,8], kernel_size=(2, 2, 2)): "),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_a_bad_convolution_or_pooling_names_the_call_and_its_line(case):
    build, call = BAD_CALLS[case]
    x = ct.var("x", _X)
    with pytest.raises(ct.ShapeError) as error:
        build(x)
    message = str(error.value)
    assert message.startswith(call) and f"test_user_errors.py:{build.__code__.co_firstlineno}" in message, message
    assert "windows(" not in message and "conv(" not in message


# -- gathers: an index out of range when the step runs --------------------------------------------


def _classifier(classes):
    """A softmax classifier's loss over ``classes`` and its gradient step; the label pick's line."""
    x, y, W = ct.var("x", (64, 20)), ct.var("y", (64,), "int64"), ct.var("W", (20, classes))
    logits = x @ W
    where = _line()
    picked = ct.take_along_axis(logits, y[:, None], axis=1)[:, 0]
    loss = ct.mean(ct.logsumexp(logits, axis=1) - picked)
    (gW,) = ct.grad(loss, [W])
    return x, y, W, loss, gW, where


def _feeds(classes, label):
    labels = np.zeros(64, np.int64)
    labels[5] = label
    return np.ones((64, 20), np.float32), labels, np.zeros((20, classes), np.float32)


@pytest.mark.parametrize("outputs", ["loss", "none"])  # without the loss, only the gradient's gather reads the labels
def test_a_label_out_of_range_names_the_users_take_along_axis(outputs):
    x, y, W, loss, gW, where = _classifier(2)
    xv, yv, Wv = _feeds(2, 2)
    step = ct.compile([loss] if outputs == "loss" else [], inputs=[x, y], state={W: Wv}, updates={W: W - 0.1 * gW})
    with pytest.raises(ct.IndexRangeError) as error:
        step(x=xv, y=yv)
    message = str(error.value)
    assert message.startswith("take_along_axis(float32[64,2], int64[64,1], axis=1): index 2 is out of range for "
                              "axis 1 of size 2 (indices must lie in [-2, 2))")
    assert where in message
    assert (error.value.index, error.value.size) == (2, 2)
    assert np.array_equal(step.state["W"], Wv)  # nothing was updated


def test_the_reference_names_the_users_call_for_a_gradient_too():
    x, y, W, _, gW, where = _classifier(10)
    xv, yv, Wv = _feeds(10, -11)
    with pytest.raises(ct.IndexRangeError, match=re.escape("take_along_axis(float32[64,10], int64[64,1], axis=1): "
                                                           "index -11 is out of range for axis 1 of size 10")) as error:
        ct.evaluate(gW, {"x": xv, "y": yv, "W": Wv})
    assert where in str(error.value)


def test_an_embedding_token_out_of_range_names_the_users_take():
    tokens, table = ct.var("tokens", (4, 3), "int32"), ct.var("table", (5, 8))
    where = _line()
    loss = ct.sum(ct.take(table, tokens, axis=0) ** 2)
    (g,) = ct.grad(loss, [table])
    step = ct.compile([], inputs=[tokens], state={table: np.ones((5, 8), np.float32)}, updates={table: table - g})
    with pytest.raises(ct.IndexRangeError) as error:
        step(tokens=np.full((4, 3), 7, np.int32))
    assert str(error.value).startswith("take(float32[5,8], int32[4,3], axis=0): index 7 is out of range for axis 0 "
                                       "of size 5")
    assert where in str(error.value)


def test_a_flattened_take_names_the_operand_as_written():
    x, i = ct.var("x", (3, 4)), ct.var("i", (2,), "int64")
    with pytest.raises(ct.IndexRangeError, match=re.escape("take(float32[3,4], int64[2], axis=None): index 12 is out "
                                                           "of range for the flattened operand of size 12")):
        ct.evaluate(ct.take(x, i), {"x": np.zeros((3, 4), np.float32), "i": np.array([0, 12])})


# -- calling a step ------------------------------------------------------------------------------


def _step():
    """A program of two inputs and one state variable; its feeds."""
    x, y, W = ct.var("x", (2, 3)), ct.var("y", (2,), "int64"), ct.var("W", (3, 4))
    out = ct.sum(x @ W, axis=1) + ct.cast(y, "float32")
    step = ct.compile([out], inputs=[x, y], state={W: np.ones((3, 4), np.float32)})
    return step, W, np.arange(6, dtype=np.float32).reshape(2, 3), np.array([10, 20])


def test_feeds_by_position_take_the_inputs_in_order():
    step, _, xv, yv = _step()
    expected = step(x=xv, y=yv)
    assert np.array_equal(step(xv, yv), expected)
    assert np.array_equal(step(xv, y=yv), expected)
    assert np.array_equal(step({"x": xv, "y": yv}), expected)


def test_too_many_feeds_by_position_are_refused_naming_the_inputs():
    step, _, xv, yv = _step()
    with pytest.raises(ct.FeedError, match=re.escape("3 feeds given by position, but the program has 2 input(s), in "
                                                     "this order: (x: float32[2,3], y: int64[2])")):
        step(xv, yv, yv)


def test_an_input_fed_by_position_and_by_name_is_refused():
    step, _, xv, yv = _step()
    with pytest.raises(ct.FeedError, match=r"\['x'\] fed both by position and by name"):
        step(xv, x=xv, y=yv)


def test_an_input_left_out_by_position_is_named():
    step, _, xv, _ = _step()
    with pytest.raises(ct.FeedError, match="no feed for variable 'y'"):
        step(xv)


def test_a_misspelled_feed_is_named_beside_the_missing_one():
    step, _, xv, yv = _step()
    with pytest.raises(ct.FeedError, match=re.escape("no feed for variable 'y'") + r".* \['yy'\] name no variable "
                                                                                  r"of the graph: a misspelling\?"):
        step(x=xv, yy=yv)


def test_an_input_asked_of_the_state_is_said_to_be_an_input():
    step, _, _, _ = _step()
    with pytest.raises(ct.FeedError, match=r"no state variable 'x' \('x' is an input, fed at each call\)"):
        step.state["x"]


def test_the_state_is_indexed_by_variable_or_name():
    step, W, _, _ = _step()
    assert np.array_equal(step.state[W], step.state["W"])
    assert W in step.state and "W" in step.state
    step.state[W] = np.full((3, 4), 2, np.float32)
    assert (step.state["W"] == 2).all()


def test_another_variable_of_the_state_name_is_refused():
    step, _, _, _ = _step()
    with pytest.raises(ct.FeedError, match="state: two variables are both named 'W'"):
        step.state[ct.var("W", (4,))]
    with pytest.raises(ct.FeedError, match="no state variable"):
        step.state[ct.var("V", (3, 4))]


def test_indices_shared_by_two_gathers_report_the_gather_that_ran():
    """Found by a review: the first gather written with the indices was named, even one the program never ran."""
    a, b, i = ct.var("a", (5, 5)), ct.var("b", (5, 5)), ct.var("i", (2,), "int64")
    ct.take(a, i, axis=0)  # written, never compiled
    where = _line()
    y = ct.take(b, i, axis=1) * 2.0
    step = ct.compile([y], inputs=[b, i])
    with pytest.raises(ct.IndexRangeError) as error:
        step(np.zeros((5, 5), np.float32), np.array([0, 7]))
    message = str(error.value)
    assert "axis=1" in message and "axis 1 of size 5" in message and where in message


def test_a_program_of_no_inputs_takes_none_as_no_feeds():
    step = ct.compile([ct.const(np.float32(2.0)) * 3])
    assert step(None)[0] == step()[0] == 6



def test_an_argument_a_call_does_not_take_names_the_call_and_what_it_takes():
    """PyTorch's ``ceil_mode`` or ``padding_mode`` given to cortado's pooling or convolution: a TypeError that names
    the function and its parameters, not one from inside ``inspect``."""
    image, weight = ct.var("im", (1, 3, 5, 5)), ct.var("w", (2, 3, 3, 3))
    with pytest.raises(TypeError, match=r"^max_pool2d\(x, kernel_size, stride=None, padding=0\): got an unexpected "
                                        r"keyword argument 'ceil_mode'"):
        ct.max_pool2d(image, 2, ceil_mode=True)
    with pytest.raises(TypeError, match=r"^conv2d\(x, w, stride=1, padding=0, dilation=1, groups=1\): .*'padding_mode'"):
        ct.conv2d(image, weight, padding_mode="zeros")


def test_a_torch_tensor_fed_is_told_how_to_become_an_array():
    """A tensor of PyTorch's (any object of its package) is no array a program reads: the message says
    ``tensor.numpy()``, not NumPy's ``.astype``, which a tensor lacks."""
    x = ct.var("x", (2, 3))
    program = ct.compile([x * 2], inputs=[x])
    tensor = type("Tensor", (), {"__module__": "torch", "shape": (2, 3), "dtype": "torch.float32"})()
    with pytest.raises(ct.DTypeError, match=r"is a torch tensor; feed a NumPy array \(tensor.numpy\(\)\) or, on the "
                                            r"GPU, a CuPy array \(cupy.from_dlpack\(tensor\)\)"):
        program(x=tensor)
