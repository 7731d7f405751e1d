"""cortado: symbolic tensor expressions, rewritten by rules, differentiated, planned and run fast.

    import cortado as ct
    x = ct.var("x", (64, 784)); W = ct.var("W", (784, 10)); b = ct.var("b", (10,))
    logits = x @ W + b
    ct.evaluate(logits, {"x": xv, "W": Wv, "b": bv})
"""

from . import distributed, nn, optim, rules
from .backends.reference import evaluate
from .checkpoint import load, save
from .compiler import compile  # noqa: A004  (ct.compile, as DESIGN.md names it)
from .errors import (
    BackendError, CortadoError, DTypeError, FeedError, GradError, IndexRangeError, PlanError, RewriteError, ShapeError,
)
from .exprgraph import Graph, Term, format_graph, schedule, to_dot
from .exprgraph.extremes import argmax, argmin, clip, min  # noqa: A004 (NumPy's names)
from .exprgraph.constructors import *  # noqa: F401,F403  (var, const, exp, matmul, ...: see __all__ there)
from .exprgraph.constructors import __all__ as _constructors
from .exprgraph.quantization import dequantize, fake_quantize, quantize
from .exprgraph.slicing import concatenate, split
from .exprgraph.shaping import *  # noqa: F401,F403  (expand_dims, stack, zeros, ...: see __all__ there)
from .exprgraph.shaping import __all__ as _shaping
from .grad import grad, hvp, vjp
from .program import Program
from .torch_state import load_optimizer_state_dict, load_state_dict, optimizer_state_dict, state_dict

__version__ = "0.1.0"

__all__ = [
    *_constructors, *_shaping, "min", "clip", "argmax", "argmin", "quantize", "dequantize", "fake_quantize",
    "concatenate", "split",
    "grad", "vjp", "hvp", "rules", "distributed", "nn", "optim", "save", "load", "load_state_dict", "state_dict",
    "load_optimizer_state_dict", "optimizer_state_dict",
    "evaluate", "compile", "Program", "Graph", "Term", "format_graph", "schedule", "to_dot",
    "CortadoError", "ShapeError", "DTypeError", "FeedError", "GradError", "IndexRangeError", "RewriteError", "PlanError",
    "BackendError",
]
