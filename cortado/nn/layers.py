"""Layers as PyTorch names and initialises them, each computing the plain expression a user would write: a linear
layer is ``x @ W^T + b`` (``W`` stored ``(out, in)``, as PyTorch stores it, so a state_dict loads by name), a layer
norm ``(x - mean) / sqrt(var + eps) * weight + bias``."""

import math

import numpy as np

from ..errors import CortadoError, ShapeError
from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import BFLOAT16, as_dtype, finfo
from ..exprgraph.fingerprint import fingerprint
from ..exprgraph.scaling import pushed, scale_for
from ..exprgraph.term import describe_operands
from . import init
from ..settings import real, whole
from .module import (Buffer, FromGradient, Function, Module, Parameter, Sequential, gathered_from_zero, product_input,
                     size, term)


class Linear(Module):
    """``x @ weight^T + bias``: ``weight`` ``(out_features, in_features)`` and ``bias`` ``(out_features,)``, both
    ``U(-1/sqrt(in), 1/sqrt(in))`` unless ``weight_init``/``bias_init`` say otherwise.

    With ``float8=True`` the product is taken in float8, as Transformer Engine takes it: the input and the weight
    each scaled by a power of two and cast to float8_e4m3fn, multiplied (summed in float32), scaled back and rounded
    to the input's dtype, and the product's gradient rounded to float8_e5m2 on its way back (``ct.float8_gradient``),
    so that the gradients of the input and the weight are float8 products too. The input's and the weight's scales
    are delayed: each comes from the largest magnitudes of the last ``history`` steps (buffers ``input_amax`` and
    ``weight_amax``, which the step updates: ``Module.state_updates``), so each is cast in the pass that makes it.
    The gradient's comes from its own largest magnitude (``gradient_scaling="current"``: never saturating, for a
    second pass over it), or, with ``gradient_scaling="delayed"``, from a history too (buffer ``gradient_amax``,
    recorded from the loss's gradient), cast in one pass, saturating beyond its history's range. On the GPU, a
    bfloat16 model's product runs on the float8 tensor cores (``backends/cupy/lowering/float8.py``)."""

    def __init__(self, in_features, out_features, bias=True, weight_init=None, bias_init=None, dtype="float32",
                 float8=False, history=16, gradient_scaling="current"):
        super().__init__()
        in_features, out_features = size("Linear", "in_features", in_features), size("Linear", "out_features",
                                                                                       out_features)
        default = init.fan_in_uniform(in_features)
        self.weight = Parameter((out_features, in_features), default if weight_init is None else weight_init, dtype)
        if bias:
            self.bias = Parameter((out_features,), default if bias_init is None else bias_init, dtype)
        if float8:
            history = whole("Linear(float8=True)", "history, the steps whose amax it keeps,", history, 1, ShapeError)
            self.input_amax = Buffer((history,), init.zeros, "float32", ours=True)
            self.weight_amax = Buffer((history,), init.zeros, "float32", ours=True)
            if gradient_scaling not in ("delayed", "current"):
                raise CortadoError(f"Linear(float8=True) scales its gradient 'delayed' or 'current', not "
                                   f"{gradient_scaling!r}")
            if gradient_scaling == "delayed":
                self.gradient_amax = Buffer((history,), init.zeros, "float32", ours=True)
        self.in_features, self.out_features, self.has_bias, self.float8 = in_features, out_features, bias, float8

    def forward(self, x):
        x = x if self.float8 else product_input(f"nn.Linear({self.in_features}, {self.out_features})", x, self.weight)
        if term("Linear", x).shape[-1:] != (self.in_features,):
            raise ShapeError(f"Linear({self.in_features}, {self.out_features}) takes inputs whose last axis has "
                             f"{self.in_features} features, not {x.shape}")
        y = self._float8_product(x) if self.float8 else x @ ct.transpose(self.weight)
        return y + self.bias if self.has_bias else y

    def _float8_product(self, x):
        """``x @ weight^T`` in float8 (see the class), rounded to ``x``'s dtype; in training, the new amax
        histories recorded."""
        wide_x, wide_w = ct.cast(x, "float32"), ct.cast(self.weight, "float32")
        x_scale = scale_for(ct.max(self.input_amax), FLOAT8_FORWARD)
        w_scale = scale_for(ct.max(self.weight_amax), FLOAT8_FORWARD)
        x8 = ct.cast(wide_x * x_scale, FLOAT8_FORWARD)
        w8 = ct.cast(wide_w * w_scale, FLOAT8_FORWARD)
        gradient_amax = getattr(self, "gradient_amax", None)
        product = ct.float8_gradient(x8 @ ct.transpose(w8), FLOAT8_BACKWARD, history=gradient_amax)
        y = ct.cast(product * (1 / (x_scale * w_scale)), x.dtype)
        if self.training:
            updates = {self.input_amax: pushed(self.input_amax, ct.max(ct.abs(wide_x))),
                       self.weight_amax: pushed(self.weight_amax, ct.max(ct.abs(wide_w)))}
            if gradient_amax is not None:
                updates[gradient_amax] = FromGradient()
            self._record(y, updates, "its amax histories stay at their first values")
        return y


FLOAT8_FORWARD, FLOAT8_BACKWARD = "float8_e4m3fn", "float8_e5m2"  # the usual choice: more digits, more range


class Embedding(Module):
    """The rows of ``weight`` ``(num_embeddings, embedding_dim)``, ``N(0, 1)`` as PyTorch's, at integer indices in
    ``[0, num_embeddings)``: one outside, a negative one too, is an error on the CPU; the GPU clamps it into them."""

    def __init__(self, num_embeddings, embedding_dim, weight_init=None, dtype="float32"):
        super().__init__()
        shape = size("Embedding", "num_embeddings", num_embeddings), size("Embedding", "embedding_dim", embedding_dim)
        self.weight = Parameter(shape, init.normal(1.0) if weight_init is None else weight_init, dtype)

    def forward(self, indices):
        indices = term("Embedding", indices)
        call = f"nn.Embedding({self.weight.shape[0]}, {self.weight.shape[1]})({describe_operands((indices,))})"
        return gathered_from_zero(call, ct.take, self.weight, indices, 0)


def _over_root(x, mean_square, eps):
    """``x / sqrt(mean_square + eps)`` computed as PyTorch's norms compute it: ``x`` times one reciprocal a row (or a
    channel). An element divided instead costs a division an element forward and more in the gradient, which made
    a GPT's layer norm kernels compute-bound on the GPU (the float8 step 2.6% slower)."""
    return x * (1 / ct.sqrt(mean_square + eps))


class LayerNorm(Module):
    """Each row of the last axis centred and scaled to unit variance (biased, as PyTorch's), then ``* weight +
    bias`` (ones and zeros)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, dtype="float32"):
        super().__init__()
        self.size, self.eps, self.affine, self.has_bias = _last_size("LayerNorm", normalized_shape), \
            real("LayerNorm", "eps", eps, 0), elementwise_affine, bias
        if elementwise_affine:
            self.weight = Parameter((self.size,), init.ones, dtype)
            if bias:
                self.bias = Parameter((self.size,), init.zeros, dtype)

    def forward(self, x):
        _last_axis("LayerNorm", self.size, x)
        wide = _in_float32(x)
        mean = ct.mean(wide, axis=-1, keepdims=True)
        centered = wide - mean
        variance = ct.mean(centered * centered, axis=-1, keepdims=True)
        y = ct.cast(_over_root(centered, variance, self.eps), x.dtype)
        if self.affine:
            y = y * self.weight + self.bias if self.has_bias else y * self.weight
        return y


class RMSNorm(Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (LLaMA's); ``eps`` by default the machine epsilon
    of ``x``'s dtype, as PyTorch's ``RMSNorm``."""

    def __init__(self, normalized_shape, eps=None, dtype="float32"):
        super().__init__()
        self.size, self.eps = _last_size("RMSNorm", normalized_shape), None if eps is None else real("RMSNorm", "eps",
                                                                                                    eps, 0)
        self.weight = Parameter((self.size,), init.ones, dtype)

    def forward(self, x):
        _last_axis("RMSNorm", self.size, x)
        wide = _in_float32(x)
        eps = self.eps if self.eps is not None else float(finfo(wide.dtype).eps)
        return ct.cast(_over_root(wide, ct.mean(wide * wide, axis=-1, keepdims=True), eps), x.dtype) * self.weight


class Conv2d(Module):
    """PyTorch's ``Conv2d``: ``weight`` ``(out, in / groups, kH, kW)``, ``bias`` ``(out,)``, both
    ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with ``fan_in = in / groups * kH * kW``; NCHW images."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 dtype="float32"):
        super().__init__()
        kernel = (kernel_size, kernel_size) if np.ndim(kernel_size) == 0 else tuple(kernel_size)
        in_channels, out_channels = size("Conv2d", "in_channels", in_channels), size("Conv2d", "out_channels",
                                                                                      out_channels)
        kernel, groups = tuple(size("Conv2d", "kernel_size", k) for k in kernel), size("Conv2d", "groups", groups)
        if len(kernel) != 2:
            raise ShapeError(f"Conv2d: kernel_size is one size or two, not {kernel_size!r}")
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"Conv2d: {groups} groups must divide the {in_channels} input and {out_channels} output "
                             f"channels")
        default = init.fan_in_uniform(in_channels // groups * math.prod(kernel))
        self.weight = Parameter((out_channels, in_channels // groups, *kernel), default, dtype)
        if bias:
            self.bias = Parameter((out_channels,), default, dtype)
        self.stride, self.padding, self.dilation, self.groups, self.has_bias = stride, padding, dilation, groups, bias

    def forward(self, x):
        weight = self.weight
        x = product_input(f"nn.Conv2d({weight.shape[1] * self.groups}, {weight.shape[0]})", x, weight)
        y = ct.conv2d(x, weight, self.stride, self.padding, self.dilation, self.groups)
        return y + ct.reshape(self.bias, (self.bias.shape[0], 1, 1)) if self.has_bias else y


class BatchNorm(Module):
    """PyTorch's ``BatchNorm1d``/``BatchNorm2d`` over axis 1 (the channels) of ``(N, C)`` or ``(N, C, ...)`` inputs. In
    training, each channel is normalised by the batch's mean and (biased) variance, then ``* weight + bias``, and
    the step updates the running statistics, ``(1 - momentum) * running + momentum * batch`` (the variance's
    unbiased; kept in float64 for a float64 layer, else in float32), and counts the batches
    (``Module.state_updates`` gives those updates); in inference (``eval()``), it is normalised by the running
    statistics. A float16 or bfloat16 input is normalised in float32 (its statistics too, as PyTorch takes them),
    then rounded to its dtype for the affine step."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, dtype="float32"):
        super().__init__()
        self.size, self.eps = size("BatchNorm", "num_features", num_features), real("BatchNorm", "eps", eps, 0)
        self.momentum, self.affine = real("BatchNorm", "momentum", momentum, 0, 1), affine
        if affine:
            self.weight = Parameter((self.size,), init.ones, dtype)
            self.bias = Parameter((self.size,), init.zeros, dtype)
        statistics = "float64" if as_dtype(dtype) == np.float64 else "float32"  # float32 for half precision too
        self.running_mean = Buffer((self.size,), init.zeros, statistics)
        self.running_var = Buffer((self.size,), init.ones, statistics)
        self.num_batches_tracked = Buffer((), init.zeros, "int32")

    RANKS, LAYOUT = None, "(N, {}, ...)"  # the ranks of input a subclass takes (PyTorch's BatchNorm1d, 2d), or any

    def forward(self, x):
        rank = term("BatchNorm", x).ndim
        if rank < 2 or x.shape[1] != self.size or (self.RANKS and rank not in self.RANKS):
            raise ShapeError(f"{type(self).__name__}({self.size}) normalises axis 1 of {self.LAYOUT.format(self.size)} "
                             f"inputs, not {x.shape}")
        axes = (0,) + tuple(range(2, x.ndim))
        channels = (1, self.size) + (1,) * (x.ndim - 2)
        wide = _in_float32(x)  # a float16 value 256 from its mean squares past float16's range: statistics in float32
        if self.training:
            count = x.size // self.size
            if count < 2:
                raise ShapeError(f"BatchNorm in training needs more than one value a channel, not {x.shape}")
            mean = ct.mean(wide, axis=axes, keepdims=True)
            centered = wide - mean
            variance = ct.mean(centered * centered, axis=axes, keepdims=True)
            y = ct.cast(_over_root(centered, variance, self.eps), x.dtype)
        else:
            mean = ct.reshape(ct.cast(self.running_mean, wide.dtype), channels)
            variance = ct.reshape(ct.cast(self.running_var, wide.dtype), channels)
            y = ct.cast(_over_root(wide - mean, variance, self.eps), x.dtype)
        if self.affine:
            y = y * ct.reshape(self.weight, channels) + ct.reshape(self.bias, channels)
        if self.training:
            m = self.momentum
            kept = self.running_mean.dtype
            batch_mean = ct.cast(ct.reshape(mean, (self.size,)), kept)
            batch_variance = ct.cast(ct.reshape(variance, (self.size,)), kept) * (count / (count - 1))
            self._record(y, {self.running_mean: (1 - m) * self.running_mean + m * batch_mean,
                             self.running_var: (1 - m) * self.running_var + m * batch_variance,
                             self.num_batches_tracked: self.num_batches_tracked + 1},
                         "its running statistics stay at their first values")
        return y


class BatchNorm1d(BatchNorm):
    """PyTorch's ``BatchNorm1d``: ``BatchNorm`` of ``(N, C)`` or ``(N, C, L)`` inputs."""

    RANKS, LAYOUT = (2, 3), "(N, {0}) or (N, {0}, L)"


class BatchNorm2d(BatchNorm):
    """PyTorch's ``BatchNorm2d``: ``BatchNorm`` of ``(N, C, H, W)`` images."""

    RANKS, LAYOUT = (4,), "(N, {}, H, W)"


class Dropout(Module):
    """PyTorch's ``Dropout``: in training each element is zeroed with probability ``p`` and the others scaled by
    ``1 / (1 - p)``; in inference (``eval()``) the identity. Its numbers are ``ct.random_uniform`` keyed by its
    ``seed`` (drawn, as a parameter is, from the model's seed and its name, so two dropouts differ) and its
    ``counter``, which the step adds 1 to (``Module.state_updates``): the same masks on every backend, and a run
    resumed from a checkpoint draws the masks it would have drawn. Its ``stream`` (``ct.random_uniform``'s) is the
    fingerprint of the term it is called on, so calls on different terms draw different masks, and a step built again
    (a new learning rate, a notebook's cell run twice, another process) draws the masks the first build drew; called
    twice on one term in one step, it drops the same elements both times (as a pure function of its input)."""

    def __init__(self, p=0.5):
        super().__init__()
        self.p = real("Dropout", "p, the probability of zeroing an element,", p, 0, 1, below=True)
        self.seed = Buffer((), _random_seed, "uint32", ours=True)
        self.counter = Buffer((), init.zeros, "uint32", ours=True)

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        keep = 1 - self.p
        x = term("Dropout", x)
        stream = int.from_bytes(fingerprint(x)[:4], "little")
        y = ct.where(ct.random_uniform(self.seed, self.counter, x.shape, stream) < keep, x * (1 / keep), 0)
        self._record(y, {self.counter: self.counter + 1}, "it draws the same masks every step")
        return y


def _random_seed(rng, shape, dtype):
    return rng.integers(0, 2 ** 32, shape, dtype=np.uint64).astype(dtype)


class MLP(Sequential):
    """Linear layers of the given sizes (``MLP(784, 256, 256, 10)``), ``activation`` between them (not after the
    last), named ``0``, ``1``, ... as a PyTorch ``Sequential`` of ``Linear`` and activation modules is; their
    products in float8 with ``float8=True`` (``Linear``)."""

    def __init__(self, *sizes, activation=ct.relu, bias=True, dtype="float32", float8=False):
        if len(sizes) < 2:
            raise ShapeError(f"MLP takes at least an input and an output size, not {sizes}")
        if not callable(activation):
            raise CortadoError(f"MLP's activation is a function of a term (ct.relu, ct.gelu, ...), not {activation!r}")
        layers = []
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
            layers.append(Linear(n_in, n_out, bias, dtype=dtype, float8=float8))
            if i < len(sizes) - 2:
                layers.append(Function(activation))
        super().__init__(*layers)


def _in_float32(x):
    """``x``, in float32 where it is float16 or bfloat16: a norm's statistics are taken in float32, as PyTorch takes
    them."""
    return ct.cast(x, "float32") if x.dtype.kind == "f" and x.dtype.itemsize < 4 or x.dtype == BFLOAT16 else x


def _last_size(layer, normalized_shape):
    shape = (normalized_shape,) if np.ndim(normalized_shape) == 0 else tuple(normalized_shape)
    if len(shape) != 1:
        raise ShapeError(f"{layer} normalises the last axis: one size, not {shape}")
    return size(layer, "normalized_shape", shape[0])


def _last_axis(layer, features, x):
    if term(layer, x).shape[-1:] != (features,):
        raise ShapeError(f"{layer}({features}) normalises a last axis of {features}, not the last axis of {x.shape}")
