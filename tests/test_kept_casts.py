"""A mixed-precision step's casts of its updated weights, kept as state the step updates (``rules.kept_casts``): the
same values, step after step, as the step casting at its start; hidden from ``program.state``, written with it; an
update that does not read its variable written over it (``compiler._kernels``). On the CPU, the NumPy backend made
to keep them as the GPU's does; ``test_gpu_kept_casts.py`` runs the GPU's."""

import numpy as np
import pytest
from gpu_rewrites import planning_without_a_device
from test_checkpoint import _batches
from test_checkpoint import _training as checkpoint_training

import cortado as ct
from cortado import compiler, nn, optim
from cortado.backends.cupy import backend as gpu_backend
from cortado.backends.numpy import NumpyBackend
from cortado.exprgraph.dtypes import BFLOAT16
from cortado.rules.engine import Trace
from cortado.rules.horizontal import Horizontal
from cortado.rules.kept_casts import kept_casts

pytestmark = pytest.mark.skipif(BFLOAT16 is None, reason="ml_dtypes is not installed")


def _training(keeps, monkeypatch, seed=0):
    """``test_checkpoint``'s MLP trained by AdamW in bfloat16, its float32 weights cast at each use; the backend keeps
    the casts or not."""
    monkeypatch.setattr(NumpyBackend, "keeps_casts", keeps)
    return checkpoint_training("numpy", seed, "bfloat16")


def test_kept_casts_give_the_same_losses_and_weights_step_after_step(monkeypatch):
    kept, cast = _training(True, monkeypatch), _training(False, monkeypatch)
    assert kept.traces["state"].counts()["keep-cast-as-state"] == 6  # three layers' weights and biases
    for x, y in _batches(4):
        assert float(kept(x=x, y=y)[0]) == float(cast(x=x, y=y)[0])
    assert sorted(kept.state) == sorted(cast.state)  # the casts are not listed
    for name in cast.state:
        np.testing.assert_array_equal(kept.state[name], cast.state[name])
    hidden = [v for v in kept.signature.state if v.name.endswith("@bfloat16")]
    assert len(hidden) == 6
    for v in hidden:  # each holds the cast of its weight as the step left it
        weight = kept.state[v.name[:-len("@bfloat16")]]
        np.testing.assert_array_equal(kept._executor.state[v], weight.astype(BFLOAT16))


def test_a_weight_written_from_outside_writes_its_cast_too(monkeypatch, tmp_path):
    kept, cast = _training(True, monkeypatch), _training(False, monkeypatch)
    batches = _batches(3)
    rng = np.random.default_rng(7)
    for program in (kept, cast):
        program(x=batches[0][0], y=batches[0][1])
    weights = [v.name[:-len("@bfloat16")] for v in kept.signature.state if v.name.endswith("@bfloat16")]
    for name in weights:
        value = rng.standard_normal(cast.state[name].shape).astype(np.float32) * 0.3
        kept.state[name], cast.state[name] = value, value
    path = str(tmp_path / "run.safetensors")
    ct.save(kept, path)
    resumed = _training(True, monkeypatch, seed=5)  # other first weights: the checkpoint replaces them and their casts
    ct.load(resumed, path)
    for x, y in batches[1:]:
        expected = float(cast(x=x, y=y)[0])
        assert float(kept(x=x, y=y)[0]) == expected and float(resumed(x=x, y=y)[0]) == expected


def test_only_narrow_casts_of_updated_float_state_are_kept():
    w, frozen, counts = ct.var("w", (4, 4)), ct.var("frozen", (4, 4)), ct.var("counts", (4,), "int32")
    half, wide = ct.var("half", (4,), "bfloat16"), ct.var("wide", (4,), "float64")
    x = ct.var("x", (2, 4), "bfloat16")
    out = (x @ ct.cast(w, "bfloat16") + x @ ct.cast(frozen, "bfloat16") + ct.cast(counts, "bfloat16")
           + ct.cast(ct.cast(half, "float32"), "bfloat16") + x @ ct.cast(ct.cast(w, "float16"), "bfloat16")
           + ct.cast(wide, "bfloat16"))
    state = {w: np.ones((4, 4), np.float32), frozen: np.ones((4, 4), np.float32), counts: np.zeros(4, np.int32),
             half: np.zeros(4, BFLOAT16), wide: np.zeros(4)}
    updates = {w: w * 0.5, counts: counts + 1, half: half * 2, wide: wide + 1}
    trace = Trace()
    outputs, new_state, new_updates, kept = kept_casts([out], state, updates, trace)
    assert sorted((w_.name, str(d)) for w_, d in kept.values()) == [("w", "bfloat16"), ("w", "float16")]
    assert sorted(v.name for v in kept) == ["w@bfloat16", "w@float16"] and len(trace) == 2
    for v, (source, dtype) in kept.items():
        np.testing.assert_array_equal(new_state[v], state[source].astype(dtype))
        assert new_updates[v].op.name == "cast" and new_updates[v].args[0] is new_updates[w]
    assert new_updates[w] is updates[w] and set(new_state) == set(state) | set(kept)


def test_a_kept_casts_name_never_takes_another_variables():
    w, taken, fed = ct.var("w", (4,)), ct.var("w@bfloat16", (4,), "bfloat16"), ct.var("w@bfloat16'", (4,))
    out = ct.cast(w, "bfloat16") + taken
    _, _, _, kept = kept_casts([out], {w: np.ones(4, np.float32)}, {w: w + 1}, Trace(), inputs=[fed])
    assert [v.name for v in kept] == ["w@bfloat16''"]  # (an input the step does not read keeps its name too)


def test_an_update_that_does_not_read_its_variable_is_written_after_the_variables_readers(monkeypatch):
    """``{w: x * 3}``, ``w`` read by the step too: the update is computed over ``w`` in place on the GPU, after the
    kernel reading ``w`` (planned on the CPU), and the step returns the value before it (the CPU's program)."""
    w, x = ct.var("w", (64, 64)), ct.var("x", (64, 64))
    out = ct.sum(ct.tanh(w) * x)
    planning_without_a_device(monkeypatch)
    signature = compiler._signature([out], [x], {w: np.ones((64, 64), np.float32)}, {w: x * 3})
    built = compiler._built(signature, gpu_backend, compiler._options(gpu_backend, {}))
    (update,) = built.updates.values()
    assert built.sinks == {update: w}
    at = {t: i for i, k in enumerate(built.kernels) for t in k.terms}
    assert all(at[update] >= i for i, k in enumerate(built.kernels) if w in k.term.args)
    step = ct.compile([out], inputs=[x], state={w: np.ones((64, 64), np.float32)}, updates={w: x * 3})
    xv = np.full((64, 64), 2.0, np.float32)
    assert float(step(x=xv)[0]) == pytest.approx(np.tanh(1.0) * 2 * 64 * 64, rel=1e-5)
    np.testing.assert_array_equal(step.state["w"], xv * 3)


def test_the_gpt_steps_casts_are_written_by_its_optimizer_in_place(monkeypatch):
    """Planned for the GPU on the CPU: no kernel casts the weights at the step's start, every update (the casts'
    too) is computed in place, and the arena no longer holds the casts."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from gpt import GPT

    planning_without_a_device(monkeypatch)
    model = GPT(16, context=32, width=64, heads=4, layers=2).compute_in("bfloat16")
    tokens, labels = ct.var("tokens", (4, 32), "int32"), ct.var("labels", (4, 32), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = model.parameters()
    state, updates = optim.AdamW(1e-3).updates(params, ct.grad(loss, list(params.values())))
    signature = compiler._signature([loss], [tokens, labels], {**model.initial_values(0), **state}, updates)
    plans = {}
    for keeps in (True, False):
        s = signature
        if keeps:
            outputs, kept_state, kept_updates, kept = kept_casts(s.outputs, s.state, s.updates, Trace())
            s = compiler.replace(s, outputs=outputs, state=kept_state, updates=kept_updates)
            assert len(kept) == len(params)
        plans[keeps] = compiler._built(s, gpu_backend, compiler._options(gpu_backend, {}))
    built = plans[True]
    assert set(built.updates.values()) <= set(built.sinks)  # every update in place, the casts' too
    def casts_at_start(kernels):  # (the token ids' cast to unsigned and AdamW's step counts read no weight)
        return [k for k in kernels if k.term.op.name == "fused" and isinstance(k.term.attr("kernel"), Horizontal)
                and all(a.op.name == "var" for a in k.term.args) and any(a.name in params for a in k.term.args)]

    assert casts_at_start(plans[False].kernels) and not casts_at_start(built.kernels)
    assert built.plan.peak_bytes < plans[False].plan.peak_bytes
