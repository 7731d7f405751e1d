"""One checklist per op: every op of the table has what each part of cortado needs of it, or is one
of that part's exceptions, listed with the reason. An op added to the table fails here until each
part handles it or excepts it on purpose (its derivative rule is checked in test_grad.py)."""

import importlib
import pkgutil

import numpy as np
import pytest

import cortado as ct
from cortado import testing
from cortado.backends.cupy import codegen, sources, targets
from cortado.backends.cupy import layout as gpu_layout
from cortado.backends.numpy import kernels, layout
from cortado.errors import BackendError, DTypeError
from cortado.exprgraph.dtypes import SUPPORTED
from cortado.exprgraph.ops import LOWERED, OPS, REDUCTION, Op, may_fail, parameter
from cortado.exprgraph.ops.collectives import ALL_REDUCE
from cortado.rules import primitives
from cortado.rules.decompositions import composites, einsum_lowering


def assert_covered(ops, covered, exceptions):
    """Each of ``ops`` is ``covered`` or one of the ``exceptions``, not both; all are ops of the table."""
    covered, exceptions = set(covered), set(exceptions)
    assert covered | exceptions <= set(OPS), f"not ops of the table: {sorted((covered | exceptions) - set(OPS))}"
    assert not covered & exceptions, f"listed as exceptions, yet covered: {sorted(covered & exceptions)}"
    missing = set(ops) - covered - exceptions
    assert not missing, f"neither covered nor listed as exceptions: {sorted(missing)}"


# -- cortado.testing ---------------------------------------------------------------------------


def test_every_op_is_drawn_by_the_strategies_or_excluded_on_purpose():
    assert_covered(OPS, testing.ALL_OPS, testing.NOT_DRAWN)


def test_every_drawn_op_has_a_builder_and_bounds():
    testing.graphs(ops=testing.ALL_OPS)  # refuses ops without a builder or bounds, naming where they go


# -- reference semantics -----------------------------------------------------------------------

SEMANTICS_EXCEPTIONS = {  # ops the reference interpreter evaluates without their record's ``evaluate``
    "var": "its value is the feed of its name",
    "const": "its value is its attribute",
    "fused": "its value is its body's, evaluated op by op",
    "param": "its value is the fused region's operand of its index",
}


def test_every_op_has_reference_semantics():
    assert_covered(OPS, {name for name, op in OPS.items() if op.evaluate is not None}, SEMANTICS_EXCEPTIONS)


# -- the NumPy backend -------------------------------------------------------------------------

SPELLED_OUT = "a composite: spelled out in primitives before any backend emits a kernel (rules.primitives)"
COMPOSITES = {op.name: SPELLED_OUT for op in primitives.COMPOSITES}

NUMPY_EXCEPTIONS = {  # ops the CPU executor runs without an emitter of kernels.py
    **COMPOSITES,
    "var": "the executor copies its feed in",
    "const": "the executor reads the constant's own array",
    "fused": "its body is emitted op by op (backends/numpy/fused.py)",
    "param": "in a fused body, it is the region's operand of its index (backends/numpy/fused.py)",
}


def test_every_op_has_a_numpy_emitter_or_is_a_view():
    own = {op for op in kernels.EMITTERS if op.kind == LOWERED}  # the CPU's lowered ops (backends/numpy/lowering.py)
    assert own and not {op.name for op in own} & set(OPS)
    assert_covered(OPS, {op.name for op in (*kernels.EMITTERS, *layout.ALWAYS_VIEWS) if op not in own}, NUMPY_EXCEPTIONS)
    assert not set(kernels.INPLACE) - set(kernels.EMITTERS)


# -- CUDA code generation ----------------------------------------------------------------------

GENERATED = [name for name, op in OPS.items() if op.elementwise or op.kind == REDUCTION]  # what codegen is for
DECOMPOSED = "the GPU's lowering spells it out in max, exp, sum and log first (rules.decompositions.composites)"
CODEGEN_EXCEPTIONS = {**COMPOSITES, "logsumexp": DECOMPOSED, "softmax": DECOMPOSED, "log_softmax": DECOMPOSED}


def test_every_elementwise_op_and_reduction_has_cuda_code_generation():
    assert_covered(GENERATED, {op.name for op in (*codegen.C_EXPRESSIONS, *codegen.REDUCTIONS)}, CODEGEN_EXCEPTIONS)


def test_the_ops_codegen_lacks_are_decomposed_before_it():
    assert not set(CODEGEN_EXCEPTIONS) - {rule.key for rule in composites} - {op.name for op in primitives.COMPOSITES}


SHAPE = (3, 5)


def _signatures(name):
    """``(operand dtypes, keyword arguments)`` of one-op bodies of ``name``, over every supported dtype."""
    for dtype in SUPPORTED:
        if name == "where":
            yield (np.dtype(np.bool_), dtype, dtype), {}
        elif name == "cast":
            yield from (((dtype,), {"dtype": target}) for target in SUPPORTED)
        elif OPS[name].kind == REDUCTION:
            yield (dtype,), {"axis": 1}
        else:  # an op of several arities (float8_gradient: a value, and an amax history or not) with one
            yield (dtype,) * (OPS[name].arity or 1), {}


@pytest.mark.parametrize("name", sorted({op.name for op in (*codegen.C_EXPRESSIONS, *codegen.REDUCTIONS)}))
def test_cuda_source_of_a_one_op_body_for_every_dtype_the_op_takes(name):
    """The kernel's source text, generated on the CPU and not compiled (that needs a GPU: test_gpu.py)."""
    generated = 0
    for dtypes, params in _signatures(name):
        try:
            term = getattr(ct, name)(*(parameter(k, ct.var("p", SHAPE, d)) for k, d in enumerate(dtypes)), **params)
        except DTypeError:
            continue  # the op does not take these dtypes
        operands = [codegen.Operand(SHAPE, d, codegen.contiguous_strides(SHAPE)) for d in dtypes]
        if may_fail(term):  # refused on purpose: NumPy raises on a negative integer exponent, a kernel cannot
            with pytest.raises(BackendError, match="integer power whose exponent may be negative"):
                sources.kernel_source((term,), operands)
            continue
        assert sources.kernel_source((term,), operands).text
        generated += 1
    assert generated


# -- GPU targets ---------------------------------------------------------------------------------

GPU_LOWERING = importlib.import_module("cortado.backends.cupy.lowering")  # the package (its ``lowering`` is the pass)
IN_A_FUSED_KERNEL = {op.name for op in (*codegen.C_EXPRESSIONS, *codegen.REDUCTIONS)}  # targets.fused runs these
LOWERED_TO = "the GPU's lowering makes it a library call of its own (backends/cupy/lowering/, TARGETS)"
GPU_TARGET_EXCEPTIONS = {  # ops of the table the GPU runs without a target of their own, and why
    **COMPOSITES,
    **CODEGEN_EXCEPTIONS,
    "var": "a feed: the executor reads it where the caller keeps it, or stages it",
    "const": "the executor copies its array to the device when the program is built",
    "param": "in a fused body, it is the region's operand of its index",
    **{op.name: "a view: its strides, no kernel (backends/cupy/layout.py VIEWS)" for op in gpu_layout.VIEWS},
    "einsum": "spelled out in matmuls and products first (rules.decompositions.einsum_lowering)",
    "matmul": f"{LOWERED_TO}: gemm, float8_gemm or int8_gemm, or a reduction where none takes it",
    "conv": f"{LOWERED_TO}: dnn_conv or int8_gemm",
    "attention": f"{LOWERED_TO}: dnn_attention",
    "attention_grad": f"{LOWERED_TO}: dnn_attention_grad",
}


def test_every_op_the_gpu_runs_has_a_target_or_is_excepted_on_purpose():
    """On the CPU: a target is a module of backends/cupy/targets/, found by the ops it runs; without one, a program
    holding the op is refused only when it is built on a GPU."""
    targeted = {op.name for op in targets._by_op() if OPS.get(op.name) is op}
    assert_covered(OPS, targeted | IN_A_FUSED_KERNEL, GPU_TARGET_EXCEPTIONS)


def test_the_ops_excepted_from_gpu_targets_are_taken_apart_before_they_need_one():
    lowered = {rule.key for target in GPU_LOWERING.TARGETS for rule in target.rules}
    assert {name for name, why in GPU_TARGET_EXCEPTIONS.items() if why.startswith(LOWERED_TO)} <= lowered
    assert "einsum" in {rule.key for rule in einsum_lowering}


def _lowered_ops():
    """The ops the GPU's lowering builds (outside the table: each lives with the lowering that builds it), and the
    all-reduce of data parallelism."""
    found = {ALL_REDUCE}
    for info in pkgutil.iter_modules(GPU_LOWERING.__path__):
        module = importlib.import_module(f"{GPU_LOWERING.__name__}.{info.name}")
        found |= {value for value in vars(module).values() if isinstance(value, Op) and value.kind == LOWERED}
    return found


def test_every_op_the_gpu_lowering_builds_has_a_target():
    built = _lowered_ops()
    assert {"gemm", "dnn_conv", "dnn_attention"} <= {op.name for op in built}
    untargeted = sorted(op.name for op in built - set(targets._by_op()))
    assert not untargeted, f"built by the GPU's lowering, yet no module of backends/cupy/targets/ runs: {untargeted}"


def test_only_a_variable_has_a_name_attribute():
    """``Term.name`` is the ``name`` attribute where there is one: a variable's, and no other op's."""
    assert [name for name, op in OPS.items() if "name" in op.attr_names] == ["var"]
