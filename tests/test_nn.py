"""cortado.nn: parameter names, initialisers, layers and losses against NumPy (and PyTorch where installed), and the
GPT built from it compiling to the same kernels as the one written by hand."""

import collections
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import cortado as ct
from cortado import nn, optim
from cortado.gradcheck import check_grads
from peers import needs_torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class Net(nn.Module):
    def __init__(self, blocks=2):
        super().__init__()
        self.embed = nn.Embedding(5, 8)
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_parameters_are_named_by_their_path_from_the_top_module():
    model = Net()
    assert list(model.parameters()) == [
        "embed.weight", "blocks.0.norm.weight", "blocks.0.norm.bias", "blocks.0.fc.weight", "blocks.0.fc.bias",
        "blocks.1.norm.weight", "blocks.1.norm.bias", "blocks.1.fc.weight", "blocks.1.fc.bias", "head.weight",
        "head.bias"]
    assert list(model.blocks[1].parameters()) == ["blocks.1.norm.weight", "blocks.1.norm.bias", "blocks.1.fc.weight",
                                                  "blocks.1.fc.bias"]


def test_calling_a_part_first_names_it_from_the_top_module():
    model = Net()
    model.blocks[0](ct.var("x", (2, 8)))  # a part called before the whole
    assert "blocks.0.fc.weight" in model.parameters()


def test_a_helper_building_a_layer_twice_makes_two_parameters_and_one_layer_used_twice_makes_one():
    class Twice(nn.Module):
        def __init__(self, tied):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = self.a if tied else nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x))

    assert list(Twice(tied=False).parameters()) == ["a.weight", "a.bias", "b.weight", "b.bias"]
    tied = Twice(tied=True)
    assert list(tied.parameters()) == ["a.weight", "a.bias"]
    y = tied(ct.var("x", (2, 4)))
    assert {v.name for v in ct.Graph(y).variables} == {"x", "a.weight", "a.bias"}


def test_a_module_used_alone_cannot_join_a_model_later():
    layer = nn.Linear(4, 4)
    layer(ct.var("x", (1, 4)))
    with pytest.raises(ct.CortadoError, match="after its parameters were named"):
        nn.Sequential(layer)


def test_a_module_setting_its_initialisers_in_init_can_still_join_a_model():
    """named_parameters names no variable (examples/gpt.py's GPT sets its initialisers in __init__ this way), so the
    module can be put in another, where its names grow the path; parameters(), which gives variables, fixes them."""
    class Zeroed(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 4)
            for _, parameter in self.named_parameters():
                parameter.init = nn.init.zeros
            assert [name for name, _ in self.named_parameters()] == ["layer.weight", "layer.bias"]

    outer = nn.Sequential(nn.Linear(4, 4), Zeroed())
    values = {v.name: a for v, a in outer.initial_values().items()}
    assert list(values) == ["0.weight", "0.bias", "1.layer.weight", "1.layer.bias"]
    assert not values["1.layer.weight"].any() and values["0.weight"].any()
    assert [name for name, _ in outer[1].named_parameters()] == ["1.layer.weight", "1.layer.bias"]
    asked = nn.Linear(4, 4)
    asked.parameters()
    with pytest.raises(ct.CortadoError, match=r"called or asked for its parameters\(\), buffers\(\) or "
                                              r"initial_values\(\) on its own"):
        nn.Sequential(asked)


@pytest.mark.parametrize("holder", [list, tuple, lambda layers: dict(enumerate(layers))])
def test_modules_held_in_a_plain_list_or_dict_are_refused_naming_module_list(holder):
    """PyTorch's classic slip: the model would not see their parameters (parameters() empty, the step's variables
    unfed)."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = holder([nn.Linear(4, 4), nn.Linear(4, 4)])

    with pytest.raises(ct.CortadoError, match=r"Net.layers is a \w+ holding modules or parameters the model would "
                                              r"not see: hold modules in nn.ModuleList"):
        Net()


def test_a_list_filled_after_it_was_set_is_refused_when_the_model_is_named():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = []
            self.layers.append(nn.Linear(4, 4))

    with pytest.raises(ct.CortadoError, match=r"Net.layers is a list holding modules or parameters"):
        Net().parameters()


def test_members_kept_again_in_a_tuple_are_seen():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)
            self.both = (self.a, self.b)

    assert list(Pair().parameters()) == ["a.weight", "a.bias", "b.weight", "b.bias"]


def test_two_models_built_apart_in_one_step_are_told_to_share_a_parent():
    """Both name their first weight '0.weight': the step cannot keep two variables of one name."""
    encoder, decoder = nn.MLP(4, 8), nn.MLP(8, 4)
    x = ct.var("x", (2, 4))
    out = decoder(encoder(x))
    with pytest.raises(ct.FeedError, match="two variables are both named '0.weight'.*attributes of one nn.Module"):
        ct.compile([out], inputs=[x], state={**encoder.initial_values(), **decoder.initial_values()})


def test_two_optimizers_of_one_name_are_told_to_take_two_names():
    """A GAN's two default-named Adams both keep 'adam.step': the hint names the optimizers, not the models."""
    model, x = nn.Linear(2, 2), ct.var("x", (3, 2))
    loss = ct.sum(model(x))
    params = model.parameters()
    first, _ = optim.Adam(1e-3).updates(params, ct.grad(loss, list(params.values())))
    second, _ = optim.Adam(1e-3).updates(params, ct.grad(loss, list(params.values())))
    with pytest.raises(ct.FeedError, match=r"both named 'adam.step'.*two optimizers of one name .* name them apart"):
        ct.compile([loss], inputs=[x], state={**model.initial_values(), **first, **second})


def test_initial_values_follow_the_seed_and_each_parameters_own_name():
    values = {v.name: a for v, a in Net().initial_values(seed=3).items()}
    again = {v.name: a for v, a in Net().initial_values(seed=3).items()}
    more = {v.name: a for v, a in Net(blocks=3).initial_values(seed=3).items()}
    other = {v.name: a for v, a in Net().initial_values(seed=4).items()}
    for name, value in values.items():
        np.testing.assert_array_equal(value, again[name])
        np.testing.assert_array_equal(value, more[name])  # a layer added after it changes nothing
    assert not np.array_equal(values["head.weight"], other["head.weight"])
    bound = 1 / math.sqrt(8)
    assert np.abs(values["head.weight"]).max() <= bound and np.abs(values["head.weight"]).max() > 0.5 * bound
    np.testing.assert_array_equal(values["blocks.0.norm.weight"], np.ones(8, np.float32))
    assert abs(float(values["embed.weight"].std()) - 1) < 0.4  # N(0, 1), as PyTorch's Embedding


def _numpy_layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * weight + bias


def test_layers_compute_what_numpy_computes():
    rng = np.random.default_rng(0)
    model = Net()
    tokens = ct.var("tokens", (2, 6), "int32")
    logits = model(tokens)
    values = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in model.parameters().values()}
    feed = rng.integers(0, 5, (2, 6)).astype(np.int32)
    x = values["embed.weight"][feed]
    for i in range(2):
        p = {k.split(".", 2)[2]: v for k, v in values.items() if k.startswith(f"blocks.{i}.")}
        x = x + _numpy_layer_norm(x, p["norm.weight"], p["norm.bias"]) @ p["fc.weight"].T + p["fc.bias"]
    expected = x @ values["head.weight"].T + values["head.bias"]
    np.testing.assert_allclose(ct.evaluate(logits, {"tokens": feed, **values}), expected, rtol=1e-5, atol=1e-5)


def test_rms_norm_and_its_gradient():
    norm = nn.RMSNorm(6, eps=1e-6)
    x = ct.var("x", (3, 6), "float64")
    weight = norm.parameters()["weight"]
    y = norm(x)
    rng = np.random.default_rng(1)
    xv, wv = rng.standard_normal((3, 6)), rng.standard_normal(6)
    expected = xv / np.sqrt((xv * xv).mean(-1, keepdims=True) + 1e-6) * wv
    np.testing.assert_allclose(ct.evaluate(y, {"x": xv, "weight": wv.astype(np.float32)}), expected, rtol=1e-6)
    check_grads(ct.sum(ct.tanh(y)), [x], {x: xv, weight: wv.astype(np.float32)})


def _numpy_attention(x, qkv_w, qkv_b, proj_w, proj_b, heads, kv_heads):
    batch, time, width = x.shape
    size = width // heads
    projected = x @ qkv_w.T + qkv_b
    q = projected[..., :heads * size].reshape(batch, time, heads, size).transpose(0, 2, 1, 3)
    k = projected[..., heads * size:(heads + kv_heads) * size].reshape(batch, time, kv_heads, size).transpose(0, 2, 1, 3)
    v = projected[..., (heads + kv_heads) * size:].reshape(batch, time, kv_heads, size).transpose(0, 2, 1, 3)
    k, v = (np.repeat(t, heads // kv_heads, axis=1) for t in (k, v))  # each key head serves a group of query heads
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size)
    scores = np.where(np.tril(np.ones((time, time), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    mixed = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, time, width)
    return mixed @ proj_w.T + proj_b


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_causal_self_attention_multi_head_and_grouped_query(kv_heads):
    attention = nn.CausalSelfAttention(16, 4, kv_heads, dtype="float64")
    x = ct.var("x", (2, 5, 16), "float64")
    y = attention(x)
    rng = np.random.default_rng(2)
    values = {v.name: rng.standard_normal(v.shape) * 0.3 for v in attention.parameters().values()}
    xv = rng.standard_normal((2, 5, 16))
    expected = _numpy_attention(xv, values["qkv.weight"], values["qkv.bias"], values["proj.weight"],
                                values["proj.bias"], 4, kv_heads)
    np.testing.assert_allclose(ct.evaluate(y, {"x": xv, **values}), expected, rtol=1e-12, atol=1e-12)


def test_losses_are_stable_at_extreme_logits():
    logits, labels = ct.var("logits", (2, 3)), ct.var("labels", (2,), "int32")
    lv = np.array([[1000.0, 0.0, -1000.0], [0.0, 1.0, 2.0]], np.float32)
    loss = ct.evaluate(nn.cross_entropy(logits, labels), {"logits": lv, "labels": np.array([0, 2], np.int32)})
    expected = (0.0 + (np.log(np.exp(lv[1]).sum()) - 2.0)) / 2
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    x, t = ct.var("x", (3,)), ct.var("t", (3,))
    xv, tv = np.array([100.0, -100.0, 0.5], np.float32), np.array([0.0, 1.0, 1.0], np.float32)
    got = ct.evaluate(nn.binary_cross_entropy_with_logits(x, t), {"x": xv, "t": tv})
    np.testing.assert_allclose(got, np.mean([100.0, 100.0, np.log1p(np.exp(-0.5))]), rtol=1e-6)
    np.testing.assert_allclose(ct.evaluate(nn.mse_loss(x, t), {"x": xv, "t": tv}), np.mean((xv - tv) ** 2), rtol=1e-6)
    confident = {"x": np.array([20.0, -20.0, 0.0], np.float32), "t": np.array([1.0, 0.0, 0.25], np.float32)}
    losses = nn.binary_cross_entropy_with_logits(x, t, reduction="none")  # softplus(x) - t x cancelled to 0
    got, gradient = ct.evaluate([losses, ct.grad(ct.sum(losses), x)], confident)
    np.testing.assert_allclose(got, [np.log1p(np.exp(-20.0)), np.log1p(np.exp(-20.0)), np.log(2)], rtol=1e-6)
    np.testing.assert_allclose(gradient, [-np.exp(-20.0), np.exp(-20.0), 0.25], rtol=1e-6)


def test_losses_and_layers_say_what_is_wrong():
    with pytest.raises(ct.DTypeError, match="integer labels"):
        nn.cross_entropy(ct.var("l", (2, 3)), ct.var("y", (2,)))
    with pytest.raises(ct.ShapeError, match="one label for each row"):
        nn.cross_entropy(ct.var("l", (2, 3)), ct.var("y", (3,), "int32"))
    with pytest.raises(ct.ShapeError, match=r"the classes are the logits' last axis, where PyTorch's \(N, C, ...\) "
                                            r"has them second \(ct.moveaxis\(logits, 1, -1\)\)"):
        nn.cross_entropy(ct.var("l", (2, 5, 7)), ct.var("y", (2, 7), "int32"))
    with pytest.raises(ct.ShapeError, match="last axis has 4 features"):
        nn.Linear(4, 2)(ct.var("x", (2, 5)))
    with pytest.raises(ct.ShapeError, match="must divide"):
        nn.CausalSelfAttention(16, 4, 3)


@pytest.mark.parametrize("make, error, message", [
    (lambda: nn.Linear("4", 2), ct.ShapeError, "in_features is a whole number of at least 1, not '4'"),
    (lambda: nn.Linear(4.5, 2), ct.ShapeError, "in_features is a whole number of at least 1, not 4.5"),
    (lambda: nn.Conv2d(1, 2, 0), ct.ShapeError, "kernel_size is a whole number of at least 1, not 0"),
    (lambda: nn.Embedding(5, 0), ct.ShapeError, "embedding_dim is a whole number"),
    (lambda: nn.Dropout("0.5"), ct.CortadoError, "p, the probability of zeroing an element, is a finite number"),
    (lambda: nn.Dropout(1.0), ct.CortadoError, "at least 0 and below 1, not 1.0"),
    (lambda: nn.LayerNorm(4, eps=-1), ct.CortadoError, "eps is a finite number, at least 0, not -1"),
    (lambda: nn.BatchNorm(4, momentum=2), ct.CortadoError, "momentum is a finite number, at least 0 and at most 1"),
    (lambda: nn.Linear(4, 2, float8=True, history=0), ct.ShapeError, "history, the steps whose amax it keeps,"),
    (lambda: nn.MLP(4, 5, 3, activation="relu"), ct.CortadoError, "activation is a function"),
    (lambda: nn.Linear(4, 2, weight_init=0.0), ct.CortadoError, "init is a function"),
    (lambda: nn.Linear(4, 2)({"x": 1}), ct.DTypeError, r"nn.Linear\(4, 2\) is called with a term .* or an array, not dict"),
    (lambda: nn.Linear(4, 2)(np.ones((3, 4))), ct.DTypeError,
     r"nn.Linear\(4, 2\) has float32 weights and is called with float64 input: cast it"),
    (lambda: nn.Conv2d(3, 8, 3)(ct.var("i", (1, 3, 8, 8), "float16")), ct.DTypeError,
     r"nn.Conv2d\(3, 8\) has float32 weights and is called with float16 input"),
    (lambda: nn.Linear(3, 2)(np.array([[1, 2, 3]])), ct.DTypeError,
     r"nn.Linear\(3, 2\) has float32 weights and is called with int64 input: cast it"),
    (lambda: nn.CausalSelfAttention(8, 2)(ct.var("s", (4, 8))), ct.ShapeError, r"takes \(batch, time, 8\)"),
    (lambda: nn.Linear(4, 2).initial_values(seed=-1), ct.CortadoError, "seed is a whole number of at least 0"),
    (lambda: nn.Linear(4, 2).initial_values(seed=None), ct.CortadoError, "seed is a whole number of at least 0"),
])
def test_layer_settings_and_inputs_of_the_wrong_kind_are_refused_by_name(make, error, message):
    """A string or a fraction where a size goes, a setting out of range, a value where a term goes: each either built
    something else without a word (Linear(4.5, 2) a layer of 4 features, an init of 0.0 the default one) or failed
    deep inside NumPy."""
    with pytest.raises(error, match=message):
        make()


def test_layers_take_numpys_scalars_and_arrays_where_numbers_and_terms_go():
    layer = nn.Linear(np.int64(4), np.array(2), weight_init=None)
    assert layer.weight.shape == (2, 4)
    assert nn.LayerNorm(4, eps=np.array(1e-5)).eps == 1e-5 and nn.Embedding(5, 3)(np.arange(4)).shape == (4, 3)
    assert nn.Linear(4, 2)(np.ones((3, 4), np.float32)).shape == (3, 2)


@needs_torch
def test_a_float64_batch_norms_running_statistics_are_pytorchs_to_float64s_rounding():
    import torch

    reference = torch.nn.BatchNorm1d(3, dtype=torch.float64)
    norm, x = nn.BatchNorm(3, dtype="float64"), ct.var("x", (8, 3), "float64")
    y = norm(x)
    step = ct.compile([y], inputs=[x], state=norm.initial_values(0), updates=norm.state_updates([y]))
    rng = np.random.default_rng(2)
    for _ in range(3):
        xv = rng.standard_normal((8, 3)) * 3 + 1
        np.testing.assert_allclose(step(x=xv)[0], reference(torch.from_numpy(xv)).detach().numpy(), rtol=1e-12)
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(step.state[name], getattr(reference, name).numpy(), rtol=1e-14)


@needs_torch
def test_layers_match_pytorchs_given_its_weights():
    import torch

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(4 * 25, 2))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4 * 25, 2)

        def forward(self, x):
            return self.fc(ct.reshape(self.conv(x), (x.shape[0], 100)))

    model = Model()
    x = ct.var("x", (2, 3, 5, 5))
    y = model(x)
    names = {"0.weight": "conv.weight", "0.bias": "conv.bias", "2.weight": "fc.weight", "2.bias": "fc.bias"}
    feeds = {names[k]: v.detach().numpy() for k, v in reference.state_dict().items()}
    xv = np.random.default_rng(0).standard_normal((2, 3, 5, 5)).astype(np.float32)
    expected = reference(torch.from_numpy(xv)).detach().numpy()
    np.testing.assert_allclose(ct.evaluate(y, {"x": xv, **feeds}), expected, rtol=1e-4, atol=1e-5)


def _numpy_batch_norm_steps(xs, weight, bias, momentum=0.1, eps=1e-5):
    """PyTorch's BatchNorm2d in training over the batches ``xs``: each output, then the running statistics."""
    mean_run, var_run, outputs = np.zeros(weight.shape), np.ones(weight.shape), []
    for x in xs:
        mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
        n = x.size // x.shape[1]
        shape = (1, -1, 1, 1)
        outputs.append((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * weight.reshape(shape)
                       + bias.reshape(shape))
        mean_run = (1 - momentum) * mean_run + momentum * mean
        var_run = (1 - momentum) * var_run + momentum * var * n / (n - 1)
    return outputs, mean_run, var_run


def test_batch_norm_trains_on_the_batchs_statistics_and_infers_with_the_running_ones():
    norm = nn.BatchNorm(3)
    x = ct.var("x", (4, 3, 2, 2))
    y = norm(x)
    updates = norm.state_updates(y)
    assert [v.name for v in updates] == ["running_mean", "running_var", "num_batches_tracked"]
    rng = np.random.default_rng(3)
    state = norm.initial_values()
    weights = {norm.parameters()["weight"]: rng.standard_normal(3).astype(np.float32),
               norm.parameters()["bias"]: rng.standard_normal(3).astype(np.float32)}
    step = ct.compile([y], inputs=[x], state={**state, **weights}, updates=updates, backend="numpy")
    xs = [rng.standard_normal((4, 3, 2, 2)).astype(np.float32) * 3 + 1 for _ in range(3)]
    outputs = [step(x=xv)[0] for xv in xs]
    expected, mean_run, var_run = _numpy_batch_norm_steps(xs, *(v.astype(np.float64) for v in weights.values()))
    for ours, theirs in zip(outputs, expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(step.state["running_mean"], mean_run, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(step.state["running_var"], var_run, rtol=1e-5)
    assert int(step.state["num_batches_tracked"]) == 3
    norm.eval()
    inferred = norm(x)
    assert norm.state_updates(inferred) == {}
    feeds = {"x": xs[0], "running_mean": np.array(step.state["running_mean"]),
             "running_var": np.array(step.state["running_var"]), **{v.name: a for v, a in weights.items()}}
    shape = (1, 3, 1, 1)
    w, b = (a.reshape(shape) for a in weights.values())
    expected = (xs[0] - mean_run.reshape(shape)) / np.sqrt(var_run.reshape(shape) + 1e-5) * w + b
    np.testing.assert_allclose(ct.evaluate(inferred, feeds), expected, rtol=1e-5, atol=1e-5)


def test_a_batch_norm_called_twice_in_one_step_is_refused():
    norm = nn.BatchNorm(3)
    x = ct.var("x", (4, 3))
    twice = norm(norm(x))
    with pytest.raises(ct.CortadoError, match="updated by two calls"):
        norm.state_updates(twice)


def _kernel_kinds(outputs, inputs):
    """What the GPU would run for ``outputs``, planned on the CPU: each kernel's op, a fused kernel's shape, a gemm's
    epilogue (its bias gradient taken from either operand counted as one kind)."""
    from cortado import compiler
    from cortado.backends.cupy import backend as engine

    roots = compiler._rewrite(outputs, engine, {})
    kinds = collections.Counter()
    for kernel in compiler._kernels(roots, compiler._signature(roots, inputs, None, None)):
        t = kernel.term
        detail = getattr(t.attrs, "kernel", None) or getattr(t.attrs, "epilogue", None)
        kinds[t.op.name, "bgrad" if isinstance(detail, str) and detail.startswith("bgrad") else detail] += 1
    return kinds


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_gpt_built_from_nn_compiles_to_the_kernels_of_the_one_written_by_hand(dtype):
    import gpt
    import gpt_by_hand

    config = gpt_by_hand.Config(11, context=16, width=64, heads=2, layers=2)
    params = gpt_by_hand.parameters(config)
    loss, _, tokens, labels = gpt_by_hand.gpt(config, 2, params, dtype)
    by_hand = _kernel_kinds([loss, *ct.grad(loss, list(params.values()))], [tokens, labels, *params.values()])

    model = gpt.GPT(11, context=16, width=64, heads=2, layers=2).compute_in(dtype)
    # unsigned token ids: signed ones an nn.Embedding casts first (a negative one is out of range), a kernel more
    tokens, labels = ct.var("tokens_in", (2, 16), "uint32"), ct.var("labels", (2, 16), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = model.parameters()
    built = _kernel_kinds([loss, *ct.grad(loss, list(params.values()))], [tokens, labels, *params.values()])
    assert built == by_hand
    flash = 2 if dtype == "bfloat16" else 0  # cuDNN's flash attention takes half-precision operands
    assert built["dnn_attention", None] == flash and built["dnn_attention_grad", None] == flash


def test_named_parameters_leave_out_buffers_and_containers_refuse_what_is_no_module():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm(2), nn.Dropout(0.1))
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert [n for n, _ in model.named_buffers()] == ["1.running_mean", "1.running_var", "1.num_batches_tracked",
                                                      "2.seed", "2.counter"]
    with pytest.raises(ct.CortadoError, match=r"item 1 is function \(wrap a function as nn.Function"):
        nn.Sequential(nn.Linear(2, 2), ct.relu)
    blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]).append(nn.Linear(2, 2))
    assert len(blocks) == 3 and list(blocks.parameters())[-1] == "2.bias"
    with pytest.raises(ct.CortadoError, match="an iterable of modules"):
        nn.ModuleList(nn.Linear(2, 2))


def test_compute_in_holds_for_the_module_it_is_set_on_and_below():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).compute_in("bfloat16"))
    y = model(ct.var("x", (1, 2)))
    casts = {t.args[0].name for t in ct.Graph(y).schedule if t.op.name == "cast" and t.args[0].op.name == "var"}
    assert casts == {"1.weight", "1.bias"}


def test_compute_in_takes_floating_dtypes_a_model_can_be_trained_in():
    """An int8 tree would compute logits of zeros whose gradients are all zero: refused, as float8, whose products
    need the scales of ``nn.Linear(float8=True)``."""
    for dtype in ("int8", "float8_e4m3fn", "bool"):
        with pytest.raises(ct.DTypeError, match="a module computes in one of bfloat16, float16, float32, float64"):
            nn.MLP(4, 8, 2).compute_in(dtype)


def test_compute_in_casts_a_floating_input_where_it_enters_so_the_products_are_in_that_dtype():
    """A float32 batch into a bfloat16 model: without the cast, each product of the batch and a bfloat16 weight would
    promote back to float32, the weights alone rounded. Integer inputs (token ids) are left alone."""
    from cortado.exprgraph.dtypes import BFLOAT16

    model = nn.Sequential(nn.Linear(20, 8), nn.Function(ct.relu), nn.Linear(8, 3)).compute_in("bfloat16")
    y = model(ct.var("x", (4, 20)))
    assert y.dtype == BFLOAT16
    assert all(t.dtype == BFLOAT16 for t in ct.Graph(y).schedule if t.op.name == "matmul")
    embed = nn.Embedding(10, 4).compute_in("bfloat16")
    assert embed(ct.var("tokens", (3,), "int32")).dtype == BFLOAT16
    half = nn.Linear(20, 8).compute_in("float16")  # a bfloat16 batch (no NumPy kind "f") is a float too
    assert half(ct.var("b", (4, 20), "bfloat16")).dtype == np.float16
    assert nn.Linear(20, 8).compute_in("float32")(np.ones((4, 20))).dtype == np.float32  # a float64 array too


@pytest.mark.parametrize("layer", ["LayerNorm", "RMSNorm"])
def test_norms_of_bfloat16_take_their_statistics_in_float32(layer):
    from cortado.exprgraph.dtypes import BFLOAT16

    norm = getattr(nn, layer)(256)
    x = ct.var("x", (4, 256), "bfloat16")
    rng = np.random.default_rng(4)
    xv = (3 + 0.01 * rng.standard_normal((4, 256))).astype(BFLOAT16)  # a large mean, a small spread
    values = {"x": xv, **{v.name: a for v, a in norm.initial_values().items()}}
    got = ct.evaluate(norm(x), values).astype(np.float64)
    wide = xv.astype(np.float64)
    if layer == "LayerNorm":
        expected = (wide - wide.mean(-1, keepdims=True)) / np.sqrt(wide.var(-1, keepdims=True) + 1e-5)
    else:
        expected = wide / np.sqrt((wide * wide).mean(-1, keepdims=True) + np.finfo(np.float32).eps)
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-2)


def test_a_dropout_called_twice_in_a_step_draws_a_mask_for_each_call():
    drop = nn.Dropout(0.5)
    a, b = ct.var("a", (64,)), ct.var("b", (64,))
    ya, yb = drop(a), drop(b)
    updates = drop.state_updates([ya, yb])
    step = ct.compile([ya, yb], inputs=[a, b], state=drop.initial_values(), updates=updates, backend="numpy")
    first, second = step(a=np.ones(64, np.float32), b=np.ones(64, np.float32))
    assert np.mean(first != second) > 0.25 and int(step.state["counter"]) == 1


def test_a_step_built_again_draws_the_masks_the_first_build_drew():
    """A step rebuilt in the same process (a lower learning rate, a notebook cell run twice, after a call that only
    looked at a shape) draws the first build's masks, as a process resuming from a checkpoint builds it once: a
    dropout's stream is its input's fingerprint, not a count of its calls."""
    model = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5), nn.Dropout(0.5))
    x = ct.var("x", (2, 4))

    def built():
        out = model(x)
        return ct.compile([out], inputs=[x], state=model.initial_values(), updates=model.state_updates(out),
                          backend="numpy")

    first = built()
    assert model(x).shape == (2, 64)  # a look at the shape, in training
    again = built()
    for _ in range(2):
        (a,), (b,) = first(x=np.ones((2, 4), np.float32)), again(x=np.ones((2, 4), np.float32))
        np.testing.assert_array_equal(a, b)
    assert 0.5 < np.mean(a == 0) < 0.95  # two dropouts of 0.5: about three elements of four zeroed


def test_two_passes_of_one_step_draw_two_masks_whatever_is_asked_between_them():
    drop = nn.Dropout(0.5)
    a, b = ct.var("a", (256,)), ct.var("b", (256,))
    ya = drop(a)
    drop.state_updates(ya)  # a per-pass loop may ask between the passes
    yb = drop(b)
    step = ct.compile([ya, yb], inputs=[a, b], state=drop.initial_values(), updates=drop.state_updates([ya, yb]))
    first, second = step(a=np.ones(256, np.float32), b=np.ones(256, np.float32))
    assert np.mean((first == 0) != (second == 0)) > 0.25


def test_a_fingerprint_is_the_same_in_another_process():
    """Python's hash of a string differs from process to process; a dropout's stream must not."""
    code = ("import numpy as np, cortado as ct; from cortado.exprgraph.fingerprint import fingerprint; "
            "x = ct.var('x', (2, 3), 'bfloat16'); print(fingerprint(ct.sum(ct.tanh(x * 2 + np.ones(3)), axis=0)).hex())")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(seen) == 1 and len(seen.pop().strip()) == 64


@pytest.mark.parametrize("dtype, label", [("int32", -1), ("int64", -100), ("int8", -1)])
def test_a_negative_label_or_token_id_is_out_of_range_not_counted_from_the_end(dtype, label):
    """PyTorch's padding label -100 given without ``ignore_index``, or a token id of -1, would pick a real class or
    row counted from the end (300 classes: an int8's -1 is class 255 read as uint8); it is an error naming the
    layer and the label as given, in the program and in the reference alike."""
    logits, labels = ct.var("logits", (4, 300)), ct.var("labels", (4,), dtype)
    loss = nn.cross_entropy(logits, labels)
    feeds = {"logits": np.zeros((4, 300), np.float32), "labels": np.array([0, label, 2, 3], dtype)}
    for run in (lambda: ct.compile([loss], inputs=[logits, labels])(**feeds), lambda: ct.evaluate(loss, feeds)):
        with pytest.raises(ct.IndexRangeError, match=rf"nn\.cross_entropy\(.*index {label} is out of range .*"
                                                      rf"\[0, 300\)"):
            run()
    embed = nn.Embedding(300, 4)
    tokens = ct.var("tokens", (4,), dtype)
    table = embed(tokens)
    (gradient,) = ct.grad(ct.sum(table), [embed.parameters()["weight"]])
    step = ct.compile([table, gradient], inputs=[tokens], state=embed.initial_values(0))
    with pytest.raises(ct.IndexRangeError, match=rf"nn\.Embedding\(300, 4\).*index {label} is out of range"):
        step(tokens=feeds["labels"])
    assert step(tokens=np.array([0, 127, 2, 3], dtype))[0].shape == (4, 4)


def test_with_a_padding_label_any_other_negative_label_is_still_out_of_range():
    logits, labels = ct.var("logits", (4, 300)), ct.var("labels", (4,), "int64")
    step = ct.compile([nn.cross_entropy(logits, labels, ignore_index=-100)], inputs=[logits, labels])
    assert step(logits=np.zeros((4, 300), np.float32), labels=np.array([0, -100, 2, 3]))[0] == np.float32(np.log(300))
    with pytest.raises(ct.IndexRangeError, match=r"nn\.cross_entropy\(.*index -1 is out of range .*\[0, 300\)"):
        step(logits=np.zeros((4, 300), np.float32), labels=np.array([0, -1, 2, 3]))


@pytest.mark.parametrize("bad", [-1, 10])
def test_constant_labels_and_token_ids_outside_are_refused_where_they_are_built(bad):
    with pytest.raises(ct.IndexRangeError, match=rf"nn\.cross_entropy\(.*index {bad} is out of range .*\[0, 10\)"):
        nn.cross_entropy(ct.var("logits", (3, 10)), np.array([1, bad, 3]))
    with pytest.raises(ct.IndexRangeError, match=rf"nn\.Embedding\(10, 4\).*index {bad} is out of range"):
        nn.Embedding(10, 4)(np.array([1, bad]))
    assert ct.evaluate(nn.cross_entropy(ct.var("logits", (3, 10)), [1, 2, 3]),
                       {"logits": np.zeros((3, 10), np.float32)}) == np.float32(np.log(10))


def test_an_unsigned_index_out_of_range_is_named_as_given():
    """A uint16 token id past the table (a nanoGPT-style token file) is shown as it is, not as a signed one."""
    embed, tokens = nn.Embedding(100, 2), ct.var("tokens", (3,), "uint16")
    step = ct.compile([embed(tokens)], inputs=[tokens], state=embed.initial_values(0))
    with pytest.raises(ct.IndexRangeError, match=r"nn\.Embedding\(100, 2\)\(uint16\[3\]\): index 50300 is out of "
                                                  r"range for axis 0 of size 100 \(indices must lie in \[0, 100\)\)"):
        step(tokens=np.array([1, 50300, 2], np.uint16))


def test_pytorchs_activation_modules_are_cortados_ops_and_gelu_is_only_the_tanh_form():
    x = ct.var("x", (2, 3), "float64")
    values = {"x": np.linspace(-2, 2, 6).reshape(2, 3)}
    for module, op in ((nn.ReLU(), ct.relu), (nn.GELU(approximate="tanh"), ct.gelu), (nn.SiLU(), ct.silu),
                       (nn.Sigmoid(), ct.sigmoid), (nn.Tanh(), ct.tanh), (nn.Identity(), lambda t: t),
                       (nn.Softmax(dim=0), lambda t: ct.softmax(t, axis=0)),
                       (nn.LogSoftmax(dim=-1), lambda t: ct.log_softmax(t, axis=-1))):
        np.testing.assert_array_equal(ct.evaluate(module(x), values), ct.evaluate(op(x), values))
    assert repr(nn.Sequential(nn.ReLU(), nn.LogSoftmax(1))) == "Sequential(\n  0: ReLU()\n  1: LogSoftmax(dim=1))"
    assert repr(nn.GELU(approximate="tanh")) == "GELU(approximate='tanh')"  # GELU() is the erf form, refused
    with pytest.raises(ct.CortadoError, match="dim is the axis to normalise, an int, not None"):
        nn.Softmax(None)  # PyTorch's guesses an axis
    with pytest.raises(ct.CortadoError, match=r"the tanh form, nn.GELU\(approximate='tanh'\), not the erf form"):
        nn.GELU()


@needs_torch
def test_the_activation_modules_match_pytorchs():
    import torch

    x = np.linspace(-30, 30, 101)
    v = ct.var("x", (101,), "float64")
    for ours, theirs in ((nn.ReLU(), torch.nn.ReLU()), (nn.GELU(approximate="tanh"), torch.nn.GELU(approximate="tanh")),
                         (nn.SiLU(), torch.nn.SiLU()), (nn.Sigmoid(), torch.nn.Sigmoid()), (nn.Tanh(), torch.nn.Tanh()),
                         (nn.Softmax(0), torch.nn.Softmax(0)), (nn.LogSoftmax(0), torch.nn.LogSoftmax(0))):
        np.testing.assert_allclose(ct.evaluate(ours(v), {"x": x}), theirs(torch.from_numpy(x)).numpy(), rtol=1e-13,
                                   atol=1e-15)  # far out gelu's x sigmoid(z) keeps what torch's 1 + tanh rounds to 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_batch_norm_takes_its_statistics_in_float32(dtype):
    """In float16 a value 256 from its channel's mean squared past 65504: the variance was inf, every output 0 and
    the running variance inf."""
    norm, x = nn.BatchNorm1d(1, dtype=dtype, affine=False), ct.var("x", (4, 1), dtype)
    y = norm(x)
    step = ct.compile([y], inputs=[x], state=norm.initial_values(), updates=norm.state_updates(y))
    values = np.array([[-300.0], [-100.0], [100.0], [300.0]], np.float32)
    (got,) = step(x=values.astype(x.dtype))
    centered = values - values.mean()
    expected = (centered / np.sqrt((centered ** 2).mean() + 1e-5)).astype(x.dtype)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_allclose(step.state["running_var"], 0.9 + 0.1 * centered.var() * 4 / 3, rtol=1e-6)
    norm.eval()
    predict = ct.compile([norm(x)], inputs=[x], state=norm.initial_values())
    ct.load_state_dict(predict, step.state, strict=False)
    (inferred,) = predict(x=values.astype(x.dtype))
    mean, variance = step.state["running_mean"], step.state["running_var"]
    np.testing.assert_array_equal(inferred, ((values - mean) / np.sqrt(variance + 1e-5)).astype(x.dtype))


def test_batch_norm_1d_and_2d_are_batch_norm_of_pytorchs_ranks():
    x, images = ct.var("x", (4, 3)), ct.var("images", (2, 3, 5, 5))
    values = {"x": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)}
    np.testing.assert_array_equal(ct.evaluate(nn.BatchNorm1d(3, affine=False)(x), values),
                                  ct.evaluate(nn.BatchNorm(3, affine=False)(x), values))
    assert nn.BatchNorm2d(3)(images).shape == (2, 3, 5, 5) and nn.BatchNorm1d(3)(ct.var("s", (2, 3, 7))).shape
    with pytest.raises(ct.ShapeError, match=r"BatchNorm2d\(3\) normalises axis 1 of \(N, 3, H, W\) inputs, not "
                                            r"\(4, 3\)"):
        nn.BatchNorm2d(3)(x)
    with pytest.raises(ct.ShapeError, match=r"BatchNorm1d\(3\) normalises axis 1 of \(N, 3\) or \(N, 3, L\)"):
        nn.BatchNorm1d(3)(images)


def test_pooling_and_flatten_modules_are_the_ops_they_name_and_refuse_what_they_lack():
    x = ct.var("x", (2, 3, 6, 6), "float64")
    values = {"x": np.random.default_rng(10).standard_normal((2, 3, 6, 6))}
    for module, term in ((nn.MaxPool2d(2), ct.max_pool2d(x, 2)), (nn.AvgPool2d(3, 1, 1), ct.avg_pool2d(x, 3, 1, 1)),
                         (nn.Flatten(), ct.reshape(x, (2, 108))), (nn.Flatten(1, 2), ct.reshape(x, (2, 18, 6))),
                         (nn.Flatten(0), ct.reshape(x, (216,)))):
        np.testing.assert_array_equal(ct.evaluate(module(x), values), ct.evaluate(term, values))
    with pytest.raises(ct.CortadoError, match=r"nn.MaxPool2d: ceil_mode=True is not supported; only PyTorch's "
                                              r"defaults \(dilation=1, ceil_mode=False, return_indices=False\)"):
        nn.MaxPool2d(2, ceil_mode=True)
    with pytest.raises(ct.CortadoError, match=r"nn.AvgPool2d: count_include_pad=False is not supported"):
        nn.AvgPool2d(2, count_include_pad=False)
    with pytest.raises(ct.CortadoError, match=r"nn.Flatten\(start_dim=2, end_dim=1\) of float64\[2,3,6,6\]: the "
                                              r"axes from start_dim to end_dim must exist, in that order"):
        nn.Flatten(2, 1)(x)


@needs_torch
def test_a_cnn_of_pooling_and_flatten_modules_matches_pytorchs_forward_and_backward():
    import torch

    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                 torch.nn.AvgPool2d(3, 1, 1), torch.nn.Flatten(), torch.nn.Linear(64, 5)).double()
    ours = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, dtype="float64"), nn.ReLU(), nn.MaxPool2d(2),
                         nn.AvgPool2d(3, 1, 1), nn.Flatten(), nn.Linear(64, 5, dtype="float64"))
    x = ct.var("x", (2, 3, 8, 8), "float64")
    out = ours(x)
    params = ours.parameters()
    loss = ct.sum(out * out)
    state = {name: theirs.state_dict()[name].numpy() for name in params}
    xv = np.random.default_rng(11).standard_normal((2, 3, 8, 8))
    got = ct.evaluate([loss] + ct.grad(loss, list(params.values())), {"x": xv, **state})
    xt = torch.from_numpy(xv)
    expected = (theirs(xt) ** 2).sum()
    expected.backward()
    np.testing.assert_allclose(got[0], expected.item(), rtol=1e-12)
    for name, gradient in zip(params, got[1:]):
        np.testing.assert_allclose(gradient, dict(theirs.named_parameters())[name].grad.numpy(), rtol=1e-10,
                                   atol=1e-12)


def test_a_step_computing_a_layer_in_training_without_its_state_updates_is_warned_of():
    """Without ``model.state_updates``, a batch norm's running statistics would stay at their first values (its
    inference silently wrong) and a dropout would draw the same masks every step."""
    from cortado import optim

    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm(8), nn.Dropout(0.1), nn.Linear(8, 2))
    x = ct.var("x", (16, 4))
    loss = ct.mean(model(x) ** 2)
    params = model.parameters()
    state, updates = optim.SGD(0.1).updates(params, ct.grad(loss, list(params.values())))
    state = {**model.initial_values(), **state}
    with pytest.warns(UserWarning) as caught:
        ct.compile([loss], inputs=[x], state=state, updates=updates)
    assert [str(w.message).split(" in training")[0] for w in caught] == [
        "compile: the step computes BatchNorm", "compile: the step computes Dropout"]
    assert "running statistics stay at their first values" in str(caught[0].message)
    assert "model.state_updates(outputs)" in str(caught[1].message) and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.compile([loss], inputs=[x], state=state, updates={**updates, **model.state_updates(loss)})
        # a program that updates nothing (its gradients computed to look at them) is no training step
        ct.compile([loss, *ct.grad(loss, list(params.values()))], inputs=[x], state=model.initial_values())
        ct.compile([model.eval()(x)], inputs=[x], state=model.initial_values())


def test_an_evaluation_program_built_before_eval_is_warned_of():
    """A module's mode is read where ``model(x)`` builds the terms: ``eval()`` called after an evaluation program was
    built changed nothing, and the program normalised by each batch's statistics and drew one dropout mask for every
    call, without a word."""
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm(8), nn.Dropout(0.5), nn.Linear(8, 2))
    x = ct.var("x", (16, 4))
    v = ct.var("v", (16, 4))
    ct.grad(ct.sum(v * x), v)  # x itself: no gradient of the program's making
    with pytest.warns(UserWarning, match=r"computes BatchNorm and Dropout in training mode and updates nothing: .* "
                                         r"call model.eval\(\) before model\(x\) builds"):
        ct.compile([model(x)], inputs=[x], state=model.initial_values())


def test_cross_entropy_smooths_labels_as_pytorch_defines_it():
    """Target ``1 - e`` on the label and ``e`` spread over the classes: ``lse - (1 - e) x[label] - e mean(x)``, over
    the positions not ignored."""
    logits, labels = ct.var("logits", (5, 4), "float64"), ct.var("labels", (5,), "int64")
    x = np.random.default_rng(3).standard_normal((5, 4))
    y = np.array([0, 3, -100, 2, 1])
    lse = np.log(np.exp(x).sum(-1))
    kept = y != -100
    rows = lse - 0.9 * x[np.arange(5), np.where(kept, y, 0)] - 0.1 * x.mean(-1)
    got = ct.evaluate(nn.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1),
                      {"logits": x, "labels": y})
    np.testing.assert_allclose(got, rows[kept].mean(), rtol=1e-14)
    with pytest.raises(ct.CortadoError, match="label_smoothing is a finite number, at least 0 and at most 1"):
        nn.cross_entropy(logits, labels, label_smoothing=1.5)


@needs_torch
def test_cross_entropy_with_label_smoothing_and_padding_matches_pytorchs():
    import torch

    logits, labels = ct.var("logits", (6, 7), "float64"), ct.var("labels", (6,), "int64")
    x = np.random.default_rng(4).standard_normal((6, 7)) * 3
    y = np.array([0, 6, -100, 2, 1, -100])
    xt = torch.tensor(x, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(xt, torch.from_numpy(y), ignore_index=-100, label_smoothing=0.2)
    expected.backward()
    loss = nn.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.2)
    got, gradient = ct.evaluate([loss, ct.grad(loss, [logits])[0]], {"logits": x, "labels": y})
    np.testing.assert_allclose(got, expected.item(), rtol=1e-13)
    np.testing.assert_allclose(gradient, xt.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_losses_reduce_as_asked_and_cross_entropy_takes_probability_targets():
    """``reduction`` "sum" and "none" (0 at an ignored position) beside the mean, for each loss; probability
    targets of the logits' shape, smoothed as PyTorch smooths them: ``-sum(p log_softmax(x))`` a position."""
    logits, labels = ct.var("logits", (5, 4), "float64"), ct.var("labels", (5,), "int64")
    x = np.random.default_rng(6).standard_normal((5, 4))
    y = np.array([0, 3, -100, 2, 1])
    lse = np.log(np.exp(x).sum(-1))
    rows = np.where(y != -100, lse - x[np.arange(5), np.where(y != -100, y, 0)], 0)
    feeds = {"logits": x, "labels": y}
    for reduction, expected in (("none", rows), ("sum", rows.sum()), ("mean", rows.sum() / 4)):
        got = ct.evaluate(nn.cross_entropy(logits, labels, ignore_index=-100, reduction=reduction), feeds)
        np.testing.assert_allclose(got, expected, rtol=1e-14)
    p = np.random.default_rng(7).dirichlet(np.ones(4), 5)
    targets = ct.var("p", (5, 4), "float64")
    log_softmax = x - lse[:, None]
    smoothed = 0.9 * p + 0.1 / 4
    got = ct.evaluate(nn.cross_entropy(logits, targets, label_smoothing=0.1, reduction="none"), {"logits": x, "p": p})
    np.testing.assert_allclose(got, -(smoothed * log_softmax).sum(-1), rtol=1e-14)
    t, d = ct.var("t", (3, 2), "float64"), np.array([[0.5, 2.0], [-1.0, 0.0], [3.0, 1.5]])
    np.testing.assert_allclose(ct.evaluate(nn.mse_loss(t, t * 0.0, reduction="sum"), {"t": d}), (d * d).sum())
    np.testing.assert_allclose(ct.evaluate(nn.binary_cross_entropy_with_logits(t, t * 0.0, reduction="none"),
                                           {"t": d}), np.log1p(np.exp(d)), rtol=1e-14)
    half = ct.var("half", (5, 4), "bfloat16")  # probabilities in bfloat16 are probabilities too
    got = ct.evaluate(nn.cross_entropy(logits, half, reduction="none"), {"logits": x, "half": p.astype(half.dtype)})
    np.testing.assert_allclose(got, -(p.astype(half.dtype).astype(np.float64) * log_softmax).sum(-1), rtol=1e-14)
    with pytest.raises(ct.DTypeError, match=r"class indices are integer labels of shape \(5,\), floating labels are "
                                            r"probabilities of the classes, of the logits' shape"):
        nn.cross_entropy(logits, ct.var("f", (5,)))
    with pytest.raises(ct.CortadoError, match="mse_loss: reduction is one of 'mean', 'sum', 'none', not 'avg'"):
        nn.mse_loss(t, t, reduction="avg")
    with pytest.raises(ct.CortadoError, match="ignore_index is for integer labels"):
        nn.cross_entropy(logits, targets, ignore_index=-100)


@needs_torch
def test_losses_with_reductions_and_probability_targets_match_pytorchs():
    import torch
    import torch.nn.functional as F

    logits, labels = ct.var("logits", (6, 7), "float64"), ct.var("labels", (6,), "int64")
    targets = ct.var("p", (6, 7), "float64")
    x = np.random.default_rng(8).standard_normal((6, 7)) * 3
    y = np.array([0, 6, -100, 2, 1, -100])
    p = np.random.default_rng(9).dirichlet(np.ones(7), 6)
    cases = [(nn.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.2, reduction=r), {"labels": y},
              lambda xt, r=r: F.cross_entropy(xt, torch.from_numpy(y), ignore_index=-100, label_smoothing=0.2,
                                              reduction=r)) for r in ("sum", "none")]
    cases += [(nn.cross_entropy(logits, targets, label_smoothing=s, reduction=r), {"p": p},
               lambda xt, s=s, r=r: F.cross_entropy(xt, torch.from_numpy(p), label_smoothing=s, reduction=r))
              for s in (0.0, 0.3) for r in ("mean", "none")]
    for loss, feeds, theirs in cases:
        xt = torch.tensor(x, requires_grad=True)
        expected = theirs(xt)
        expected.sum().backward()
        got, gradient = ct.evaluate([loss, ct.grad(ct.sum(loss), [logits])[0]], {"logits": x, **feeds})
        np.testing.assert_allclose(got, expected.detach().numpy(), rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(gradient, xt.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_cross_entropy_ignores_the_padding_label():
    logits, labels = ct.var("logits", (4, 3)), ct.var("labels", (4,), "int64")
    lv = np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32)
    yv = np.array([0, -100, 2, -100])
    got = ct.evaluate(nn.cross_entropy(logits, labels, ignore_index=-100), {"logits": lv, "labels": yv})
    lse = np.log(np.exp(lv).sum(-1))
    np.testing.assert_allclose(got, np.mean([lse[0] - lv[0, 0], lse[2] - lv[2, 2]]), rtol=1e-6)
    none = ct.evaluate(nn.cross_entropy(logits, labels, ignore_index=-100), {"logits": lv, "labels": np.full(4, -100)})
    assert none == 0
