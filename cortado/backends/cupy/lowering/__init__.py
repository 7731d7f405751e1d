"""The GPU's lowering: the target-free decompositions around one rule file per target.

A target (``int8``, ``float8``, ``attention``, ``conv``, ``gemm``) is a module with ``rules`` (a rule
set, applied bottom-up until nothing changes), ``finish(roots, trace, variant)`` (a pass over all
roots at once, for what spans the graph) and ``alternatives(planned)`` (variants of ``finish`` worth
planning too; the compiler keeps the smallest arena). Adding a target is a module here and its name
in ``TARGETS``.

    lowered = lowering.run(roots, trace)
"""

from ....rules.decompositions import composites, einsum_lowering, maxima_in_two_stages, row_gathers
from ....rules.engine import Chain, Fixpoint, Postwalk
from . import attention, conv, float8, gemm, int8

# int8 first: it takes quantized convolutions and products before they are float ones for cuDNN and cuBLASLt;
# float8 before gemm: it takes the products of float8 operands (and widens what it cannot take); attention and
# conv before gemm: what cuDNN cannot take becomes matmuls for gemm's rules
TARGETS = (int8, float8, attention, conv, gemm)


class GpuLowering:
    """einsum into matmuls and products, then every target's rules (what is left of matmul becomes a
    reduction, a large max into one value two stages), then each target's pass over the whole graph.
    ``variant``: ``{target's name ("gemm"): its variant}``."""

    def __init__(self, targets):
        self.targets = targets
        rules = [Fixpoint(Postwalk(target.rules)) for target in targets]
        self.local = Chain(Postwalk(einsum_lowering), *rules, Postwalk(composites), Postwalk(row_gathers),
                           Postwalk(maxima_in_two_stages))

    def run(self, roots, trace=None, variant=None):
        roots = self.local.run(list(roots), trace)
        for target in self.targets:
            roots = target.finish(roots, trace, (variant or {}).get(_name(target), frozenset()))
        return roots

    def alternatives(self, planned):
        """Each variant a target proposes for the step ``planned`` (the others' left as they were)."""
        return [{_name(target): v} for target in self.targets for v in target.alternatives(planned)]


def _name(target):
    return target.__name__.rpartition(".")[2]


lowering = GpuLowering(TARGETS)
