"""CUDA C of kernels side by side (``rules.horizontal``): several bodies in one launch, each computed by blocks of
its own as it would be alone. A part is an elementwise body (``codegen``'s loop over its elements, in C order), a
body of one-value results from whole reductions (``reduction_kernels``' kernel of one output: a warp or a block
reducing, then its first thread computing the results), such as a float8 scale computed from a history of amaxes,
or a row kernel's body (``row_kernels``: a float8 weight's cast with its row maxima).
"""

from ...exprgraph.graph import post_order
from ...rules.fusion import own_parameters, row_shape
from .codegen import REDUCTIONS, THREADS, _elementwise_part, _signature, finished_source
from .reduction_kernels import one_value_lines
from .row_kernels import row_lines


def _part(body, operands):
    """``(statements, blocks)`` of one part over its own ``operands``, its blocks counted from ``first``."""
    if not any(t.op in REDUCTIONS for t in post_order(body)):
        return _elementwise_part(body, operands, offset="first")
    if all(t.ndim == 0 for t in body):
        return one_value_lines(body, operands, "(blockIdx.x - first)")
    return row_lines(body, operands, row_shape(body), "(blockIdx.x - first)")


def horizontal_source(body, operands, aliased, spans):
    """The outputs ``body[start:end]`` of each of ``spans`` computed by blocks of their own, in one launch. Each part
    is a device function of its own operands, not inlined, and equal parts (the updates of same-sized biases) are one
    function: the compiler builds each once, where a kernel of fifty inlined parts took it seconds."""
    functions, calls, first = {}, [], 0
    for start, end in spans:
        part, read = own_parameters(body[start:end])
        own = [operands[k] for k in read]
        statements, blocks = _part(part, own)
        signature = _signature(own, part, {j for j, k in enumerate(read) if k in aliased})
        text = f"({signature}, unsigned int first) {{\n" + "\n".join(statements) + "\n}\n"
        name = functions.setdefault(text, f"ct_part{len(functions)}")
        arguments = [f"in{k}" for k in read] + [f"out{k}" for k in range(start, end)] + [f"{first}u"]
        first += blocks
        calls.append(f"  {'if' if start == 0 else 'else if'} (blockIdx.x < {first}u) {name}({', '.join(arguments)});")
    definitions = "".join(f"__device__ __noinline__ void {name}{text}" for text, name in functions.items())
    return finished_source("horizontal", "\n".join(calls) + "\n", body, operands, aliased, first, (THREADS, 1, 1),
                           before=definitions)
