# ruff: noqa: E402, E501, E702  (the clock starts before the imports; the product forms are one line each)
#!/usr/bin/env python3
"""A time-bounded wrong-result fuzz campaign for cortado's GPU backend.

Programs compiled with ``backend="cupy"`` (or, for a dry run, ``--backend numpy``) are run and compared with the
reference interpreter ``ct.evaluate`` by the agreement criteria the GPU test suite uses (``tests/reference_checks``'s
``check`` and ``tests/test_gpu``'s tolerances; see ``judge``). Every mismatch, crash (an exception that is not a
``ct.CortadoError``) and unclear error (a ``CortadoError`` from a program the CPU compiles and runs) is logged as one
JSON line, the first of each distinct kind, with a pickle of the case for ``--replay``.

    PYTHONPATH=$PWD:/tmp/site python3 benchmarks/results/h200/experiments/gpu_fuzz/campaign.py --modes all --seconds 540 --seed 1 --out $OUT/gfz
    python3 benchmarks/results/h200/experiments/gpu_fuzz/campaign.py --backend numpy --modes all --seconds 120 --seed 1 --out /tmp/gfz_np
    python3 benchmarks/results/h200/experiments/gpu_fuzz/campaign.py --replay /tmp/gfz/cases/0001.pkl [--backend numpy]

Run from the repository root (tests/ is the one beside the cortado imported). See README.txt.
"""

import time

T0 = time.time()  # the campaign's clock starts before the imports

import argparse  # noqa: E402
import gc
import json
import math
import os
import pickle
import random
import re
import signal
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]  # the repository: benchmarks/results/h200/experiments/gpu_fuzz
try:
    import cortado  # noqa: F401  (PYTHONPATH's, where given)
except ImportError:
    sys.path.insert(0, str(ROOT))
    import cortado  # noqa: F401
TESTS = Path(cortado.__file__).resolve().parents[1] / "tests"  # the tests of the cortado under test
TESTS = TESTS if TESTS.is_dir() else ROOT / "tests"
sys.path.insert(0, str(TESTS))

import numpy as np  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import cortado as ct  # noqa: E402
import cortado.testing as T  # noqa: E402
from cortado.exprgraph.dtypes import as_dtype, finfo, is_float  # noqa: E402
from cortado.rules.stability import stabiliser  # noqa: E402

import reference_checks as RC  # noqa: E402  (the agreement every backend test shares)
import test_gpu as TG  # noqa: E402  (the GPU suite's tolerances: TOLERANCE, assert_close, _least_precise)
import test_fuzz_edges as TE  # noqa: E402  (edge values, constant chains)

FLOATS = ["float16", "bfloat16", "float32", "float64"]
HALVES = ("float16", "bfloat16")
INTS = ["int32", "int64", "int8", "uint8"]
ALLDT = FLOATS + INTS + ["bool"]
INNER = [63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 1023, 1024, 1025]
MODES = ["plain", "ints", "newops", "state", "grad", "reduce", "gemm", "index", "edges"]
MAX_LINES = 200  # failures.jsonl: the first of each distinct kind, at most this many
GRACE = 15.0  # an example still running this long past the campaign's end is cut
MAX_RESTARTS = 25  # fresh processes after a CUDA context is lost (an illegal address poisons the process)
HYPOTHESIS = dict(max_examples=10 ** 7, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), print_blob=False)


class ExampleTimeout(BaseException):
    """Raised by SIGALRM inside an example that ran past its cap."""


class StopMode(BaseException):
    """Ends a mode's hypothesis run at its deadline."""


def _alarm(signum, frame):
    raise ExampleTimeout()


def dt(name):
    return as_dtype(name)


def host(array):
    """A NumPy copy of a result (a CuPy array's .get(); a NumPy result may be a view the next call overwrites)."""
    return np.array(RC.host(array), copy=True)


def restrict(terms, feed):
    """The feeds of the variables ``terms`` read (ct.evaluate refuses feeds naming no variable of its graph)."""
    return {name: feed[name] for name in ct.Graph(list(terms)).variables_by_name()}


def relayout(rng, a, layout):
    """The same values in a non-contiguous / transposed / negative-stride NumPy view."""
    a = np.asarray(a)
    if a.ndim == 0 or layout == "c":
        return a
    if layout == "fortran":
        return np.asfortranarray(a)
    if layout == "flip":
        ax = int(rng.integers(a.ndim))
        return np.flip(np.flip(a, ax).copy(), ax)
    if layout == "strided":
        ax = int(rng.integers(a.ndim))
        shape = list(a.shape)
        shape[ax] *= 2
        big = np.zeros(shape, a.dtype)
        idx = [slice(None)] * a.ndim
        idx[ax] = slice(None, None, 2)
        big[tuple(idx)] = a
        return big[tuple(idx)]
    if layout == "transposed":
        perm = list(rng.permutation(a.ndim))
        inv = list(np.argsort(perm))
        return np.transpose(np.ascontiguousarray(np.transpose(a, perm)), inv)
    return a


def clamped(indices, size):
    """The GPU's reading of gather/scatter indices: negative ones count from the end, then any outside the axis is
    clamped into it (docs: ``take``; tests/test_add_at.py, test_take.py)."""
    i = np.asarray(indices).astype(np.int64)
    i = np.where(i < 0, i + size, i)
    return np.clip(i, 0, size - 1).astype(np.asarray(indices).dtype)


def arrays_json(feeds, limit=256):
    """Feeds inline where small (for a JSON line), else their shapes and dtypes."""
    out = {}
    for k, a in feeds.items():
        a = np.asarray(a)
        entry = {"shape": list(a.shape), "dtype": a.dtype.name}
        if a.size <= limit:
            entry["values"] = a.astype(np.float64).tolist() if a.dtype.kind == "V" or is_float(a.dtype) else a.tolist()
        out[k] = entry
    return out


def signature(text):
    """An error message without its numbers, shapes and names, to tell kinds of failure apart."""
    text = text.splitlines()[0] if text else ""
    text = re.sub(r"0x[0-9a-f]+", "A", text)
    text = re.sub(r"\d+", "N", text)
    text = re.sub(r"'[^']*'", "S", text)
    return text[:140]


# ---------------------------------------------------------------------------------------------------------------
# random graphs (hypothesis, cortado.testing): plain, ints, state, grad


def feed_array(rng, shape, dtype, lo, hi):
    """An array of ``dtype`` with values in [lo, hi] (NumPy's generator: hypothesis fills large arrays with one value)."""
    dtype = dt(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if not is_float(dtype):
        info = np.iinfo(dtype)
        lo, hi = max(math.ceil(lo), int(info.min)), min(math.floor(hi), int(info.max))
        return rng.integers(lo, hi + 1, shape).astype(dtype)
    lo, hi = T._inside(lo, dtype, +1), T._inside(hi, dtype, -1)
    return np.asarray(rng.uniform(lo, hi, shape)).astype(dtype)


_BIG = [False]
_ORIGINAL_SHAPES = T._input_shapes


def _input_shapes(draw, count, max_rank, max_side):
    """cortado.testing's shapes, or (while _BIG) rows of 63 to 1025 elements that broadcast together."""
    if not _BIG[0]:
        return _ORIGINAL_SHAPES(draw, count, max_rank, max_side)
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    inner = draw(st.sampled_from(INNER))
    base = [draw(st.integers(1, 24)) for _ in range(rank - 1)] + [inner]
    if rank == 3:
        base[0] = draw(st.integers(1, 4))
    shapes = []
    for _ in range(count):
        if draw(st.integers(0, 6)) == 0:
            shapes.append(())
            continue
        suffix = base[len(base) - draw(st.integers(1, len(base))):]
        shapes.append(tuple(1 if draw(st.integers(0, 4)) == 0 else d for d in suffix))
    return shapes


T._input_shapes = _input_shapes


def guarded(builder):
    """A builder whose step is dropped where cortado refuses it (mixed dtypes meet ops that take no bools, say)."""

    def build(draw, name, values):
        if not T._numeric(values):
            return None
        built = builder(draw, name, values)
        if built is None:
            return None
        try:
            T._call(ct, built[0], [v.term for v in values])
        except ct.CortadoError:
            return None
        return built

    return build


def aliased(builder, name):
    """The builder of ``name`` under another key (an op drawn more often)."""
    return lambda draw, _key, values: builder(draw, name, values)


def _cast_any(draw, name, values):
    """A cast to any dtype, ints and bool too, where the value's bounds fit the target."""
    i = draw(st.sampled_from(range(len(values))))
    v = values[i]
    target = draw(st.sampled_from(ALLDT))
    lo, hi = (0.0, 1.0) if v.is_bool else (v.lo, v.hi)
    if target in INTS:
        lo, hi = float(math.trunc(lo)), float(math.trunc(hi))
        info = np.iinfo(target)
        if lo < info.min or hi > info.max:
            return None
    elif target == "bool":
        lo, hi = 0.0, 1.0
    return T.Step(name, (i,), (("dtype", target),)), (lo, hi)


def _logical(draw, name, values):
    """logical_and / or / xor of any two values, bools too (cortado.testing's comparisons take numbers only)."""
    a = draw(st.sampled_from(range(len(values))))
    partners = [j for j in range(len(values)) if T._broadcastable(values[a].shape, values[j].shape)]
    b = draw(st.sampled_from(partners))
    return T.Step(name, (a, b)), (0.0, 1.0)


def _logical_not(draw, name, values):
    i = draw(st.sampled_from(range(len(values))))
    return T.Step(name, (i,)), (0.0, 1.0)


ELEMENTWISE = T.UNARY + T.BINARY + T.COMPARISONS + ["where", "sum", "max", "mean", "broadcast_to", "transpose",
                                                    "reshape", "flip"]
NEW_OPS = ["floor_divide", "remainder", "logical_and", "logical_or", "logical_xor", "logical_not", "sin", "cos",
           "where", "cast"]


def _graph_strategy(flavour, max_steps):
    if flavour == "float":
        builders = {name: T.BUILDERS[name] for name in T.ALL_OPS if name != "cast"}
        builders["cast"] = T._cast_builder(FLOATS)
        dtypes = FLOATS
    else:  # ints, bools, mixed dtypes; the newer ops drawn three times as often
        builders = {name: guarded(T.BUILDERS[name]) for name in ELEMENTWISE if name in T.BUILDERS}
        for name in ("logical_and", "logical_or", "logical_xor"):
            builders[name] = guarded(_logical)
        builders["logical_not"] = guarded(_logical_not)
        builders["cast"] = guarded(_cast_any)
        for name in NEW_OPS:
            for k in (1, 2):
                builders[f"{name}~{k}"] = aliased(builders[name], name)
        dtypes = FLOATS + ["float32", "int32", "int64", "int8", "uint8", "bool", "bool"]
    return T._graphs(builders, dtypes, 4, max_steps, 3, 5)


STRATEGIES = {}


def graph_strategy(flavour, max_steps=10):
    key = (flavour, max_steps)
    if key not in STRATEGIES:
        STRATEGIES[key] = _graph_strategy(flavour, max_steps)
    return STRATEGIES[key]


def layouts(backend):
    if backend == "cupy":
        return ["c", "c", "strided", "transposed", "flip", "device", "device", "device_strided"]
    return ["c", "c", "strided", "transposed", "flip", "fortran"]


@st.composite
def graph_cases(draw, mode, backend):
    flavour = {"plain": "float", "grad": "float", "ints": "mixed"}.get(mode) or draw(st.sampled_from(["float", "mixed"]))
    big = draw(st.integers(0, 4)) < 2
    _BIG[0], size = big, T.MAX_SIZE
    T.MAX_SIZE = 1 << 16 if big else size
    try:
        graph = draw(graph_strategy(flavour, 8 if mode == "grad" else 10))
    finally:
        _BIG[0], T.MAX_SIZE = False, size
    if max((v.size for v in graph.inputs), default=0) > 1024:
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
        feeds = {v.name: feed_array(rng, v.shape, v.dtype.name, *graph.bounds[v.name]) for v in graph.inputs}
    else:
        feeds = draw(T.feeds(graph))
    n_values = len(graph.inputs) + len(graph.steps)
    outs = list(graph.output_indices) + draw(st.lists(st.integers(0, n_values - 1), max_size=3))
    outs = list(draw(st.permutations(outs)))
    cfg = dict(recompute=draw(st.booleans()), layout=draw(st.sampled_from(layouts(backend))),
               layout_seed=draw(st.integers(0, 2 ** 31)), cuda_graph=draw(st.integers(0, 4)) > 0, flavour=flavour)
    if mode == "state":
        k = draw(st.integers(1, len(graph.inputs)))
        cfg["state"] = list(range(k))
        cfg["updates"] = [(s, draw(st.sampled_from(["suite", "elementwise", "raw", "coupled", "none"])),
                           draw(st.integers(0, n_values - 1)), draw(st.sampled_from([0.001, 0.01, 0.1])))
                          for s in range(k)]
        cfg["cuda_graph"] = draw(st.booleans())
    return dict(mode=mode, kind="graph", inputs=[(v.name, v.shape, v.dtype.name) for v in graph.inputs],
                steps=graph.steps, outs=outs, feeds=feeds, bounds=dict(graph.bounds), cfg=cfg,
                program=repr(graph) + f"\nreturned: {', '.join(f'v{i}' for i in outs)}")


def rebuild(inputs, steps, widen=False):
    """The recipe's values; ``widen``: float16 and bfloat16 variables, and casts unless it is "variables", as
    float32 (the GPU may keep a half-precision kernel's parts in float32: one of the answers accepted)."""
    wide = (lambda d: "float32" if d in HALVES else d) if widen else (lambda d: d)
    vals = [ct.var(n, s, wide(d)) for n, s, d in inputs]
    for step in steps:
        if widen is True and step.fn == "cast":
            step = T.Step(step.fn, step.args, tuple((k, wide(v) if k == "dtype" else v) for k, v in step.kwargs))
        vals.append(T._call(ct, step, vals))
    return vals


def build_updates(vals, ups, bounds):
    """Updates of the state variables, of several kinds (after /tmp/fzw/campaign.py), kept within their bounds."""
    updates = {}
    for s, kind, o, c in ups:
        v, out = vals[s], vals[o]
        if kind == "none":
            continue
        lo, hi = bounds[v.name]
        mid = (lo + hi) / 2
        if kind == "suite":
            updates[v] = v * 0.5 + ct.sum(ct.cast(out, v.dtype)) * c
        elif kind == "elementwise":
            try:
                ok = np.broadcast_shapes(out.shape, v.shape) == v.shape
            except ValueError:
                ok = False
            if ok and out.dtype != np.bool_ and v.dtype != np.bool_:
                g = ct.tanh(ct.cast(out, "float32" if v.dtype == np.float16 or not is_float(v.dtype) else v.dtype))
                upd = v * 0.5 + mid * 0.5 + ct.cast(ct.broadcast_to(g, v.shape), v.dtype) * ((hi - lo) * 0.2)
                updates[v] = ct.cast(upd, v.dtype)
            else:
                updates[v] = ct.logical_not(v) if v.dtype == np.bool_ else v * 0.5 + mid * 0.5
        elif kind == "raw":
            if out.shape == v.shape and out is not v:
                updates[v] = ct.cast(out, v.dtype)
            else:
                updates[v] = ct.logical_not(v) if v.dtype == np.bool_ else ct.negative(v) + (lo + hi)
        elif kind == "coupled":
            others = [w for w in vals[:len(bounds)] if w.shape == v.shape and w is not v]
            if others and v.dtype != np.bool_:
                w = others[0]
                lo2, hi2 = bounds[w.name]
                updates[v] = ct.cast((ct.cast(w, "float64") - lo2) * ((hi - lo) / (hi2 - lo2)) + lo, v.dtype)
            else:
                updates[v] = v if v.dtype == np.bool_ else v * 1.0
    return {v: (u if u.dtype == v.dtype else ct.cast(u, v.dtype)) for v, u in updates.items()}


def graph_program(case, widen=False):
    """(terms, inputs, state variables, updates) of a graph case (``widen``: as ``rebuild``'s)."""
    n = len(case["inputs"])
    vals = rebuild(case["inputs"], case["steps"], widen)
    terms = [vals[i] for i in case["outs"]]
    if case["mode"] == "grad":
        terms = RC.with_gradients(terms, vals[:n])
    state, updates = [], {}
    if case["mode"] == "state":
        state = [vals[s] for s in case["cfg"]["state"]]
        updates = build_updates(vals, case["cfg"]["updates"], case["bounds"])
    return terms, vals[:n], state, updates


class FreshUnavailable(Exception):
    """This hypothesis has not the internals ``draw_fresh`` uses: the campaign falls back to ``@given``."""


def draw_fresh(strategy, seed):
    """One example of ``strategy`` drawn from its own ``random.Random(seed)``: independent examples, where
    ``@given``'s engine mutates one example into the next (a few dozen GPU programs a mode want variety), and each
    reproducible from its seed alone (for this hypothesis version). Uses hypothesis internals, checked once."""
    try:
        from hypothesis.control import BuildContext
        from hypothesis.internal.conjecture.data import ConjectureData

        data = ConjectureData(random=random.Random(seed))
        for kwargs in (dict(is_final=False, wrapped_test=None), dict(is_final=False), {}):
            try:
                context = BuildContext(data, **kwargs)
                break
            except TypeError:
                continue
        else:
            raise FreshUnavailable("BuildContext")
    except (ImportError, TypeError, AttributeError) as error:
        raise FreshUnavailable(str(error)) from None
    with context:
        return data.draw(strategy)


def run_graph(camp, case):
    terms, variables, state_vars, updates = graph_program(case)
    feeds, cfg = case["feeds"], case["cfg"]
    state = {v: feeds[v.name] for v in state_vars}
    inputs = [v for v in variables if v not in state]

    def kept(feed):
        """The answers of the program with half-precision variables (and casts, or not) widened to float32."""
        if not any(d in HALVES for _, _, d in case["inputs"]):
            return None
        casts = any(s.fn == "cast" and dict(s.kwargs).get("dtype") in HALVES for s in case["steps"])
        wide_feed = {k: (a.astype(np.float32) if a.dtype.name in HALVES else a) for k, a in feed.items()}
        answers = []
        for widen in (True, "variables") if casts else (True,):
            try:
                wide_terms, _, wide_state, wide_updates = graph_program(case, widen=widen)
            except ct.CortadoError:
                continue
            targets = wide_terms + [wide_updates[w] for w in wide_state if w in wide_updates]
            answers.append(ct.evaluate(targets, restrict(targets, wide_feed)))
        return answers

    camp.execute(case, terms, inputs, feeds, state=state, updates=updates, calls=3,
                 options=dict(recompute=cfg["recompute"], debug=True, cuda_graph=cfg["cuda_graph"]),
                 checker="graph", kept=kept, layout=cfg["layout"], layout_seed=cfg["layout_seed"],
                 bounds=case["bounds"])


# ---------------------------------------------------------------------------------------------------------------
# seed-driven cases: each a function of a NumPy generator and a variable maker V (which may widen half precision)


def pick(rng, xs):
    return xs[int(rng.integers(len(xs)))]


def make_V(widen):
    def V(name, shape, dtype):
        return ct.var(name, shape, "float32" if widen and dtype in HALVES else dtype)
    return V


def normal(rng, shape, dtype, scale=1.0, wide=False):
    x = rng.standard_normal(shape) * scale
    if wide:
        x = x * 10.0 ** rng.uniform(-3, 3, shape)
    if dtype in HALVES:
        x = np.clip(x, -1000, 1000)
    return np.asarray(x).astype(dt(dtype))


def hard_pairs(dtype, size, rng):
    """(a, b) of ``size`` elements: every pair of the dtype's hard values (tests/test_floor_divide.py), then random
    pairs over several magnitudes."""
    d = dt(dtype)
    if not is_float(d):
        info = np.iinfo(d)
        hard = np.array(sorted({0, 1, 2, 3, 7, int(info.max), int(info.max) - 1, int(info.min), int(info.min) + 1,
                                -1 % (int(info.max) + 1), max(int(info.min), -3)}), d)
        wide = rng.integers(int(info.min), int(info.max), (2, size), endpoint=True).astype(d)
    else:
        hard = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 7.0, -7.0, 1e-3, 1e4, np.inf, -np.inf, np.nan])
        with np.errstate(over="ignore"):
            hard = hard.astype(d)
            wide = (rng.standard_normal((2, size)) * 10.0 ** rng.integers(-3, 4, (2, size))).astype(d)
    a, b = (x.ravel() for x in np.meshgrid(hard, hard))
    a, b = np.concatenate([a, wide[0]])[:size], np.concatenate([b, wide[1]])[:size]
    perm = rng.permutation(size)
    return a[perm], b[perm]


def case_newops(rng, V):
    """sin, cos, floor_divide, remainder and the logical ops over rows of 63 to 1025, NumPy's hard values too."""
    kind = pick(rng, ["sincos", "div", "div", "logical", "where"])
    shape = (int(rng.integers(1, 41)), pick(rng, INNER))
    size = shape[0] * shape[1]
    desc = dict(kind=kind, shape=shape)
    if kind == "sincos":
        dtype = pick(rng, FLOATS)
        scale = pick(rng, [4.0, 100.0, 1e5 if dtype in ("float32", "float64") else 100.0])
        values = np.concatenate([rng.uniform(-scale, scale, size),
                                 [0.0, -0.0, 1e-30, 3e4, -1e5, np.inf, -np.inf, np.nan]])[:size]
        x = V("x", shape, dtype)
        with np.errstate(over="ignore"):
            feeds = {"x": rng.permutation(values).astype(dt(dtype)).reshape(shape)}
        terms = [ct.sin(x), ct.cos(x), ct.sin(x) * ct.cos(x), ct.sum(ct.sin(x * 3.0 + 1.0), axis=-1)]
        checkers = ["ulps4", "ulps4", "ulps8", "graph"]
        inputs = [x]
    elif kind == "div":
        dtype = pick(rng, FLOATS + ["int8", "int32", "int64", "uint8", "uint32"])
        bshape = pick(rng, [shape, (1, shape[1]), (shape[0], 1), ()])
        a_values, b_values = hard_pairs(dtype, size, rng)
        a, b = V("a", shape, dtype), V("b", bshape, dtype)
        b_values = b_values[:math.prod(bshape)].reshape(bshape)
        feeds = {"a": a_values.reshape(shape), "b": b_values}
        left = 5 if dtype[0] == "u" else -5
        terms = [a // b, a % b, ct.floor_divide(a, 3), ct.remainder(left, b), (a % b) * 2 + a // 3]
        checkers = ["exact0", "exact0", "exact0", "exact0", "graph"]
        if dtype in HALVES:  # a scalar in a fused kernel of half precision: kept in float32 by the GPU
            checkers[2] = checkers[3] = "graph"
        inputs = [a, b]
    elif kind == "logical":
        dtype = pick(rng, ["bool", "float32", "float64", "int32", "int64", "float16", "bfloat16", "uint8"])
        bshape = pick(rng, [shape, (1, shape[1]), (shape[0], 1), ()])
        op = pick(rng, ["logical_and", "logical_or", "logical_xor", "logical_not"])
        a, b = V("a", shape, dtype), V("b", bshape, dtype)

        def values(s):
            if dtype == "bool":
                return rng.random(s) < 0.5
            if dtype[0] == "u":
                x = rng.integers(0, 255, s)
            elif dtype.startswith("int"):
                x = rng.integers(-1000, 1000, s)
            else:
                x = rng.choice([0.0, -0.0, 1.0, -2.0, np.nan, np.inf, 0.5, 3.0], s)
            return np.where(rng.random(s) < 0.4, 0, x).astype(dt(dtype))

        feeds = {"a": values(shape), "b": values(bshape)}
        if op == "logical_not":
            y = ct.logical_not(a)
            inputs = [a]
            del feeds["b"]
        else:
            y = getattr(ct, op)(a, b)
            inputs = [a, b]
        other = a * 2 if dtype != "bool" else ct.logical_not(a)
        terms = [y, ct.where(y, a, other), ct.sum(y, axis=-1), ct.logical_not(y) & ct.not_equal(a, a)]
        checkers = ["exact", "graph", "exact", "exact"]
        desc.update(op=op)
    else:  # where and comparisons of NaN, signed zeros and infinities
        dtype = pick(rng, FLOATS)
        a, b = V("a", shape, dtype), V("b", shape, dtype)
        a_values, b_values = hard_pairs(dtype, size, rng)
        feeds = {"a": a_values.reshape(shape), "b": b_values.reshape(shape)}
        terms = [ct.where(a < b, a, b), ct.where(a >= b, a, b), ct.maximum(a, b), ct.minimum(a, b), ct.equal(a, b),
                 ct.where(ct.logical_or(a > 1, b < 0), a, b * 2)]
        checkers = ["exact", "exact", "exact", "exact", "exact", "graph"]
        inputs = [a, b]
    desc.update(dtype=dtype)
    return dict(terms=terms, inputs=inputs, feeds=feeds, checkers=checkers, desc=desc)


REDUCE_OPS = ["sum", "mean", "max", "min", "logsumexp", "softmax", "log_softmax", "pattern_lse", "pattern_max",
              "pattern_sigmoid", "variance"]
SPECIAL_SHAPES = [(33, 65, 17), (2, 3, 1030), (4096, 3), (1030, 129), (520, 2, 64), ((1 << 20) + 3,),
                  (3, (1 << 17) + 1), (8, 4100), (2, 2, 66000), (5000, 7), (1, 1, 1025), (257, 1, 63)]


def case_reduce(rng, V):
    """Reductions over chosen axis sets of arrays with inner axes of 63 to 1025 (rows, columns, multi-block)."""
    if rng.random() < 0.3:
        shape = pick(rng, SPECIAL_SHAPES)
    else:
        inner = pick(rng, INNER)
        a, b = int(rng.integers(1, 41)), int(rng.integers(1, 41))
        while a * b * inner > 300_000:
            a, b = max(1, a // 2), max(1, b - 3)
        shape = (a, b, inner)
        if rng.random() < 0.4:
            shape = tuple(shape[i] for i in rng.permutation(3))
        if rng.random() < 0.2:
            shape = shape[1:]
    op = pick(rng, REDUCE_OPS)
    float_only = op not in ("sum", "mean", "max", "min")
    dtype = pick(rng, FLOATS if float_only else FLOATS + ["int32", "int64", "bool", "float32"])
    if dtype == "bool" and op in ("mean", "min"):
        op = "sum"
    pre = pick(rng, ["none", "none", "scale", "transpose", "affine", "flip"])
    ndim = len(shape)
    x = V("x", shape, dtype)
    y = V("y", shape[-1:], dtype if is_float(dt(dtype)) else "float32")
    subsets = [tuple(a for a in range(ndim) if m >> a & 1) for m in range(1, 1 << ndim)] + [None]
    chosen = subsets if rng.random() < 0.25 else [subsets[i] for i in
                                                   rng.choice(len(subsets), min(len(subsets), int(rng.integers(1, 4))),
                                                              replace=False)]
    source = x
    if pre == "scale" and dtype != "bool":
        source = x * 2
    elif pre == "transpose":
        source = ct.transpose(x, tuple(range(1, ndim)) + (0,))
    elif pre == "affine" and is_float(dt(dtype)):
        source = x * 0.5 + 1.0
    elif pre == "flip":
        source = ct.flip(x, axis=ndim - 1)
    terms = []
    for axes in chosen:
        keep = bool(rng.random() < 0.3)
        if op in ("softmax", "log_softmax"):
            t = getattr(ct, op)(source, axis=axes if axes is not None else tuple(range(ndim)))
        elif op == "min":
            t = ct.min(source, axis=axes, keepdims=keep)
        elif op in ("sum", "mean", "max", "logsumexp"):
            t = getattr(ct, op)(source, axis=axes, keepdims=keep)
        elif op == "pattern_lse":  # tests/test_gpu.py's reductions
            t = ct.log1p(ct.sum(ct.exp(ct.tanh(x) * y), axis=axes)) * 0.5
        elif op == "pattern_max":
            t = ct.max(x + y, axis=axes, keepdims=True) - 1.0
        elif op == "pattern_sigmoid":
            t = ct.mean(ct.sigmoid(source), axis=axes)
        else:
            centered = source - ct.mean(source, axis=axes, keepdims=True)
            t = ct.mean(centered * centered, axis=axes)
        if t not in terms:
            terms.append(t)
    if dtype == "bool":
        xv = rng.random(shape) < 0.5
    elif not is_float(dt(dtype)):
        xv = rng.integers(-50, 50, shape).astype(dt(dtype))
    else:
        xv = normal(rng, shape, dtype, wide=op in ("sum", "mean") and rng.random() < 0.5)
    feeds = {"x": xv}
    inputs = [x]
    if any("y" in ct.Graph([t]).variables_by_name() for t in terms):
        feeds["y"] = normal(rng, shape[-1:], dtype if is_float(dt(dtype)) else "float32")
        inputs.append(y)
    desc = dict(shape=shape, dtype=dtype, op=op, pre=pre, axes=[list(a) if a is not None else None for a in chosen])
    return dict(terms=terms, inputs=inputs, feeds=feeds, checkers="reduce", desc=desc,
                layout=pick(rng, ["c", "c", "fortran", "flip", "strided", "transposed", "device"]))


SIZES = [1, 2, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257]
KS = SIZES + [511, 512, 513, 1023, 1025]
FORMS = ["matmul", "matmul_tA", "matmul_tB", "matmul_tAB", "batched", "batched_bcast", "batched_lead1", "ein_ij_kj",
         "ein_ji_jk", "ein_bij_bkj", "ein_ijk_kl", "ein_ij_j", "ein_i_ij", "ein_bji_bjk", "matvec"]
EPILOGUES = ["none", "none", "bias", "relu", "gelu", "bias_relu", "bias_gelu", "scale", "+c", "c-", "cast", "sum",
             "bgrad"]


def case_gemm(rng, V):
    """Products around the GEMM's tile edges, with the epilogues cuBLASLt lowering folds in, and gradients."""
    M, N, K = pick(rng, SIZES), pick(rng, SIZES), pick(rng, KS)
    while M * N * K > 20_000_000:
        K = pick(rng, SIZES)
    B = pick(rng, [1, 2, 3])
    dtype = pick(rng, ["float32", "float32", "bfloat16", "bfloat16", "float16", "float16", "float64"])
    form = pick(rng, FORMS)
    epi = pick(rng, EPILOGUES)
    grad = rng.random() < 0.25
    quarters = rng.random() < 0.2  # exact products: relu's input exactly 0 at many places

    def W(n, s):
        return V(n, s, dtype)

    if form == "matmul":
        a, b = W("a", (M, K)), W("b", (K, N)); y = a @ b
    elif form == "matmul_tA":
        a, b = W("a", (K, M)), W("b", (K, N)); y = ct.transpose(a) @ b
    elif form == "matmul_tB":
        a, b = W("a", (M, K)), W("b", (N, K)); y = a @ ct.transpose(b)
    elif form == "matmul_tAB":
        a, b = W("a", (K, M)), W("b", (N, K)); y = ct.transpose(a) @ ct.transpose(b)
    elif form == "batched":
        a, b = W("a", (B, M, K)), W("b", (B, K, N)); y = a @ b
    elif form == "batched_bcast":
        a, b = W("a", (B, M, K)), W("b", (K, N)); y = a @ b
    elif form == "batched_lead1":
        a, b = W("a", (1, M, K)), W("b", (B, K, N)); y = ct.matmul(a, b)
    elif form == "ein_ij_kj":
        a, b = W("a", (M, K)), W("b", (N, K)); y = ct.einsum("ij,kj->ik", a, b)
    elif form == "ein_ji_jk":
        a, b = W("a", (K, M)), W("b", (K, N)); y = ct.einsum("ji,jk->ik", a, b)
    elif form == "ein_bij_bkj":
        a, b = W("a", (B, M, K)), W("b", (B, N, K)); y = ct.einsum("bij,bkj->bik", a, b)
    elif form == "ein_ijk_kl":
        a, b = W("a", (B, M, K)), W("b", (K, N)); y = ct.einsum("ijk,kl->ijl", a, b)
    elif form == "ein_ij_j":
        a, b = W("a", (M, K)), W("b", (K,)); y = ct.einsum("ij,j->i", a, b)
    elif form == "ein_i_ij":
        a, b = W("a", (K,)), W("b", (K, N)); y = ct.einsum("i,ij->j", a, b)
    elif form == "ein_bji_bjk":
        a, b = W("a", (B, K, M)), W("b", (B, K, N)); y = ct.einsum("bji,bjk->bik", a, b)
    else:
        a, b = W("a", (M, K)), W("b", (K,)); y = a @ b
    inputs = [a, b]
    alpha = pick(rng, [1.0, 1.0, -0.5, 2.0])
    out = y * alpha if alpha != 1.0 else y
    extra = []
    if epi in ("+c", "c-"):
        c = W("c", y.shape)
        inputs.append(c)
        out = out + c if epi == "+c" else c - out
    if "bias" in epi and y.ndim:
        bias = W("bias", y.shape[-1:])
        inputs.append(bias)
        out = out + bias
    if "relu" in epi:
        out = ct.relu(out)
    if "gelu" in epi:
        out = ct.gelu(out)
    if epi == "scale":
        out = out * 0.5 - 1.0
    if epi == "cast":
        out = ct.cast(out, pick(rng, [d for d in ("float32", "bfloat16", "float16") if d != dtype]))
    if epi == "sum" and out.ndim:
        out = ct.sum(out, axis=-1)
    if epi == "bgrad":  # a bias gradient beside the product: the sums of an operand (bgrad_a / bgrad_b epilogues)
        if a.ndim >= 2:
            extra.append(ct.sum(a, axis=0))
        if b.ndim >= 2:
            extra.append(ct.sum(b, axis=-1))
    terms = [out] + extra
    if grad:
        target = inputs[:]
        if out.dtype == np.float64 or not is_float(out.dtype):
            total = ct.sum(out)
        else:
            total = ct.sum(ct.cast(out * out if rng.random() < 0.5 else out, "float32"))
        terms += list(ct.grad(total, target))
    feeds = {}
    for v in inputs:
        if quarters:
            x = rng.integers(-4, 5, v.shape) / 4
        else:
            x = rng.standard_normal(v.shape)
            if rng.random() < 0.2:
                x = x * 10.0 ** rng.uniform(-2, 2, v.shape)
        feeds[v.name] = np.asarray(x).astype(dt(dtype))
    desc = dict(M=M, N=N, K=K, B=B, dtype=dtype, form=form, epilogue=epi, alpha=alpha, grad=grad, quarters=quarters)
    return dict(terms=terms, inputs=inputs, feeds=feeds, checkers="gemm", desc=desc,
                layout=pick(rng, ["c", "c", "c", "transposed", "strided", "device"]))


def case_index(rng, V, gpu):
    """take / take_along_axis / add_at, embedding-like: repeats, several chunks of 1024 indices, and (on the GPU)
    indices outside the axis, which the GPU clamps into it (the reference is fed the clamped ones)."""
    kind = pick(rng, ["add_at", "add_at", "take", "take_grad", "take_along"])
    desc = dict(kind=kind)
    outside = gpu and rng.random() < 0.5

    def index_values(shape, size, span, idtype):
        low = 0 if idtype[0] == "u" else -min(span, size)
        idx = rng.integers(low, min(span, size), shape)
        if outside and idx.size and idtype[0] != "u":
            flat = idx.reshape(-1)
            for k in rng.choice(flat.size, min(flat.size, 3), replace=False):
                flat[k] = pick(rng, [size, size + 5, -size - 1, -size - 7, 2 ** 30])
        elif outside and idx.size:
            flat = idx.reshape(-1)
            flat[int(rng.integers(flat.size))] = min(255, size + 3)
        return idx.astype(dt(idtype))

    if kind == "add_at":
        dtype = pick(rng, FLOATS + ["int32", "int64"])
        rows, cols = int(rng.integers(1, 300)), pick(rng, [1, 3, 8, 63, 64, 65, 128])
        n = pick(rng, [7, 1023, 1024, 1025, 2047, 2048, 2049, 3000, 5000])
        axis = pick(rng, [0, 1, None, -1])
        if axis is None:
            xshape = (rows, cols)
            ishape = (n,) if rng.random() < 0.7 else (n // 7, 7)
            vshape, size = ishape, rows * cols
        elif axis == 0:
            xshape, ishape, size = (rows, cols), (n,), rows
            vshape = (n, cols)
        else:
            xshape = (cols, rows)
            ishape = (n,) if rng.random() < 0.7 else (n // 5, 5)
            vshape, size = (cols,) + ishape, rows
        span = min(size, pick(rng, [size, max(1, size // 10), 2]))
        idtype = pick(rng, ["int32", "int64", "int64"] + (["uint8"] if size <= 255 else []))
        x, v = V("x", xshape, dtype), V("v", vshape, dtype)
        as_input = rng.random() < 0.75
        idx_values = index_values(ishape, size, span, idtype) if as_input else \
            rng.integers(-span, span, ishape).astype(np.int64)
        i = V("i", ishape, idtype) if as_input else idx_values
        pre, post = pick(rng, ["none", "none", "double", "exp"]), rng.random() < 0.5
        if pre == "exp" and dtype not in ("float32", "float64"):
            pre = "none"
        vv = ct.exp(v) if pre == "exp" else v
        t = ct.add_at(x * 2 if pre == "double" else x, i, vv, axis=axis)
        terms, checkers = [t], ["exact" if pre == "none" else "graph"]
        if post:
            terms.append(ct.sum(t, axis=0))
            checkers.append("graph")
        feeds = {"x": normal(rng, xshape, dtype) if is_float(dt(dtype)) else rng.integers(-1000, 1000, xshape).astype(dtype),
                 "v": normal(rng, vshape, dtype) if is_float(dt(dtype)) else rng.integers(-1000, 1000, vshape).astype(dtype)}
        inputs = [x, v]
        if as_input:
            feeds["i"] = idx_values
            inputs.append(i)
        desc.update(dtype=dtype, xshape=xshape, ishape=ishape, axis=axis, span=span, idtype=idtype, pre=pre,
                    indices_fed=as_input)
        sizes = {"i": size}
    elif kind in ("take", "take_grad"):
        dtype = pick(rng, FLOATS + ["int32"] if kind == "take" else FLOATS)
        vocab, width = pick(rng, [1, 7, 37, 50, 1000, 3000]), pick(rng, [1, 2, 7, 8, 16, 64, 96, 768])
        while vocab * width > 2_000_000:
            width = max(1, width // 2)
        tshape = pick(rng, [(1, 1024), (3, 5), (4, 700), (8, 1024), (1025,), (2049,), (5000,)])
        axis = pick(rng, [0, 0, 0, 1]) if kind == "take" else 0
        table = V("e", (vocab, width), dtype)
        size = table.shape[axis]
        idtype = pick(rng, ["int32", "int64"])
        tokens = V("t", tshape, idtype)
        span = pick(rng, [size, max(1, size // 10), 2])
        tok = index_values(tshape, size, span, idtype)
        if rng.random() < 0.3 and tok.ndim == 2:
            tok[:, :min(100, tok.shape[1])] = min(7, size - 1)  # one place taking many rows, from every chunk
        taken = ct.take(table, tokens, axis=axis)
        values = normal(rng, table.shape, dtype) if is_float(dt(dtype)) else \
            rng.integers(-100, 100, table.shape).astype(dtype)
        feeds = {"e": values, "t": tok}
        inputs = [table, tokens]
        if kind == "take":
            terms = [taken, taken * 2 if is_float(taken.dtype) else taken + 1, ct.cast(taken, "float32")]
            checkers = ["exact", "graph", "exact"]
        else:
            loss = ct.sum(ct.cast(taken, "float32") ** 2) if dtype != "float64" else ct.sum(taken ** 2)
            (gradient,) = ct.grad(loss, [table])
            terms, checkers = [gradient, loss], ["graph", "graph"]
        desc.update(dtype=dtype, vocab=vocab, width=width, tokens=tshape, axis=axis, span=span, idtype=idtype)
        sizes = {"t": size}
    else:
        dtype = pick(rng, FLOATS)
        rows, cols, k = int(rng.integers(1, 2100)), pick(rng, [1, 5, 7, 300, 1025]), pick(rng, [1, 1, 2, 3])
        x = V("x", (rows, cols), dtype)
        labels = V("y", (rows, k), "int64")
        picked = ct.take_along_axis(x, labels, axis=1)
        loss = ct.sum(ct.cast(picked, "float32") * 2.0) + ct.sum(ct.cast(x, "float32") ** 2)
        (gradient,) = ct.grad(loss, [x])
        terms, checkers = [picked, gradient], ["exact", "graph"]
        feeds = {"x": normal(rng, (rows, cols), dtype), "y": index_values((rows, k), cols, cols, "int64")}
        inputs = [x, labels]
        desc.update(dtype=dtype, rows=rows, cols=cols, k=k)
        sizes = {"y": cols}
    ref_feeds = dict(feeds)
    for name, size in sizes.items():
        if name in feeds:
            ref_feeds[name] = clamped(feeds[name], size)
    if not gpu:  # the CPU raises on an index outside the axis (by design): it is fed the clamped ones
        feeds = ref_feeds
    desc["outside"] = outside
    return dict(terms=terms, inputs=inputs, feeds=feeds, ref_feeds=ref_feeds, checkers=checkers, desc=desc,
                layout=pick(rng, ["c", "c", "transposed", "device"]))


CHAIN_UNARY = ["exp", "log", "sqrt", "tanh", "sigmoid", "relu", "abs", "sin", "cos", "negative", "softplus", "gelu",
               "log1p", "expm1", "sign", "rint", "silu"]
CHAIN_BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "where_gt", "power2", "floor_divide",
                "remainder"]


def case_edge_chain(rng, V):
    """An elementwise chain over thousands of elements (one fused kernel, vectors of 4, a ragged tail), fed NaN,
    infinities, the dtype's extremes, signed zeros and subnormals; a reduction after it."""
    dtype = pick(rng, FLOATS)
    n = pick(rng, [1000, 1024, 1027, 4097, 65539])
    shape = pick(rng, [(n,), (max(1, n // 64), 64), (3, n)])
    if math.prod(shape) > 200_000:
        shape = (n,)
    x, y = V("x", shape, dtype), V("y", shape[-1:], dtype)
    t, ops = x, []
    for _ in range(int(rng.integers(2, 7))):
        if rng.random() < 0.55:
            op = pick(rng, CHAIN_UNARY)
            t = getattr(ct, op)(t)
        else:
            op = pick(rng, CHAIN_BINARY)
            other = y if rng.random() < 0.6 else pick(rng, [2.0, 0.5, -1.5, 3.0, 1e-3, 100.0])
            if op == "where_gt":
                t = ct.where(t > other, t, other * 2.0 if not isinstance(other, float) else x)
            elif op == "power2":
                t = t ** 2
            else:
                swap = rng.random() < 0.3 and op not in ("floor_divide", "remainder")
                t = getattr(ct, op)(other, t) if swap else getattr(ct, op)(t, other)
            op = f"{op}({'y' if other is y else other})"
        ops.append(op)
    if rng.random() < 0.2:
        t = ct.cast(t, pick(rng, [d for d in FLOATS if d != dtype]))
        ops.append(f"cast({t.dtype.name})")
    terms = [t]
    tail = pick(rng, ["none", "sum", "max", "logsumexp", "mean"])
    if tail != "none":
        terms.append(getattr(ct, tail)(t, axis=-1))
    grads = dtype in ("float32", "float64") and rng.random() < 0.3
    if grads:
        used = ct.Graph(terms).variables_by_name()
        terms = RC.with_gradients(terms, [v for v in (x, y) if v.name in used])
    edges = TE._edges(dt(dtype))
    feeds = {}
    for v in (x, y):
        a = normal(rng, v.shape, dtype, scale=2.0).reshape(-1)
        count = max(1, int(a.size * pick(rng, [0.01, 0.05, 0.2])))
        places = rng.choice(a.size, min(count, a.size), replace=False)
        with np.errstate(over="ignore"):
            a[places] = np.array([edges[int(k)] for k in rng.integers(len(edges), size=places.size)]).astype(a.dtype)
        feeds[v.name] = a.reshape(v.shape)
    inputs = [v for v in (x, y) if v.name in ct.Graph(terms).variables_by_name()]
    feeds = {v.name: feeds[v.name] for v in inputs}
    desc = dict(kind="fused_chain", dtype=dtype, shape=shape, ops=ops, tail=tail, grads=grads)
    return dict(terms=terms, inputs=inputs, feeds=feeds, checkers="edges", desc=desc,
                layout=pick(rng, ["c", "c", "device", "strided"]))


@st.composite
def edge_cases(draw, backend):
    kind = draw(st.sampled_from(["graph", "graph", "half", "chain", "fused", "fused"]))
    layout = draw(st.sampled_from(layouts(backend)))
    common = dict(mode="edges", layout=layout, layout_seed=draw(st.integers(0, 2 ** 31)))
    if kind in ("graph", "half"):
        graph = draw(T.graphs(ops=T.ALL_OPS, dtypes=("float32", "float64") if kind == "graph" else HALVES))
        feeds = draw(TE._at_edges(draw(T.feeds(graph))))
        return dict(common, kind=kind, inputs=[(v.name, v.shape, v.dtype.name) for v in graph.inputs],
                    steps=graph.steps, outs=list(graph.output_indices), feeds=feeds, grads=kind == "graph",
                    program=repr(graph))
    if kind == "chain":
        steps, values = draw(TE._constant_chains())
        return dict(common, kind=kind, chain=steps, feeds={"x": values}, program=f"x: float32[4]; chain {steps}")
    return dict(common, kind="fused", seed=draw(st.integers(0, 2 ** 63 - 1)))


def run_edges(camp, case):
    kind = case["kind"]
    if kind == "fused":
        return run_seeded(camp, case, case_edge_chain)
    if kind == "chain":
        x = ct.var("x", (4,))
        terms, inputs = RC.with_gradients([TE._chain(x, case["chain"])], [x]), [x]
        kept = None
    else:
        vals = rebuild(case["inputs"], case["steps"])
        inputs = vals[:len(case["inputs"])]
        terms = [vals[i] for i in case["outs"]]
        if case["grads"]:
            terms = RC.with_gradients(terms, inputs)

        def kept(feed):
            if kind != "half":
                return None
            wide = rebuild(case["inputs"], case["steps"], widen=True)
            targets = [wide[i] for i in case["outs"]]
            wide_feed = {k: a.astype(np.float32) for k, a in feed.items()}
            return [ct.evaluate(targets, restrict(targets, wide_feed))]
    camp.execute(case, terms, inputs, case["feeds"], calls=3, checker="edges", kept=kept, layout=case["layout"],
                 layout_seed=case["layout_seed"])


def run_seeded(camp, case, maker):
    seed = case["seed"]
    gpu = camp.backend == "cupy"
    args = (gpu,) if maker is case_index else ()
    made = maker(np.random.default_rng(seed), make_V(False), *args)
    case["desc"] = made["desc"]

    def kept(feed):
        wide = maker(np.random.default_rng(seed), make_V(True), *args)
        if all(t.dtype == w.dtype for t, w in zip(made["terms"], wide["terms"])) and \
                all(v.dtype == w.dtype for v, w in zip(made["inputs"], wide["inputs"])):
            return None
        wide_feed = {k: (a.astype(np.float32) if np.asarray(a).dtype.name in HALVES else a) for k, a in feed.items()}
        return [ct.evaluate(wide["terms"], restrict(wide["terms"], wide_feed))]

    camp.execute(case, made["terms"], made["inputs"], made["feeds"], ref_feeds=made.get("ref_feeds"), calls=3,
                 checker=made["checkers"], kept=kept, layout=made.get("layout", "c"), layout_seed=seed,
                 options=dict(cuda_graph=bool(seed % 5)))


# ---------------------------------------------------------------------------------------------------------------
# the campaign


def _float_bounds_ok(value, bounds):
    value = np.asarray(value)
    if not is_float(value.dtype):
        return True
    v = value.astype(np.float64)
    return bool(np.all(v >= bounds[0]) and np.all(v <= bounds[1]))


class Campaign:
    def __init__(self, backend, out, seconds, seed, cap, verbose=False, resume=None):
        self.backend, self.out, self.seed, self.cap, self.verbose = backend, Path(out), seed, cap, verbose
        self.start = T0
        self.deadline = self.start + seconds
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "cases").mkdir(exist_ok=True)
        self.failures = self.out / "failures.jsonl"
        self.kinds, self.logged, self.stats, self.refusals, self.ops = {}, 0, {}, {}, {}
        self.restarts, self.position, self.argv, self.resumed_at = 0, None, [], None
        if resume is None:
            self.failures.write_text("")
        else:  # a fresh process after the last lost its CUDA context: the campaign's clock and counts go on
            for name in ("start", "deadline", "kinds", "logged", "stats", "refusals", "ops", "restarts"):
                setattr(self, name, resume[name])
            self.resumed_at = resume["position"]
        self.mode = None
        self.inject = 0.0
        self.engine = "fresh"
        self.strict = False
        self.inject_rng = np.random.default_rng(seed)  # (hypothesis reseeds NumPy's global generator each example)
        self.cut = False  # an example was cut at the campaign's end
        signal.signal(signal.SIGALRM, _alarm)

    # -- bookkeeping --

    def count(self, what, n=1):
        s = self.stats.setdefault(self.mode, {})
        s[what] = s.get(what, 0) + n

    def record(self, category, stage, case, sig, **info):
        signal.setitimer(signal.ITIMER_REAL, 0)  # no alarm while writing
        self.count(category)
        key = f"{case['mode']}|{category}|{sig}"
        self.kinds[key] = self.kinds.get(key, 0) + 1
        first = self.kinds[key] == 1
        line = dict(mode=case["mode"], category=category, stage=stage, signature=sig, backend=self.backend,
                    kind=case.get("kind"), seed=case.get("seed"), draw_seed=case.get("draw_seed"),
                    campaign_seed=self.seed, engine=self.engine,
                    desc=case.get("desc"), program=case.get("program"), cfg=case.get("cfg"),
                    dtypes=case.get("dtypes"), shapes=case.get("shapes"), outputs=case.get("outputs"), **info)
        if "feeds" in case:
            line["feeds"] = arrays_json(case["feeds"])
        print(f"  [{case['mode']}] {category.upper()} at {stage}: {sig[:160]}", flush=True)
        if self.verbose:
            print(json.dumps(line, indent=1, default=str))
        if first and self.logged < MAX_LINES:
            self.logged += 1
            path = self.out / "cases" / f"{self.logged:04d}.pkl"
            with open(path, "wb") as f:
                pickle.dump(case, f)
            line["case_file"] = str(path)
            line["replay"] = f"python3 benchmarks/results/h200/experiments/gpu_fuzz/campaign.py --replay {path} --backend {self.backend}"
            with open(self.failures, "a") as f:
                f.write(json.dumps(line, default=str) + "\n")

    def healthy(self):
        """Whether the GPU still runs work (an illegal address or a broken capture leaves the context unusable)."""
        if self.backend != "cupy":
            return True
        try:
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
            return float(cupy.arange(8, dtype=cupy.float32).sum()) == 28.0
        except Exception:  # noqa: BLE001
            return False

    def check_health(self):
        """After a crash or a timeout on the GPU: where the context is lost, go on in a fresh process."""
        if self.backend == "cupy" and not self.healthy():
            self.count("context_lost")
            self.restart()

    def restart(self):
        signal.setitimer(signal.ITIMER_REAL, 0)
        if self.restarts >= MAX_RESTARTS or self.position is None:
            print("  the GPU's context is lost and no restart is left: the campaign ends here", flush=True)
            self.cut = True
            return
        path = self.out / "resume.json"
        state = {name: getattr(self, name) for name in ("start", "deadline", "kinds", "logged", "stats", "refusals",
                                                         "ops")}
        state.update(restarts=self.restarts + 1, position=self.position, engine=self.engine)
        path.write_text(json.dumps(state))
        print(f"  the GPU's context is lost: going on in a fresh process (restart {self.restarts + 1})", flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *self.argv, "--resume", str(path)])

    def options(self, given):
        options = dict(given or {})
        if self.backend != "cupy":
            options.pop("cuda_graph", None)
        return options

    # -- running a program --

    def device_layout(self, feeds, layout, seed):
        rng = np.random.default_rng(seed)
        fed = {}
        for name, a in feeds.items():
            a = np.asarray(a)
            if layout.startswith("device") and self.backend == "cupy":
                import cupy

                try:
                    if layout == "device_strided" and a.ndim:
                        big = cupy.zeros(tuple(n * 2 for n in a.shape), a.dtype)
                        view = big[tuple(slice(None, None, 2) for _ in a.shape)]
                        view[...] = cupy.asarray(a)
                        fed[name] = view
                    else:
                        fed[name] = cupy.asarray(a)
                except Exception:  # noqa: BLE001 (a dtype CuPy cannot hold: fed from the host)
                    fed[name] = a
            else:
                fed[name] = relayout(rng, a, "c" if layout.startswith("device") else layout)
        return fed

    def cpu_verdict(self, terms, inputs, state, updates, ref_feeds):
        """Whether the CPU (the numpy backend; for a numpy campaign, the reference) runs what was refused."""
        try:
            if self.backend == "cupy":
                program = ct.compile(terms, inputs=inputs, state=state or None, updates=updates or None,
                                     backend="numpy")
                program(**{v.name: ref_feeds[v.name] for v in inputs})
            else:
                targets = list(terms) + list((updates or {}).values())
                ct.evaluate(targets, restrict(targets, ref_feeds))
            return "fine", None
        except ct.CortadoError as error:
            return "refused", error
        except Exception as error:  # noqa: BLE001
            return "crashed", error

    def failed_call(self, case, stage, error, terms, inputs, state, updates, ref_feeds):
        text = f"{type(error).__name__}: {error}"
        tb = traceback.format_exc()[-4000:]
        if isinstance(error, ct.CortadoError):
            verdict, cpu_error = self.cpu_verdict(terms, inputs, state, updates, ref_feeds)
            if verdict == "fine":
                self.record("unclear_error", stage, case, f"{type(error).__name__}: {signature(str(error))}",
                            error=text[:3000], traceback=tb, cpu="compiles and runs")
            else:
                self.count("refused_both")
                key = f"{type(error).__name__}: {signature(str(error))}"
                self.refusals[key] = self.refusals.get(key, 0) + 1
                if verdict == "crashed":
                    self.record("crash", "cpu-" + stage, case, f"{type(cpu_error).__name__}: "
                                f"{signature(str(cpu_error))}", error=f"{type(cpu_error).__name__}: {cpu_error}"[:3000])
        else:
            self.record("crash", stage, case, f"{type(error).__name__}: {signature(str(error))}", error=text[:3000],
                        traceback=tb)
        if stage != "compile":
            self.check_health()

    def execute(self, case, terms, inputs, feeds, *, ref_feeds=None, state=None, updates=None, calls=3, options=None,
                checker="graph", kept=None, layout="c", layout_seed=0, bounds=None):
        state, updates = dict(state or {}), dict(updates or {})
        ref_feeds = dict(ref_feeds if ref_feeds is not None else feeds)
        case.setdefault("dtypes", {v.name: v.dtype.name for v in list(inputs) + list(state)})
        case.setdefault("shapes", {v.name: list(v.shape) for v in list(inputs) + list(state)})
        case["outputs"] = [f"{t.op.name} {t.dtype.name}{list(t.shape)}" for t in terms]
        self.count("programs")
        seen = self.ops.setdefault(self.mode, {})
        for t in ct.Graph(list(terms) + list(updates.values())).schedule:
            if t.op.name not in ("var", "const"):
                key = t.op.name if t.op.name != "cast" else f"cast:{t.dtype.name}"
                seen[key] = seen.get(key, 0) + 1
            if t.op.name == "var":
                seen[f"var:{t.dtype.name}"] = seen.get(f"var:{t.dtype.name}", 0) + 1
        stage = "compile"
        try:
            program = ct.compile(terms, inputs=inputs, state=state or None, updates=updates or None,
                                 backend=self.backend, **self.options(options))
        except ct.CortadoError as error:
            return self.failed_call(case, stage, error, terms, inputs, state, updates, ref_feeds)
        except Exception as error:  # noqa: BLE001
            return self.failed_call(case, stage, error, terms, inputs, state, updates, ref_feeds)
        fed = self.device_layout({v.name: feeds[v.name] for v in inputs}, layout, layout_seed)
        current = {v.name: np.array(value) for v, value in state.items()}
        targets = list(updates)
        first = None
        for call in range(calls):
            stage = f"call{call}"
            try:
                results = [host(r) for r in program(**fed)]
                if self.inject and results and results[0].size and self.inject_rng.random() < self.inject:
                    flat = results[0].reshape(-1)  # --inject: a wrong element, to see the harness catch it
                    flat[-1] = (flat[-1] + 1) if flat.dtype.kind in "iuf" or flat.dtype.kind == "V" else ~flat[-1]
                after = {v.name: host(program.state[v.name]) for v in targets}
            except Exception as error:  # noqa: BLE001
                return self.failed_call(case, stage, error, terms, inputs, state, updates, {**ref_feeds, **current})
            stage = f"compare{call}"
            feed = {**{v.name: ref_feeds[v.name] for v in inputs}, **current}
            try:
                bad = self.judge(checker, terms, feed, results, program, kept, updates=[updates[v] for v in targets],
                                 updated=[after[v.name] for v in targets])
            except ct.CortadoError as error:
                self.count("invalid")  # the reference refuses the case: a generator's mistake
                if self.verbose:
                    print("invalid:", error)
                return
            except Exception as error:  # noqa: BLE001
                return self.record("crash", "reference", case, f"{type(error).__name__}: {signature(str(error))}",
                                   error=f"{type(error).__name__}: {error}"[:3000],
                                   traceback=traceback.format_exc()[-4000:])
            if bad == "set_aside":
                self.count("set_aside")
                return
            if bad:
                worst = bad[0]
                sig = f"{worst.get('op')}:{worst.get('dtype')}:{worst.get('class')}"
                return self.record("mismatch", stage, case, sig, call=call, bad_outputs=bad,
                                   max_abs_err=max((b.get("max_abs_err") or 0.0) for b in bad),
                                   max_rel_err=max((b.get("max_rel_err") or 0.0) for b in bad),
                                   cuda_graph=(options or {}).get("cuda_graph", True))
            if targets:
                stop = False
                for v in targets:
                    current[v.name] = after[v.name]
                    if bounds and not _float_bounds_ok(after[v.name], bounds[v.name]):
                        stop = True
                if stop:
                    break
            elif first is None:
                first = results
            else:
                for k, (a, b) in enumerate(zip(first, results)):
                    if not same_bits(a, b):
                        return self.record("nondeterministic", stage, case, f"output {terms[k].op.name}:"
                                           f"{terms[k].dtype.name} differs between calls", call=call, output=k,
                                           max_abs_diff=max_abs_diff(a, b))
        self.count("ok")

    # -- judging results --

    def judge(self, checker, terms, feed, results, program, kept, updates=(), updated=()):
        """The outputs (and the state's new values) that disagree with the reference by every criterion the GPU
        tests accept; [] where all agree; "set_aside" where a product's sums may overflow in one order and not in
        another, or a convolution's padding faces a NaN weight (``reference_checks.check`` sets those aside)."""
        terms, results = list(terms) + list(updates), list(results) + list(updated)
        checkers = [checker] * len(terms) if isinstance(checker, str) else list(checker) + ["graph"] * len(updates)
        for k, (t, r) in enumerate(zip(terms, results)):
            if r.shape != t.shape or r.dtype != t.dtype:
                return [dict(output=k, op=t.op.name, dtype=t.dtype.name, **{"class": "shape/dtype"},
                             why=f"got {r.dtype}{list(r.shape)}, declared {t.dtype}{list(t.shape)}")]
        if len(results) != len(terms):
            return [dict(output=-1, op="?", dtype="?", **{"class": "count"}, why=f"{len(results)} results")]
        with np.errstate(all="ignore"):
            return self._judge(checkers, terms, feed, results, program, kept)

    def _judge(self, checkers, terms, feed, results, program, kept):
        backend = self.backend
        declared = ct.evaluate(terms, restrict(terms, feed))
        bad, family = [], []
        for k, (c, _t, r, d) in enumerate(zip(checkers, terms, results, declared)):
            if c in ("exact", "exact0"):
                if not same_bits(r, d, zero_sign=c == "exact0"):
                    bad.append(k)
            elif c.startswith("ulps"):
                if not within_ulps(r, d, int(c[4:])):
                    bad.append(k)
            else:
                family.append(k)
        fused = RC.fuses_products(backend, terms)
        if fused and RC._overflows_meet(terms, restrict(terms, feed)):
            return "set_aside"
        if backend == "cupy" and RC.zeros_face_non_finite_weights(terms, restrict(terms, feed)):
            return "set_aside"
        half = any(t.dtype.itemsize == 2 and is_float(t.dtype) for t in ct.Graph(terms).schedule)
        stabilised = program is not None and bool(program.traces["stability"])
        also = [ct.evaluate(stabiliser.run(list(terms)), restrict(terms, feed))] if stabilised and family else []
        options = dict(more_accurate=stabilised or (backend == "cupy" and half) or fused,
                       normwise=RC.sums_otherwise(backend, terms), non_finite_alike=fused, reordered=fused)

        def passes(indices, alternatives):
            sub = [terms[i] for i in indices]
            try:
                RC.assert_computes_what_it_says(sub, restrict(sub, feed), [results[i] for i in indices],
                                                also=[[a[i] for i in indices] for a in alternatives], **options)
                return True
            except AssertionError:
                return False

        if family and not passes(family, also):
            alternatives = list(also)
            if kept is not None and half and not self.strict:
                try:
                    wide = kept(feed)
                except ct.CortadoError:
                    wide = None
                alternatives.extend(wide or [])
            exact = None
            for k in family:
                if passes([k], alternatives):
                    continue
                if exact is None:
                    exact = ct.evaluate(terms, restrict(terms, feed), precision="float64")
                if self.strict:
                    pass
                elif checkers[k] in ("graph", "reduce") and passes_test_gpu(terms[k], results[k], exact[k], declared[k]):
                    continue
                elif checkers[k] == "gemm" and passes_test_gpu_scaled(terms[k], results[k], exact[k]):
                    continue
                bad.append(k)
        if not bad:
            return []
        exact = ct.evaluate(terms, restrict(terms, feed), precision="float64")
        return [difference(k, terms[k], results[k], declared[k], exact[k], checkers[k], options["normwise"])
                for k in sorted(bad)]

    # -- modes --

    def run_example(self, mode, case):
        self.mode = mode
        self.count("examples")
        now = time.time()
        cap = min(self.cap, max(1.0, self.deadline + GRACE - now))
        signal.setitimer(signal.ITIMER_REAL, cap)
        try:
            RUNNERS[mode](self, case)
        except ExampleTimeout:
            if time.time() >= self.deadline + GRACE - 1:
                self.cut = True
                self.count("cut_at_end")
            else:
                self.record("timeout", "example", case, f"example ran past {self.cap:.0f} s", seconds=self.cap)
                self.check_health()
        except ct.CortadoError as error:  # building the case's terms
            self.count("invalid")
            if self.verbose:
                print("invalid case:", error)
        except Exception as error:  # noqa: BLE001 (building terms: cortado's constructors, or this script)
            self.record("crash", "build", case, f"{type(error).__name__}: {signature(str(error))}",
                        error=f"{type(error).__name__}: {error}"[:3000], traceback=traceback.format_exc()[-4000:])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if self.stats[mode].get("examples", 0) % 25 == 0:
            gc.collect()

    def run_mode(self, position, index, mode, until, start=0):
        self.mode = mode
        self.stats.setdefault(mode, {})
        began = self.stats[mode].setdefault("began", time.time())
        last = [began]

        def progress():
            if time.time() - last[0] > 30:
                last[0] = time.time()
                s = self.stats[mode]
                print(f"  ... {mode}: {s.get('programs', 0)} programs, {time.time() - began:.0f} s", flush=True)

        if mode in ("plain", "ints", "state", "grad", "edges"):
            strategy = edge_cases(self.backend) if mode == "edges" else graph_cases(mode, self.backend)
            seen = set()

            def worth_running(case):
                """Not a graph of fewer than two steps, nor one already run (a GPU program costs seconds)."""
                if case.get("steps") is not None and len(case["steps"]) < (2 if mode != "edges" else 1):
                    self.count("trivial_skipped")
                    return False
                key = case.get("program"), repr(case.get("cfg")), case.get("grads"), repr(case.get("outs"))
                if case.get("program") is not None and key in seen:
                    self.count("duplicate_skipped")
                    return False
                seen.add(key)
                return True

            k = start
            while self.engine == "fresh" and time.time() < until and not self.cut:
                seed = int(np.random.SeedSequence([self.seed, index, k]).generate_state(1, np.uint64)[0] >> 1)
                k += 1
                self.position = (position, k, until)  # a restart goes on after this example
                try:
                    case = draw_fresh(strategy, seed)
                except FreshUnavailable as error:
                    print(f"  hypothesis internals unavailable ({error}): examples from @given instead", flush=True)
                    self.engine = "given"
                    break
                except Exception as error:  # noqa: BLE001 (an overrun: hypothesis's StopTest, or an invalid draw)
                    self.count("draw_failed")
                    if type(error).__name__ not in ("StopTest", "Frozen", "UnsatisfiedAssumption") and self.verbose:
                        print("draw failed:", type(error).__name__, error)
                    continue
                except BaseException as error:  # hypothesis's StopTest is a BaseException in some versions
                    if type(error).__name__ != "StopTest":
                        raise
                    self.count("draw_failed")
                    continue
                case["draw_seed"] = seed
                if worth_running(case):
                    self.run_example(mode, case)
                    progress()
            if self.engine == "given":
                self.position = (position, 0, until)

                @hypothesis_seed(self.seed * 1000 + index + 100 * self.restarts)
                @settings(**HYPOTHESIS)
                @given(strategy)
                def campaign(case):
                    if time.time() >= until or self.cut:
                        raise StopMode()
                    if worth_running(case):
                        self.run_example(mode, case)
                        progress()

                try:
                    campaign()
                except StopMode:
                    pass
        else:
            k = start
            while time.time() < until and not self.cut:
                seed = int(np.random.SeedSequence([self.seed, index, k]).generate_state(1, np.uint64)[0] >> 1)
                k += 1
                self.position = (position, k, until)
                self.run_example(mode, dict(mode=mode, kind=mode, seed=seed))
                progress()
        self.stats[mode]["seconds"] = time.time() - began

    def run(self, modes):
        for i, mode in enumerate(modes):
            now = time.time()
            start = 0
            if self.resumed_at is not None:
                if i < self.resumed_at[0]:
                    continue
                if i == self.resumed_at[0]:
                    _, start, until = self.resumed_at
            if now >= self.deadline - 1 or self.cut:
                print(f"[{mode}] skipped: no time left", flush=True)
                self.stats.setdefault(mode, {}).setdefault("seconds", 0.0)
                continue
            if not start:
                until = now + (self.deadline - now) / (len(modes) - i)
            print(f"[{mode}] {until - now:.0f} s" + (f" (resumed at example {start})" if start else ""), flush=True)
            self.run_mode(i, MODES.index(mode), mode, until, start)
            print(self.summary_line(mode), flush=True)

    def summary_line(self, mode):
        s = self.stats.get(mode, {})
        seconds = s.get("seconds", 0.0)
        rate = s.get("programs", 0) / seconds * 60 if seconds else 0.0
        failed = ", ".join(f"{s.get(c, 0)} {c}" for c in ("mismatch", "crash", "unclear_error", "nondeterministic",
                                                          "timeout"))
        other = ", ".join(f"{s[c]} {c}" for c in ("context_lost", "refused_both", "set_aside", "invalid", "cut_at_end",
                                                  "trivial_skipped", "duplicate_skipped", "draw_failed") if s.get(c))
        return (f"{mode:8s} {s.get('programs', 0):5d} programs in {seconds:5.0f} s ({rate:6.1f}/min), "
                f"{s.get('ok', 0)} ok; {failed}" + (f"; {other}" if other else ""))

    def summary(self, modes):
        lines = [f"cortado GPU fuzz campaign: backend {self.backend}, seed {self.seed}, "
                 f"{time.time() - self.start:.0f} s of {self.deadline - self.start:.0f}"
                 + (f", {self.restarts} restarts after a lost CUDA context" if self.restarts else ""),
                 *[self.summary_line(m) for m in modes]]
        total = {c: sum(s.get(c, 0) for s in self.stats.values()) for c in
                 ("programs", "mismatch", "crash", "unclear_error", "nondeterministic", "timeout")}
        lines.append("total: " + ", ".join(f"{v} {k}" for k, v in total.items()))
        lines.append(f"distinct kinds of failure: {len(self.kinds)} (first of each in failures.jsonl, "
                     f"{self.logged} lines)")
        for key, n in sorted(self.kinds.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n:5d}  {key}")
        lines.append("terms compiled, by op (and variables and casts by dtype), per mode:")
        for mode in modes:
            seen = sorted(self.ops.get(mode, {}).items(), key=lambda kv: -kv[1])
            lines.append(f"  {mode}: " + ", ".join(f"{k} {v}" for k, v in seen))
        if self.refusals:
            lines.append("refused by the backend and by the CPU alike (not failures):")
            for key, n in sorted(self.refusals.items(), key=lambda kv: -kv[1])[:30]:
                lines.append(f"  {n:5d}  {key}")
        return "\n".join(lines)


def same_bits(a, b, zero_sign=True):
    """The same values: NaNs in the same places (and, with ``zero_sign``, zeros of the same sign)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if not is_float(a.dtype):
        return bool(np.array_equal(a, b))
    a, b = a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan], b[~nan])
                and (not zero_sign or np.array_equal(np.signbit(a[~nan]), np.signbit(b[~nan]))))


def within_ulps(ours, theirs, most):
    """tests/test_sin_cos_logical.py: CUDA's sin and cos within a few ulps of NumPy's, NaNs alike."""
    o, t = np.asarray(ours).astype(np.float64), np.asarray(theirs).astype(np.float64)
    if not np.array_equal(np.isnan(o), np.isnan(t)):
        return False
    finite = ~np.isnan(t)
    ulp = np.abs(np.spacing(np.asarray(theirs)[finite])).astype(np.float64)
    return bool((np.abs(o - t)[finite] <= most * np.maximum(ulp, np.finfo(np.float64).tiny)).all())


def passes_test_gpu(term, ours, exact, declared):
    """tests/test_gpu.py's random-graph criterion: a float output within TOLERANCE of the float64 reference, in the
    least precise float it was computed through; any other, the exact answer or the declared one."""
    if is_float(term.dtype):
        try:
            TG.assert_close(ours, np.asarray(exact), TG._least_precise(term))
            return True
        except AssertionError:
            return False
    return bool(((ours == exact) | (ours == declared)).all())


def passes_test_gpu_scaled(term, ours, exact):
    """tests/test_gpu.py's GEMM criterion: errors relative to the largest value, in the least precise dtype."""
    if not is_float(term.dtype):
        return bool(np.array_equal(ours, exact))
    exact = np.asarray(exact, np.float64)
    finite = exact[np.isfinite(exact)]
    scale = max(1.0, float(np.abs(finite).max(initial=0.0)))
    try:
        TG.assert_close(ours.astype(np.float64) / scale, exact / scale, TG._least_precise(term))
        return True
    except AssertionError:
        return False


def max_abs_diff(a, b):
    a, b = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    d = np.abs(a - b)
    d = d[np.isfinite(d)]
    return float(d.max()) if d.size else None


def difference(k, term, ours, declared, exact, checker, normwise):
    """How output ``k`` differs: counts of wrong elements, the largest errors, the first few places."""
    o, d, e = (np.asarray(a).astype(np.float64) for a in (ours, declared, exact))
    info = dict(output=k, op=term.op.name, dtype=term.dtype.name, shape=list(term.shape), checker=checker,
                size=int(o.size))
    if is_float(term.dtype):
        nan = np.isnan(o) != np.isnan(d)
        inf = (np.isinf(o) | np.isinf(d)) & (o != d) & ~np.isnan(o) & ~np.isnan(d)
        finite = np.isfinite(o) & np.isfinite(d)
        err = np.abs(o - d)[finite]
        rel = err / np.maximum(np.abs(d[finite]), float(finfo(term.dtype).tiny))
        ok = RC.agrees(np.asarray(ours), np.asarray(declared), term.dtype, normwise) | RC.agrees(
            np.asarray(ours), RC.as_dtype(exact, term.dtype), term.dtype, normwise)
        wrong = ~ok
        info.update(nan_mismatches=int(nan.sum()), inf_mismatches=int(inf.sum()),
                    max_abs_err=float(err.max()) if err.size else 0.0, max_rel_err=float(rel.max()) if rel.size else 0.0,
                    max_abs_err_vs_float64=max_abs_diff(o, e), largest_reference=float(np.abs(d[np.isfinite(d)]).max(
                        initial=0.0)))
        info["class"] = "nonfinite" if nan.any() or inf.any() else "finite"
        if checker in ("exact", "exact0"):
            wrong = nan | (~np.isnan(d) & (o != d))
            if checker == "exact0":
                wrong |= ~np.isnan(d) & (np.signbit(o) != np.signbit(d))
            info["class"] = "bits-" + info["class"]
    else:
        wrong = (o != d) & (o != e)
        info.update(max_abs_err=float(np.abs(o - d).max(initial=0.0)), max_rel_err=None)
        info["class"] = "integer"
    where = np.argwhere(wrong.reshape(term.shape) if term.shape else np.atleast_1d(wrong))[:4]
    info["wrong_elements"] = int(wrong.sum())
    info["examples"] = [dict(at=[int(i) for i in w], ours=repr(np.asarray(ours)[tuple(w)] if term.shape else ours[()]),
                             reference=repr(np.asarray(declared)[tuple(w)] if term.shape else declared[()]),
                             float64=repr(np.asarray(exact)[tuple(w)] if term.shape else exact[()])) for w in where]
    return info


RUNNERS = {
    "plain": run_graph,
    "ints": run_graph,
    "state": run_graph,
    "grad": run_graph,
    "edges": run_edges,
    "newops": lambda camp, case: run_seeded(camp, case, case_newops),
    "reduce": lambda camp, case: run_seeded(camp, case, case_reduce),
    "gemm": lambda camp, case: run_seeded(camp, case, case_gemm),
    "index": lambda camp, case: run_seeded(camp, case, case_index),
}


def preflight(backend):
    """A tiny program on the backend, so that a machine without CuPy or nvmath says so once."""
    x = ct.var("x", (4, 3))
    w = ct.var("w", (3, 2))
    program = ct.compile([ct.tanh(x @ w) * 2.0, ct.sum(x, axis=0)], inputs=[x, w], backend=backend)
    feeds = {"x": np.ones((4, 3), np.float32), "w": np.ones((3, 2), np.float32)}
    for _ in range(3):
        results = [host(r) for r in program(**feeds)]
    assert np.allclose(results[0], np.tanh(3.0) * 2) and np.allclose(results[1], 4.0), results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="all", help=f"comma-separated, of {','.join(MODES)}; or all")
    parser.add_argument("--seconds", type=float, default=600.0, help="the whole campaign's time, shared by the modes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="/tmp/gpu_fuzz")
    parser.add_argument("--backend", default="cupy", choices=["cupy", "numpy"])
    parser.add_argument("--cap", type=float, default=120.0, help="one example's longest time (s) before it is cut")
    parser.add_argument("--replay", help="a case file (OUT/cases/NNNN.pkl) to run again, verbosely")
    parser.add_argument("--resume", help=argparse.SUPPRESS)  # the campaign's own restart after a lost CUDA context
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--strict", action="store_true",
                        help="reference_checks' criterion alone (no test_gpu tolerance, no float32-kept answer)")
    parser.add_argument("--engine", default="fresh", choices=["fresh", "given"],
                        help="hypothesis modes: independent seeded draws (fresh), or @given's engine")
    parser.add_argument("--inject", type=float, default=0.0,
                        help="a check of the checks: this fraction of calls get one wrong element in their first result")
    args = parser.parse_args()
    if args.replay:
        with open(args.replay, "rb") as f:
            case = pickle.load(f)
        camp = Campaign(args.backend, args.out + "_replay", 3600, args.seed, 3600, verbose=True)
        if case.get("program"):
            print(case["program"])
        camp.run_example(case["mode"], case)
        print(camp.summary([case["mode"]]))
        return
    modes = MODES if args.modes == "all" else [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; the modes are {MODES}")
    resume = json.loads(Path(args.resume).read_text()) if args.resume else None
    camp = Campaign(args.backend, args.out, args.seconds, args.seed, args.cap, verbose=args.verbose, resume=resume)
    camp.inject, camp.engine = args.inject, (resume or {}).get("engine", args.engine)
    camp.strict = args.strict
    camp.argv = [a for a in sys.argv[1:]]
    if "--resume" in camp.argv:
        at = camp.argv.index("--resume")
        del camp.argv[at:at + 2]
    print(f"cortado from {Path(ct.__file__).parent} (tests {TESTS}), numpy {np.__version__}, "
          f"backend {args.backend}, modes {','.join(modes)}, {args.seconds:.0f} s, seed {args.seed}", flush=True)
    if resume:
        print(f"resumed after a lost CUDA context at mode {modes[resume['position'][0]]}, example "
              f"{resume['position'][1]}", flush=True)
    try:
        preflight(args.backend)
    except Exception as error:  # noqa: BLE001
        text = f"preflight failed on backend {args.backend}: {type(error).__name__}: {error}"
        print(text, flush=True)
        (Path(args.out) / "summary.txt").write_text(text + "\n" + traceback.format_exc())
        sys.exit(2)
    try:
        camp.run(modes)
    finally:
        text = camp.summary(modes)
        (Path(args.out) / "summary.txt").write_text(text + "\n")
        print(text, flush=True)


if __name__ == "__main__":
    main()
