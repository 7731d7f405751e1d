"""Optimizers and learning-rate schedules as update expressions of the step's state, so an optimizer step is part of
the one compiled training step (and, on the GPU, of its one CUDA graph).

    params = model.parameters()
    gradients = ct.grad(loss, list(params.values()))
    optimizer = optim.AdamW(lr=optim.warmup_cosine(3e-3, warmup=100, total=2000), weight_decay=0.1)
    state, updates = optimizer.updates(params, gradients)
    step = ct.compile([loss], inputs=[x, y], state={**model.initial_values(), **state}, updates=updates)

``updates`` returns the optimizer's state (moments, a step count) with its first values, and the new value of every
parameter and state variable as an expression. The formulas are PyTorch's (``torch.optim``), step for step, with
the step count starting at 1 on the first call. A schedule is any Python function of the step number, tabulated
when the step is built and read by the step at its count, so cosine decay costs one gather.
"""

import math
from collections.abc import Iterable, Mapping

import numpy as np

from .errors import CortadoError
from .settings import real, whole
from .exprgraph import constructors as ct
from .exprgraph.dtypes import is_float
from .exprgraph.term import Term
from .grad import gradients_made_from


class Optimizer:
    """What every optimizer shares: the learning rate (a number or a schedule), weight decay and which parameters it
    decays (``decay(name, variable)``; by default every one, as PyTorch), the step count in state, and gradient
    clipping by global norm (``clip_norm``)."""

    def __new__(cls, *args, **kwargs):
        """Refuses the parameters where the settings go, as ``torch.optim.SGD(model.parameters(), lr=0.1)`` takes them,
        before Python binds them to ``lr`` (or refuses ``lr`` given twice)."""
        if args and isinstance(args[0], Mapping | Iterable) and not isinstance(args[0], str | np.ndarray | Term):
            raise CortadoError(f"{cls.__name__} is built from its settings ({cls.__name__}(lr=...)); the parameters "
                               f"and their gradients go to its updates: "
                               f"{cls.__name__}(...).updates(model.parameters(), gradients)")
        return super().__new__(cls)

    def __init__(self, lr, weight_decay=0.0, decay=None, clip_norm=None, name="optim"):
        kind = type(self).__name__
        if not isinstance(lr, Schedule):
            if callable(lr):
                raise CortadoError("a learning rate is a number or a Schedule (optim.schedule(function, steps)), not "
                                   "a plain function")
            if isinstance(lr, Term):
                raise CortadoError(f"{kind}: lr is a number or a Schedule (optim.schedule(function, steps)), fixed when "
                                   f"the step is compiled, not a term")
            lr = real(kind, "lr", lr, 0)
        weight_decay = real(kind, "weight_decay", weight_decay, 0)
        if decay is not None and not callable(decay):
            raise CortadoError(f"{kind}: decay is a function (name, variable) -> bool saying which parameters decay, "
                               f"not {decay!r}")
        if clip_norm is not None:
            clip_norm = real(kind, "clip_norm", clip_norm, 0, above=True)
        self.lr, self.weight_decay, self.decay, self.clip_norm, self.name = lr, weight_decay, decay, clip_norm, name

    def updates(self, params, gradients, accumulate=1, scaler=None):
        """``(state, updates)``: the optimizer's state variables with their first values, and the new value of each
        parameter (``params``: ``{name: variable}`` or a list of variables) and state variable, given the
        parameters' ``gradients`` in the same order, or as ``ct.grad(loss, params)`` gives them for a dict: a dict
        with the same names. With ``accumulate=k``, a step adds its gradients to sums kept in state and steps the
        parameters every ``k``-th call only, on the mean of the ``k`` calls' gradients (PyTorch's gradient
        accumulation, each micro-batch's loss divided by ``k``); the other calls leave the parameters and the
        optimizer's state as they were. With a ``scaler`` (``GradScaler``), the gradients are those of
        ``scaler.scale(loss)``: they are divided by the scale, and a step whose gradients hold an infinity or NaN
        leaves the parameters and the optimizer's state as they were and lowers the scale (PyTorch's
        ``GradScaler.step`` and ``update``); the scaler's state joins the optimizer's."""
        accumulate = whole(type(self).__name__, "accumulate", accumulate, 1)
        if scaler is not None and not isinstance(scaler, GradScaler):
            raise CortadoError(f"{type(self).__name__}: scaler is an optim.GradScaler, not {scaler!r}")
        if scaler is not None and accumulate > 1:
            raise CortadoError(f"{type(self).__name__}: a GradScaler with accumulate={accumulate} is not supported: "
                               f"the check for infinite gradients would have to see every call's")
        if isinstance(gradients, Mapping):
            if not isinstance(params, Mapping) or set(gradients) != set(params):
                raise CortadoError(f"{type(self).__name__}: gradients given as a dict need params as a dict of the same "
                                   f"names (ct.grad(loss, params) gives them so); else give both as lists in one order")
            gradients = [gradients[name] for name in params]
        params = list(params.values()) if isinstance(params, Mapping) else list(params)
        gradients = list(gradients)
        if len(params) != len(gradients):
            raise CortadoError(f"{type(self).__name__}: {len(params)} parameters and {len(gradients)} gradients")
        made_from = {}
        for p, g in zip(params, gradients):
            if not isinstance(p, Term) or p.op.name != "var":
                raise CortadoError(f"{type(self).__name__}: the parameters are variables (a model's parameters(), or "
                                   f"ct.var), not {p!r}")
            if not isinstance(g, Term):
                raise CortadoError(f"{type(self).__name__}: the gradient of {p.name!r} is {g!r}, not a term "
                                   f"(ct.grad gives them)")
            if p.shape != g.shape:
                raise CortadoError(f"{type(self).__name__}: the gradient of {p.name!r} has shape {g.shape}, not "
                                   f"{p.shape}")
            of = gradients_made_from(g, made_from)
            if of and p not in of:  # two layers of one shape would train on each other's gradients
                raise CortadoError(f"{type(self).__name__}: the gradient given for {p.name!r} is made from ct.grad's "
                                   f"of {', '.join(sorted(repr(v.name) for v in of))}: are the gradients in the "
                                   f"parameters' order? (ct.grad(loss, params) gives them so)")
        state, updates = {}, {}
        if accumulate > 1:
            gradients, applied, state, updates = self._accumulated(params, gradients, accumulate)
        if scaler is not None:
            gradients, finite, scaler_state, scaler_updates = scaler.unscaled(gradients)
            state, updates = {**state, **scaler_state}, {**updates, **scaler_updates}
        count = _state_variable(f"{self.name}.step", (), "int32")
        step = count + 1
        state[count], stepped = np.zeros((), np.int32), {count: step}
        if self.clip_norm is not None:
            gradients = clip_grad_norm(gradients, self.clip_norm)
        lr = _rate(self.lr, step)
        for p, g in zip(params, gradients):
            decayed = self.decays(p)
            rate = ct.cast(lr, p.dtype) if isinstance(lr, Term) and lr.dtype != p.dtype else lr
            for var, (first, new) in self._parameter(p, g, rate, step, decayed).items():
                stepped[var] = new if new.dtype == var.dtype else ct.cast(new, var.dtype)  # a bfloat16 parameter's
                if first is not None:
                    state[var] = first
        if accumulate > 1:  # the parameters and the optimizer's state move on the last call of each k only
            stepped = {var: ct.where(applied, new, var) for var, new in stepped.items()}
        if scaler is not None:  # and only where every gradient was finite
            stepped = {var: ct.where(finite, new, var) for var, new in stepped.items()}
        return state, {**updates, **stepped}

    def _accumulated(self, params, gradients, every):
        """``(means, applied, state, updates)``: the mean of the gradients of the last ``every`` calls, whether this
        call is the last of them, and the state variables that make them (with their first values and updates):
        each parameter's gradients summed in one (in float32 for a narrower float), the calls counted in another,
        both set back to zero on the last call."""
        phase = _state_variable(f"{self.name}.phase", (), "int32")
        applied = ct.equal(phase, every - 1)
        state, updates = {phase: np.zeros((), np.int32)}, {phase: ct.where(applied, 0, phase + 1)}
        means = []
        for p, g in zip(params, gradients):
            kept = np.dtype(np.float32) if is_float(g.dtype) and g.dtype.itemsize < 4 else g.dtype
            total_var = _state_variable(f"{self.name}.sum.{p.name}", p.shape, kept)
            total = total_var + (g if g.dtype == kept else ct.cast(g, kept))
            state[total_var], updates[total_var] = np.zeros(p.shape, kept), ct.where(applied, 0, total)
            mean = total * (1.0 / every)
            means.append(mean if mean.dtype == g.dtype else ct.cast(mean, g.dtype))
        return means, applied, state, updates

    def decays(self, p):
        """Whether the parameter ``p`` (its variable) is decayed: ``weight_decay`` is not 0 and ``decay`` says so."""
        return bool(self.weight_decay) and (self.decay is None or bool(self.decay(p.name, p)))

    def _moment(self, p, kind):
        """A state variable of ``p``'s shape (a moment, a momentum buffer), zero at first."""
        var = _state_variable(f"{self.name}.{kind}.{p.name}", p.shape, p.dtype)
        return var, np.zeros(p.shape, p.dtype)


class SGD(Optimizer):
    """PyTorch's SGD: ``g + weight_decay * p``; with ``momentum``, ``b = momentum * b + (1 - dampening) * g`` (``b = g``
    on the first step) and ``g = b``, or with ``nesterov`` ``g + momentum * b``; then ``p - lr * g``."""

    def __init__(self, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, decay=None, clip_norm=None,
                 name="sgd"):
        super().__init__(lr, weight_decay, decay, clip_norm, name)
        kind = type(self).__name__
        momentum, dampening = real(kind, "momentum", momentum, 0), real(kind, "dampening", dampening)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise CortadoError("SGD: Nesterov momentum needs a momentum above 0 and no dampening")
        self.momentum, self.dampening, self.nesterov = momentum, dampening, nesterov

    def _parameter(self, p, g, lr, step, decayed):
        if decayed:
            g = g + self.weight_decay * p
        if not self.momentum:
            return {p: (None, p - lr * g)}
        buffer, first = self._moment(p, "momentum")
        later = self.momentum * buffer + (1 - self.dampening) * g
        new_buffer = ct.where(ct.equal(step, 1), g, later) if self.dampening else later  # zero at first: later is g then
        direction = g + self.momentum * new_buffer if self.nesterov else new_buffer
        return {buffer: (first, new_buffer), p: (None, p - lr * direction)}


class Adam(Optimizer):
    """PyTorch's Adam: moments ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``, then
    ``p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``; ``weight_decay`` adds ``weight_decay * p`` to the
    gradient (L2), as PyTorch's Adam does."""

    decoupled = False

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decay=None, clip_norm=None,
                 name="adam"):
        super().__init__(lr, weight_decay, decay, clip_norm, name)
        kind = type(self).__name__
        if np.ndim(betas) != 1 or len(betas) != 2:
            raise CortadoError(f"{kind}: betas is a pair of numbers in [0, 1), not {betas!r}")
        betas = tuple(real(kind, f"betas[{i}]", b, 0, 1, below=True) for i, b in enumerate(betas))
        self.betas, self.eps = betas, real(kind, "eps", eps, 0)

    def _parameter(self, p, g, lr, step, decayed):
        b1, b2 = self.betas
        if decayed and self.decoupled:
            p_start = p * (1 - lr * self.weight_decay)
        else:
            p_start = p
            if decayed:
                g = g + self.weight_decay * p
        (m, m_first), (v, v_first) = self._moment(p, "m"), self._moment(p, "v")
        m_new = b1 * m + (1 - b1) * g
        v_new = b2 * v + (1 - b2) * (g * g)
        t = ct.cast(step, "float64")  # as PyTorch's Python floats: float32's 0.999 is 1.3e-5 off in 1 - 0.999^t
        m_hat = m_new / ct.cast(1 - b1 ** t, m_new.dtype)
        v_hat = v_new / ct.cast(1 - b2 ** t, v_new.dtype)
        return {m: (m_first, m_new), v: (v_first, v_new), p: (None, p_start - lr * m_hat / (ct.sqrt(v_hat) + self.eps))}


class AdamW(Adam):
    """PyTorch's AdamW: Adam with the weight decay taken from the parameter itself, ``p * (1 - lr * weight_decay)``,
    before the step (default ``weight_decay=0.01``)."""

    decoupled = True

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, decay=None, clip_norm=None,
                 name="adamw"):
        super().__init__(lr, betas, eps, weight_decay, decay, clip_norm, name)


class GradScaler:
    """PyTorch's ``torch.amp.GradScaler``, for float16 training, whose small gradients underflow: the loss is
    multiplied by a scale (``scale(loss)``) before ``ct.grad``, and ``optimizer.updates(..., scaler=scaler)``
    divides the gradients by it. A step whose scaled gradients hold an infinity or NaN is skipped (the parameters
    and the optimizer's state stay) and the scale is multiplied by ``backoff_factor``; after ``growth_interval``
    steps in a row that were not, by ``growth_factor`` (where the result is finite). The scale (float32) and the
    count of good steps are state variables ``<name>.scale`` and ``<name>.growth_tracker``."""

    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 name="scaler"):
        kind = type(self).__name__
        self.init_scale = real(kind, "init_scale", init_scale, 0, float(np.finfo(np.float32).max), above=True)
        self.growth_factor = real(kind, "growth_factor", growth_factor, 1, above=True)
        self.backoff_factor = real(kind, "backoff_factor", backoff_factor, 0, 1, above=True, below=True)
        self.growth_interval = whole(kind, "growth_interval", growth_interval, 1)
        self.variable = _state_variable(f"{name}.scale", (), "float32")
        self.tracker = _state_variable(f"{name}.growth_tracker", (), "int32")

    def scale(self, loss):
        """``loss`` times the scale, in the loss's dtype (as PyTorch's scalar tensor multiplies it)."""
        if not isinstance(loss, Term) or not is_float(loss.dtype):
            raise CortadoError(f"GradScaler.scale: the loss is a floating term, not {loss!r}")
        return loss * (self.variable if loss.dtype == self.variable.dtype else ct.cast(self.variable, loss.dtype))

    def unscaled(self, gradients):
        """``(gradients divided by the scale, whether every one is finite, state, updates)``: the check made on the
        scaled gradients, the division by the scale's reciprocal (computed in float64, then float32), as PyTorch's
        ``unscale_``; the state and updates of the scale and its count of good steps."""
        wide = np.dtype(np.float32)
        bad = [ct.sum(ct.where(ct.abs(g) <= float(np.finfo(g.dtype).max), 0.0, 1.0)) for g in gradients]
        finite = ct.equal(sum(bad[1:], bad[0]), 0.0)
        inverse = ct.cast(1.0 / ct.cast(self.variable, "float64"), wide)
        gradients = [g * (inverse if g.dtype == wide else ct.cast(inverse, g.dtype)) for g in gradients]
        good = self.tracker + 1
        grown = ct.cast(ct.cast(self.variable, "float64") * self.growth_factor, wide)
        grows = ct.logical_and(good >= self.growth_interval, ct.abs(grown) <= float(np.finfo(wide).max))
        lowered = ct.cast(ct.cast(self.variable, "float64") * self.backoff_factor, wide)
        state = {self.variable: np.float32(self.init_scale), self.tracker: np.zeros((), np.int32)}
        updates = {self.variable: ct.where(finite, ct.where(grows, grown, self.variable), lowered),
                   self.tracker: ct.where(finite, ct.where(good >= self.growth_interval, 0, good), 0)}
        return gradients, finite, state, updates


def clip_grad_norm(gradients, max_norm, eps=1e-6):
    """The gradients scaled by ``min(1, max_norm / (norm + eps))``, ``norm`` the 2-norm of all of them together
    (computed in float32 at least), as ``torch.nn.utils.clip_grad_norm_`` scales them."""
    gradients = list(gradients)
    squares = [ct.sum(ct.cast(g, "float32") * ct.cast(g, "float32")) if g.dtype.itemsize < 4 else ct.sum(g * g)
               for g in gradients]
    total = sum(squares[1:], squares[0])  # added left to right
    factor = ct.minimum(max_norm / (ct.sqrt(total) + eps), 1.0)
    return [g * ct.cast(factor, g.dtype) for g in gradients]


class Schedule:
    """A learning rate for each step: ``function(step)`` (a Python number; the first step is 1) tabulated for
    ``steps`` steps in float64 (each parameter's step reads it in its own dtype), the last value kept after them."""

    def __init__(self, function, steps):
        steps = whole("a schedule", "steps", steps, 1)
        if not callable(function):
            raise CortadoError(f"a schedule's rate is a function of the step number, not {function!r}")
        self.function, self.steps = function, int(steps)
        self.table = np.array([function(t) for t in range(1, self.steps + 1)], np.float64)

    def __call__(self, t):
        """The rate of step ``t`` (a number): as the compiled step reads it."""
        return float(self.table[min(max(int(t), 1), self.steps) - 1])

    def at(self, step):
        """The rate at ``step`` (an int32 term counting from 1), read from the table."""
        index = ct.minimum(step, self.steps) - 1
        return ct.take(ct.const(self.table), index, axis=0)


def _rate(lr, step):
    return lr.at(step) if isinstance(lr, Schedule) else lr


def schedule(function, steps):
    """Any learning-rate function of the step number (from 1) as a ``Schedule`` of ``steps`` steps."""
    return Schedule(function, steps)


def lambda_lr(lr, factor, total):
    """PyTorch's ``LambdaLR``: ``lr * factor(epoch)`` where PyTorch's ``epoch`` counts the steps taken before, from
    0 (``scheduler.step()`` after each ``optimizer.step()``), so step ``t`` here (from 1) reads ``factor(t - 1)``;
    tabulated for the ``total`` steps of the run (the last value kept after them)."""
    if not callable(factor):
        raise CortadoError(f"lambda_lr: factor is a function of PyTorch's epoch count (from 0), not {factor!r}")
    return Schedule(lambda t: lr * factor(t - 1), total)


def warmup_cosine(peak, warmup, total, floor=0.0):
    """A linear rise from ``peak / warmup`` to ``peak`` over ``warmup`` steps, then a cosine decay to ``floor`` at step
    ``total`` (as GPT training runs use)."""
    def rate(t):
        if t <= warmup:
            return peak * t / max(warmup, 1)
        progress = min((t - warmup) / max(total - warmup, 1), 1.0)
        return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))

    return Schedule(rate, total)


def step_decay(lr, every, gamma=0.1, total=None):
    """PyTorch's ``StepLR``: ``lr * gamma ** ((t - 1) // every)`` for step ``t`` (from 1), tabulated for the ``total``
    steps of the run (the last value kept after them)."""
    if total is None:
        raise CortadoError("step_decay needs the run's total steps (total=...), the length of its table")
    every = whole("step_decay", "every", every, 1)
    return Schedule(lambda t: lr * gamma ** ((t - 1) // every), total)


def _state_variable(name, shape, dtype):
    """A variable of an optimizer's state (``name`` under the optimizer's own), marked as cortado.optim's for the error
    of two of one name."""
    var = ct.var(name, shape, dtype)
    var.attr("declaration").maker = "cortado.optim"
    return var
