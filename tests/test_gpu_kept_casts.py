"""A bfloat16 GPT's weights' casts kept as state that its optimizer's kernels write (``rules.kept_casts``), on an
NVIDIA GPU: the same bits, step after step and after its weights are written from outside, as the step that casts
every weight at its start. Skipped where no GPU is visible."""

import sys
from pathlib import Path

import numpy as np
import pytest

import cortado as ct
from cortado import nn, optim
from cortado.backends import gpu_visible
from cortado.backends.cupy import CupyBackend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from gpt import GPT  # noqa: E402


def _training(keeps, monkeypatch):
    """A two-layer bfloat16 GPT's AdamW step, its products' algorithms cuBLASLt's first choices (untimed: both
    programs round alike), planned without recomputation. With it, a weight gradient whose input is made again may
    take its bias gradient from columns of ones (``lowering.bias_gradient_ones``: the same terms added in another
    order) where the arena grows by at most 1%, and a step whose casts are state has a smaller arena than one that
    makes them, so the two could choose apart; a key bias's gradient is zero but for rounding, and AdamW scales it up
    to a whole step."""
    monkeypatch.setattr(CupyBackend, "keeps_casts", keeps)
    model = GPT(16, context=32, width=128, heads=4, layers=2).compute_in("bfloat16")
    tokens, labels = ct.var("tokens", (4, 32), "int32"), ct.var("labels", (4, 32), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = model.parameters()
    state, updates = optim.AdamW(3e-3, weight_decay=0.1).updates(params, ct.grad(loss, list(params.values())))
    program = ct.compile([loss], inputs=[tokens, labels], state={**model.initial_values(0), **state},
                         updates=updates, backend="cupy", autotune=False, recompute=False)
    return program, len(params)


def test_kept_casts_train_a_gpt_to_the_same_bits(monkeypatch):
    (kept, weights), (cast, _) = _training(True, monkeypatch), _training(False, monkeypatch)
    assert kept.traces["state"].counts()["keep-cast-as-state"] == weights  # each weight's (not the moments')
    assert "@bfloat16" in kept.explain() and all("@" not in name for name in kept.state)
    rng = np.random.default_rng(3)
    batches = [(rng.integers(0, 16, (4, 32)).astype(np.int32), rng.integers(0, 16, (4, 32)).astype(np.int32))
               for _ in range(5)]
    for tokens, labels in batches[:3]:
        assert float(kept(tokens=tokens, labels=labels)[0].get()) == float(cast(tokens=tokens, labels=labels)[0].get())
    for name in cast.state:
        np.testing.assert_array_equal(kept.state[name].get(), cast.state[name].get())
    for v in kept.signature.state:  # each cast the cast of its weight as the step left it
        if v.name.endswith("@bfloat16"):
            weight = kept.state[v.name[:-len("@bfloat16")]].get()
            np.testing.assert_array_equal(kept._executor.state[v].get(), weight.astype(v.dtype))
    name = "h.0.mlp.0.weight"
    value = rng.standard_normal(cast.state[name].shape).astype(np.float32) * 0.02
    kept.state[name], cast.state[name] = value, value  # its cast written too
    for tokens, labels in batches[3:]:
        assert float(kept(tokens=tokens, labels=labels)[0].get()) == float(cast(tokens=tokens, labels=labels)[0].get())
