"""cortado.optim: each optimizer's steps inside one compiled program against PyTorch's algorithms, transcribed in
NumPy (and against torch.optim itself where torch is installed); schedules; gradient clipping."""

import math

import numpy as np
import pytest

import cortado as ct
from cortado import optim
from cortado.backends import gpu_visible
from peers import needs_torch
from reference_checks import host

STEPS = 6


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    w0, b0 = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    data = [(rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32))
            for _ in range(STEPS)]
    return w0, b0, data


def _gradients(w, b, x, y):
    """The gradients of ``mean((x @ w^T + b - y)^2)``."""
    r = x @ w.T + b - y
    g = 2 * r / r.size
    return g.T @ x, g.sum(0)


def _ours(optimizer, w0, b0, data):
    w, b = ct.var("w", w0.shape, w0.dtype), ct.var("b", b0.shape, b0.dtype)
    x, y = ct.var("x", data[0][0].shape, w0.dtype), ct.var("y", data[0][1].shape, w0.dtype)
    r = x @ ct.transpose(w) + b - y
    loss = ct.mean(r * r)
    state, updates = optimizer.updates({"w": w, "b": b}, ct.grad(loss, [w, b]))
    step = ct.compile([loss], inputs=[x, y], state={w: w0, b: b0, **state}, updates=updates, backend="numpy")
    for xv, yv in data:
        step(x=xv, y=yv)
    return np.array(step.state["w"]), np.array(step.state["b"])


def _reference(update, w0, b0, data):
    """``update(name, p, g, t, slots)`` applied for every step, as torch.optim's loops do."""
    params, slots = {"w": w0.astype(np.float64), "b": b0.astype(np.float64)}, {"w": {}, "b": {}}
    for t, (x, y) in enumerate(data, start=1):
        grads = dict(zip(("w", "b"), _gradients(params["w"], params["b"], x, y)))
        for name in params:
            params[name] = update(name, params[name], grads[name], t, slots[name])
    return params["w"], params["b"]


def _sgd(lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
    def update(name, p, g, t, slot):
        g = g + weight_decay * p
        if momentum:
            slot["buf"] = g if t == 1 else momentum * slot["buf"] + (1 - dampening) * g
            g = g + momentum * slot["buf"] if nesterov else slot["buf"]
        return p - lr * g
    return update


def _adam(lr, betas, eps, weight_decay, decoupled, rate=lambda t: None):
    def update(name, p, g, t, slot):
        step_lr = rate(t) or lr
        if decoupled:
            p = p * (1 - step_lr * weight_decay)
        else:
            g = g + weight_decay * p
        slot["m"] = betas[0] * slot.get("m", 0) + (1 - betas[0]) * g
        slot["v"] = betas[1] * slot.get("v", 0) + (1 - betas[1]) * g * g
        m_hat, v_hat = slot["m"] / (1 - betas[0] ** t), slot["v"] / (1 - betas[1] ** t)
        return p - step_lr * m_hat / (np.sqrt(v_hat) + eps)
    return update


CASES = {
    "sgd": (optim.SGD(0.1), _sgd(0.1)),
    "sgd momentum decay": (optim.SGD(0.05, momentum=0.9, weight_decay=0.01), _sgd(0.05, 0.9, weight_decay=0.01)),
    "sgd dampening": (optim.SGD(0.05, momentum=0.9, dampening=0.5), _sgd(0.05, 0.9, 0.5)),
    "sgd nesterov": (optim.SGD(0.05, momentum=0.9, nesterov=True), _sgd(0.05, 0.9, nesterov=True)),
    "adam": (optim.Adam(1e-2, weight_decay=0.1), _adam(1e-2, (0.9, 0.999), 1e-8, 0.1, False)),
    "adamw": (optim.AdamW(1e-2, betas=(0.8, 0.99)), _adam(1e-2, (0.8, 0.99), 1e-8, 0.01, True)),
}


@pytest.mark.parametrize("case", CASES)
def test_each_optimizer_takes_pytorchs_steps(case):
    optimizer, update = CASES[case]
    w0, b0, data = _problem()
    for ours, expected in zip(_ours(optimizer, w0, b0, data), _reference(update, w0, b0, data)):
        np.testing.assert_allclose(ours, expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("case", CASES)
def test_in_float64_each_optimizer_takes_pytorchs_steps_to_float64s_rounding(case):
    """PyTorch computes Adam's bias corrections, and reads a scheduler's rates, as Python floats: here too, so a
    float64 run is PyTorch's to its rounding (float32's 0.999 put 1 - 0.999^t 1.3e-5 off, and a float32 table of
    rates a rate of 0.1 1.5e-8 off)."""
    optimizer, update = CASES[case]
    w0, b0, data = _problem()
    w0, b0, data = w0.astype(np.float64), b0.astype(np.float64), [(x.astype(np.float64), y.astype(np.float64))
                                                                  for x, y in data]
    for ours, expected in zip(_ours(optimizer, w0, b0, data), _reference(update, w0, b0, data)):
        np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-14)
    rate = optim.step_decay(0.1, 2, gamma=0.5, total=STEPS)
    for ours, expected in zip(_ours(optim.SGD(rate), w0, b0, data),
                              _reference(_sgd_at(lambda t: 0.1 * 0.5 ** ((t - 1) // 2)), w0, b0, data)):
        np.testing.assert_allclose(ours, expected, rtol=1e-13, atol=1e-15)


def _sgd_at(rate):
    return lambda name, p, g, t, slot: p - rate(t) * g


def test_a_schedule_is_read_at_the_steps_count():
    schedule = optim.warmup_cosine(1e-2, warmup=2, total=5, floor=1e-3)
    expected = [5e-3, 1e-2] + [1e-3 + 0.5 * 9e-3 * (1 + math.cos(math.pi * k / 3)) for k in (1, 2, 3)] + [1e-3]
    np.testing.assert_allclose([schedule(t) for t in range(1, 7)], expected, rtol=1e-6)
    w0, b0, data = _problem(1)
    rate = {t: schedule(t) for t in range(1, STEPS + 1)}
    ours = _ours(optim.AdamW(schedule, weight_decay=0.1), w0, b0, data)
    expected = _reference(_adam(None, (0.9, 0.999), 1e-8, 0.1, True, rate.get), w0, b0, data)
    for a, e in zip(ours, expected):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)
    assert optim.step_decay(1.0, every=2, gamma=0.5, total=10)(5) == 0.25
    with pytest.raises(ct.CortadoError, match="total steps"):
        optim.step_decay(1.0, every=2)
    assert [optim.lambda_lr(0.5, lambda epoch: 0.9 ** epoch, total=3)(t) for t in (1, 2, 3, 4)] == [
        0.5, 0.5 * 0.9, 0.5 * 0.81, 0.5 * 0.81]  # PyTorch's LambdaLR: epoch 0 at the first step; flat past total


@needs_torch
def test_lambda_lr_reads_the_rate_pytorchs_lambda_lr_gives_each_step():
    import torch

    factor = lambda epoch: 1.0 / (1.0 + epoch) if epoch % 3 else 0.5 ** epoch  # noqa: E731
    parameter = torch.nn.Parameter(torch.zeros(1))
    sgd = torch.optim.SGD([parameter], lr=0.2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(sgd, factor)
    theirs = []
    for _ in range(8):
        theirs.append(sgd.param_groups[0]["lr"])  # the rate this step uses
        sgd.step()
        scheduler.step()
    ours = optim.lambda_lr(0.2, factor, total=8)
    assert [ours(t) for t in range(1, 9)] == theirs


def test_weight_decay_skips_what_decay_refuses_and_clipping_scales_by_the_global_norm():
    w0, b0, data = _problem(2)
    only_matrices = optim.SGD(0.1, weight_decay=0.5, decay=lambda name, p: p.ndim == 2)
    expected_b = _reference(_sgd(0.1), w0, b0, data[:1])[1]
    np.testing.assert_allclose(_ours(only_matrices, w0, b0, data[:1])[1], expected_b, rtol=1e-6)
    g = [ct.var("g1", (3,)), ct.var("g2", (2,))]
    clipped = optim.clip_grad_norm(g, 1.0)
    values = {"g1": np.array([3.0, 0, 0], np.float32), "g2": np.array([0, 4.0], np.float32)}
    got = ct.evaluate(clipped, values)
    np.testing.assert_allclose(np.concatenate(got), np.array([3, 0, 0, 0, 4]) / (5 + 1e-6), rtol=1e-6)
    small = ct.evaluate(optim.clip_grad_norm(g, 10.0), values)
    np.testing.assert_array_equal(np.concatenate(small), [3, 0, 0, 0, 4])


def test_gradients_out_of_the_parameters_order_are_refused_where_their_shapes_agree():
    """Two layers of one shape would have trained on each other's gradients without a word."""
    w1, w2 = ct.var("w1", (3, 3)), ct.var("w2", (3, 3))
    x = ct.var("x", (2, 3))
    loss = ct.sum(ct.tanh(x @ w1) @ w2)
    g1, g2 = ct.grad(loss, [w1, w2])
    with pytest.raises(ct.CortadoError, match=r"the gradient given for 'w1' is made from ct.grad's of 'w2': are the "
                                              r"gradients in the parameters' order\?"):
        optim.SGD(0.1).updates([w1, w2], [g2, g1])
    with pytest.raises(ct.CortadoError, match=r"given for 'w1' is made from ct.grad's of 'w2'"):  # scaled first
        optim.SGD(0.1).updates([w1, w2], [g2 * 0.5, g1 * 0.5])
    optim.SGD(0.1).updates([w1, w2], [g1, g2 * 0.5])
    optim.SGD(0.1).updates([w1, w2], optim.clip_grad_norm([g1, g2], 1.0))  # each made from both: taken as given
    optim.SGD(0.1).updates([w1, w2], [ct.tanh(ct.transpose(x) @ x), g2])  # a gradient of one's own making too


def test_optimizers_say_what_is_wrong():
    with pytest.raises(ct.CortadoError, match="Nesterov"):
        optim.SGD(0.1, nesterov=True)
    with pytest.raises(ct.CortadoError, match="a Schedule"):
        optim.SGD(lambda t: 0.1).updates([ct.var("p", (2,))], [ct.var("g", (2,))])
    with pytest.raises(ct.CortadoError, match="2 parameters and 1 gradients"):
        optim.SGD(0.1).updates([ct.var("p", (2,)), ct.var("q", (2,))], [ct.var("g", (2,))])
    with pytest.raises(ct.CortadoError, match="the gradient of 'p' is None, not a term"):
        optim.SGD(0.1).updates([ct.var("p", (2,))], [None])
    with pytest.raises(ct.CortadoError, match="the parameters are variables"):
        optim.SGD(0.1).updates({"w": np.ones(2)}, [ct.var("g", (2,))])
    assert optim.SGD(np.array(0.1)).lr == 0.1 and optim.Adam(np.float32(0.5), betas=(np.float64(0.9), 0)).lr == 0.5


@pytest.mark.parametrize("make, message", [
    (lambda: optim.AdamW(lr=ct.var("lr", ())), "AdamW: lr is a number or a Schedule .* fixed when the step is "
                                                "compiled, not a term"),
    (lambda: optim.SGD(-0.1), "lr is a finite number, at least 0, not -0.1"),
    (lambda: optim.Adam({"w": ct.var("w", (2,))}), r"Adam is built from its settings .*the parameters and their "
                                                   r"gradients go to its updates: Adam\(...\)\.updates\("),
    (lambda: optim.SGD([ct.var("w", (2,))]), "SGD is built from its settings"),
    (lambda: optim.SGD({"w": ct.var("w", (2,))}.values(), lr=0.1), "SGD is built from its settings"),  # PyTorch's way
    (lambda: optim.AdamW(iter([ct.var("w", (2,))])), "AdamW is built from its settings"),
    (lambda: optim.SGD(float("nan")), "lr is a finite number"),
    (lambda: optim.SGD("0.1"), "lr is a finite number, at least 0, not '0.1'"),
    (lambda: optim.Adam(betas=(1.5, 0.999)), r"betas\[0\] is a finite number, at least 0 and below 1"),
    (lambda: optim.Adam(1e-3, betas=0.9), "betas is a pair"),
    (lambda: optim.Adam(eps=-1e-8), "eps is a finite number, at least 0"),
    (lambda: optim.AdamW(clip_norm=-1), "clip_norm is a finite number, above 0"),
    (lambda: optim.AdamW(weight_decay="a"), "weight_decay is a finite number"),
    (lambda: optim.AdamW(decay=True), "decay is a function"),
    (lambda: optim.SGD(0.1, momentum=-0.9), "momentum is a finite number, at least 0"),
    (lambda: optim.step_decay(0.1, 0, total=10), "step_decay: every is a whole number of at least 1, not 0"),
    (lambda: optim.schedule(lambda t: 0.1, 2.5), "a schedule: steps is a whole number of at least 1, not 2.5"),
])
def test_settings_that_are_no_numbers_or_out_of_range_are_refused_as_pytorch_refuses_them(make, message):
    """A negative or NaN rate, betas outside [0, 1), a string where a number goes: each trained silently before, a
    string even as the number it spells."""
    with pytest.raises(ct.CortadoError, match=message):
        make()


@needs_torch
@pytest.mark.parametrize("dtype, rtol, atol", [("float32", 2e-5, 2e-6), ("float64", 1e-12, 1e-14)])
@pytest.mark.parametrize("name", ["sgd nesterov", "adam", "adamw"])
def test_against_torch_optim(name, dtype, rtol, atol):
    import torch

    w0, b0, data = _problem(3)
    w0, b0, data = w0.astype(dtype), b0.astype(dtype), [(x.astype(dtype), y.astype(dtype)) for x, y in data]
    w, b = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    make = {"sgd nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
            "adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),
            "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.8, 0.99))}[name]
    optimizer = make([w, b])
    for x, y in data:
        optimizer.zero_grad()
        loss = ((torch.from_numpy(x) @ w.T + b - torch.from_numpy(y)) ** 2).mean()
        loss.backward()
        optimizer.step()
    ours = _ours(CASES[name][0], w0, b0, data)
    np.testing.assert_allclose(ours[0], w.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(ours[1], b.detach().numpy(), rtol=rtol, atol=atol)


def test_gradients_as_a_dict_of_the_parameters_names_are_taken_as_the_list_in_order():
    from cortado import nn

    model = nn.MLP(4, 8, 2)
    loss = ct.mean(model(ct.var("x", (3, 4))) ** 2)
    params = model.parameters()
    by_name = ct.grad(loss, params)
    assert list(by_name) == list(params)
    _, from_dict = optim.AdamW(1e-3).updates(params, by_name)
    _, from_list = optim.AdamW(1e-3).updates(params, ct.grad(loss, list(params.values())))
    assert [str(t) for t in from_dict.values()] == [str(t) for t in from_list.values()]
    with pytest.raises(ct.CortadoError, match="gradients given as a dict need params as a dict of the same names"):
        optim.SGD(0.1).updates(list(params.values()), by_name)


def test_a_bfloat16_parameter_is_updated_in_bfloat16():
    from cortado.exprgraph.dtypes import BFLOAT16

    w = ct.var("w", (3,), "bfloat16")
    loss = ct.sum(ct.cast(w, "float32") ** 2)
    for optimizer in (optim.AdamW(optim.warmup_cosine(1e-2, 2, 10)), optim.SGD(optim.warmup_cosine(0.1, 2, 10))):
        state, updates = optimizer.updates([w], ct.grad(loss, [w]))
        assert updates[w].dtype == BFLOAT16
        step = ct.compile([loss], inputs=[], state={w: np.ones(3, BFLOAT16), **state}, updates=updates)
        step()
        assert np.all(np.asarray(step.state["w"]).astype(np.float32) < 1)


def _accumulated(optimizer, w0, b0, data, every):
    """Our program stepping ``optimizer`` with ``accumulate=every`` over ``data``: its parameters after each call."""
    w, b = ct.var("w", w0.shape, w0.dtype), ct.var("b", b0.shape, b0.dtype)
    x, y = ct.var("x", data[0][0].shape, w0.dtype), ct.var("y", data[0][1].shape, w0.dtype)
    r = x @ ct.transpose(w) + b - y
    state, updates = optimizer.updates({"w": w, "b": b}, ct.grad(ct.mean(r * r), [w, b]), accumulate=every)
    step = ct.compile([], inputs=[x, y], state={w: w0, b: b0, **state}, updates=updates)
    after = []
    for xv, yv in data:
        step(x=xv, y=yv)
        after.append((np.array(step.state["w"]), np.array(step.state["b"])))
    return after


@pytest.mark.parametrize("case", ["sgd momentum decay", "adamw"])
def test_accumulated_gradients_step_every_kth_call_on_their_mean(case):
    """``accumulate=3`` over six micro-batches of five rows: two steps, each on the mean of three calls' gradients,
    which is the gradient of the mean loss over the three batches together; the calls between leave the parameters
    as they were."""
    optimizer, update = CASES[case]
    w0, b0, data = _problem(4)
    merged = [tuple(np.concatenate(parts) for parts in zip(*data[i:i + 3])) for i in (0, 3)]
    after = _accumulated(optimizer, w0, b0, data, every=3)
    for call in (0, 1, 3, 4):
        kept = after[call - 1] if call else (w0, b0)
        assert all(np.array_equal(a, k) for a, k in zip(after[call], kept))
    for steps, call in ((1, 2), (2, 5)):
        expected = _reference(update, w0, b0, merged[:steps])
        np.testing.assert_allclose(after[call][0], expected[0], rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(after[call][1], expected[1], rtol=2e-5, atol=2e-6)


def test_accumulate_is_a_whole_number_of_calls():
    w = ct.var("w", (2,))
    with pytest.raises(ct.CortadoError, match="accumulate is a whole number of at least 1, not 0"):
        optim.SGD(0.1).updates([w], ct.grad(ct.sum(w * w), [w]), accumulate=0)


@needs_torch
def test_accumulated_gradients_against_pytorchs_accumulation():
    """PyTorch's idiom: each micro-batch's loss divided by k, backward into the gradients, a step and zero_grad every
    k-th micro-batch."""
    import torch

    w0, b0, data = _problem(5)
    w, b = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    optimizer = torch.optim.AdamW([w, b], lr=1e-2, betas=(0.8, 0.99))
    for i, (x, y) in enumerate(data):
        loss = ((torch.from_numpy(x) @ w.T + b - torch.from_numpy(y)) ** 2).mean() / 2
        loss.backward()
        if i % 2 == 1:
            optimizer.step()
            optimizer.zero_grad()
    ours = _accumulated(CASES["adamw"][0], w0, b0, data, every=2)[-1]
    np.testing.assert_allclose(ours[0], w.detach().numpy(), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(ours[1], b.detach().numpy(), rtol=2e-5, atol=2e-6)


def _scaled(optimizer, scaler, w0, b0, data, dtype="float32", backend="numpy"):
    """Our steps with ``scaler``: the parameters, the scale and its count after each call."""
    w, b = ct.var("w", w0.shape, dtype), ct.var("b", b0.shape, dtype)
    x, y = ct.var("x", data[0][0].shape, dtype), ct.var("y", data[0][1].shape, dtype)
    r = x @ ct.transpose(w) + b - y
    loss = ct.mean(r * r)
    state, updates = optimizer.updates({"w": w, "b": b}, ct.grad(scaler.scale(loss), {"w": w, "b": b}), scaler=scaler)
    step = ct.compile([loss], inputs=[x, y], state={w: w0.astype(dtype), b: b0.astype(dtype), **state},
                      updates=updates, backend=backend)
    after = []
    for xv, yv in data:
        step(x=xv.astype(dtype), y=yv.astype(dtype))
        after.append((np.array(host(step.state["w"])), np.array(host(step.state["b"])), float(step.state["scaler.scale"]),
                      int(step.state["scaler.growth_tracker"])))
    return after


def test_a_grad_scaler_skips_the_steps_whose_gradients_overflow_and_lowers_its_scale():
    """A scale near float32's largest overflows the gradients of some steps: those leave the parameters and Adam's
    moments and count as they were, halve the scale and start its count of good steps again; the others are the
    steps taken without a scale, on their batches alone (a power of two divides exactly)."""
    w0, b0, data = _problem(7)
    after = _scaled(optim.Adam(1e-2), optim.GradScaler(init_scale=2.0 ** 128 - 2.0 ** 104, growth_interval=100),
                    w0, b0, data)
    scale, w, good = 2.0 ** 128 - 2.0 ** 104, w0, 0
    applied = []
    for i, (w_after, _, scale_after, count) in enumerate(after):
        if count == 0:  # skipped: nothing moved but the scale, halved, and the count of good steps, back to 0
            np.testing.assert_array_equal(w_after, w)
            assert scale_after == np.float32(scale / 2)
            good = 0
        else:
            applied.append(i)
            good += 1
            assert scale_after == np.float32(scale) and count == good
        scale, w = scale_after, w_after
    assert 0 < len(applied) < len(data), applied
    unscaled = _ours(optim.Adam(1e-2), w0, b0, [data[i] for i in applied])  # (another program: its own rounding)
    np.testing.assert_allclose(after[-1][0], unscaled[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(after[-1][1], unscaled[1], rtol=1e-6, atol=1e-7)


def test_a_grad_scaler_grows_its_scale_after_growth_interval_good_steps():
    w0, b0, data = _problem(9)
    after = _scaled(optim.SGD(0.05), optim.GradScaler(init_scale=1.0, growth_factor=4.0, growth_interval=2), w0, b0,
                    data)
    assert [(scale, count) for _, _, scale, count in after][:4] == [(1.0, 1), (4.0, 0), (4.0, 1), (16.0, 0)]
    unscaled = _ours(optim.SGD(0.05), w0, b0, data)
    np.testing.assert_allclose(after[-1][0], unscaled[0], rtol=1e-6, atol=1e-7)


def test_a_grad_scaler_refuses_what_it_cannot_do():
    w = ct.var("w", (2,))
    (g,) = ct.grad(ct.sum(w * w), [w])
    with pytest.raises(ct.CortadoError, match="a GradScaler with accumulate=2 is not supported"):
        optim.SGD(0.1).updates([w], [g], accumulate=2, scaler=optim.GradScaler())
    with pytest.raises(ct.CortadoError, match="scaler is an optim.GradScaler"):
        optim.SGD(0.1).updates([w], [g], scaler=2.0)
    with pytest.raises(ct.CortadoError, match="backoff_factor is a finite number, above 0 and below 1, not 1.5"):
        optim.GradScaler(backoff_factor=1.5)
    with pytest.raises(ct.CortadoError, match="the loss is a floating term"):
        optim.GradScaler().scale(ct.var("n", (), "int32"))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
def test_on_the_gpu_a_grad_scaler_skips_and_scales_as_on_the_cpu():
    w0, b0, data = _problem(7)
    cpu, gpu = (_scaled(optim.AdamW(1e-2), optim.GradScaler(init_scale=2.0 ** 128 - 2.0 ** 104, growth_interval=2),
                        w0, b0, data, backend=backend) for backend in ("numpy", "cupy"))
    assert [(scale, count) for *_, scale, count in gpu] == [(scale, count) for *_, scale, count in cpu]
    assert any(count == 0 for *_, count in cpu) and any(count > 0 for *_, count in cpu)
    for ours, theirs in zip(gpu, cpu):
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("name", ["sgd nesterov", "adamw"])
def test_a_grad_scaler_against_pytorchs(name):
    """torch.amp.GradScaler on the CPU, from a scale that overflows the first steps' gradients: the same steps
    skipped, the same scales and counts, the same parameters to float32's rounding."""
    import torch

    w0, b0, data = _problem(8)
    w, b = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    make = {"sgd nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
            "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.8, 0.99))}[name]
    optimizer = make([w, b])
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 126, growth_interval=3)
    theirs = []
    for x, y in data:
        optimizer.zero_grad()
        loss = ((torch.from_numpy(x) @ w.T + b - torch.from_numpy(y)) ** 2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        theirs.append((w.detach().numpy().copy(), b.detach().numpy().copy(), scaler.get_scale(),
                       int(scaler._growth_tracker.item())))
    ours = _scaled(CASES[name][0], optim.GradScaler(init_scale=2.0 ** 126, growth_interval=3), w0, b0, data)
    for (ow, ob, oscale, otrack), (tw, tb, tscale, ttrack) in zip(ours, theirs):
        assert (oscale, otrack) == (tscale, ttrack)
        np.testing.assert_allclose(ow, tw, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(ob, tb, rtol=2e-5, atol=2e-6)
