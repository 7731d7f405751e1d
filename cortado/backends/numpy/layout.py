"""What the memory planner needs to know of each kernel on the CPU: views, in-place pairs, workspace."""

from ...errors import BackendError
from ...exprgraph.ops import BROADCAST_TO, CONST, FLIP, FUSED_OP, OPS, RESHAPE, TRANSPOSE, VAR, WINDOWS
from ...exprgraph.ops.collectives import ALL_REDUCE
from ...memplan import Step
from .fused import plan_fused
from .kernels import EMITTERS, INPLACE, Emitter, c_strided

ALWAYS_VIEWS = frozenset((TRANSPOSE, BROADCAST_TO, FLIP, WINDOWS))


def _workspace(op, attrs, arg_types, result_types):
    """The scratch bytes of one op on operands of ``arg_types``, measured by a dry run of its emitter."""
    em = Emitter()
    outs = tuple(c_strided(s, d) for s, d in result_types)
    EMITTERS[op](em, op.attributes._make(attrs), [c_strided(s, d) for s, d in arg_types], outs if len(outs) > 1 else outs[0])
    return em.top


def _memoized(function):
    """``function`` with its answers kept for one ``steps`` call: a deep network's layers repeat."""
    answers = {}

    def memoized(*key):
        if key not in answers:
            answers[key] = function(*key)
        return answers[key]

    return memoized


def _inplace(t):
    """``(t, operand)`` pairs: operands of ``t``'s type that its op reads before writing over them."""
    positions = INPLACE.get(t.op, ())
    return tuple((t, a) for p, a in enumerate(t.args) if p in positions and (a.shape, a.dtype) == (t.shape, t.dtype))


def steps(kernels, options):
    """One ``memplan.Step`` per kernel (this backend has no ``options``). A reshape is a view only of a
    C-contiguous value."""
    contiguous = {}
    found = []
    plan_region, workspace_of = _memoized(plan_fused), _memoized(_workspace)
    for k in kernels:
        t = k.term
        name = t.op.name
        if t.op is VAR:
            found.append(Step((t,), label=t.name))
            contiguous[t] = True
            continue
        source = t.args[0] if t.args else None
        source_contiguous = contiguous.get(source, source is not None and _stored_contiguously(source))
        if t.op in ALWAYS_VIEWS or (t.op is RESHAPE and source_contiguous):
            found.append(Step((t,), (source,), view_of=source, label=name))
            contiguous[t] = t.op is RESHAPE
            continue
        if t.op is ALL_REDUCE:  # on the CPU a world of one: the averages are copies
            found.append(Step(k.terms, k.reads, label=name))
            contiguous.update({d: True for d in k.terms})
            continue
        if t.op is FUSED_OP:
            workspace, pairs, costs = plan_region(t.attr("outputs"), tuple((a.shape, a.dtype) for a in t.args))
            inplace = pairs.renamed(k.terms, t.args)
            costs = tuple(((k.terms[o], t.args[i]), cost) for (o, i), cost in costs.items() if cost > workspace)
        else:
            if t.op not in EMITTERS:
                raise BackendError(_no_kernel(t))
            arg_types = tuple((a.shape, a.dtype) for a in t.args)
            result_types = tuple((d.shape, d.dtype) for d in k.terms)
            workspace, inplace, costs = workspace_of(t.op, t.attrs, arg_types, result_types), _inplace(t), ()
        found.append(Step(k.terms, k.reads, inplace=inplace, workspace=workspace, costs=costs, label=name))
        contiguous.update({d: True for d in k.terms})
    return found


def _no_kernel(t):
    """Why the CPU has no kernel for ``t``: an op of the table missing from ``EMITTERS`` is cortado's own omission;
    an op outside it is another backend's lowered op (the GPU's ``gemm``), which no program for the CPU holds."""
    name = t.op.name
    if OPS.get(name) is t.op:
        return (f"{t!r}: the numpy backend has no kernel for {name}: the op has no emitter in "
                f"cortado/backends/numpy/kernels.py (EMITTERS)")
    return f"{t!r}: the numpy backend has no kernel for {name}, which only GPU lowering makes"


def _stored_contiguously(t):
    """A constant or state variable: constants of one value are broadcasts, all else is C-ordered."""
    return not (t.op is CONST and t.attr("value").array.ndim and not t.attr("value").array.flags.c_contiguous)
