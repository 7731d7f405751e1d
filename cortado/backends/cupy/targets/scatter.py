"""``add_at``: rows added back at the places indices name (an embedding's gradient), as generated kernels over a
workspace of their own (``index_kernels.add_at_sources``): sorted runs of equal indices, summed in one fixed order,
so the sums are the CPU's bits on every run, with no atomics and no one-hot matrix."""

from ....errors import BackendError
from ....exprgraph.ops import ADD_AT
from ..codegen import Operand, contiguous_strides
from ..index_kernels import add_at_plan, add_at_sources
from ..kernels import launcher, prepare
from . import Runner, Target
from .copies import nothing


class AddAt(Runner):
    """The kernels of one ``add_at``, each called with the values, the indices, the result and the workspace."""

    def __init__(self, kernel, view):
        t = kernel.term
        self.values = (*t.args, t)
        self.workspace_bytes = _workspace(kernel, view)
        operands = [Operand(a.shape, a.dtype, view.strides[a]) for a in t.args]
        self.sources = add_at_sources(*operands, Operand(t.shape, t.dtype, contiguous_strides(t.shape)), t.attrs.axis)
        for source in self.sources:
            prepare(source)  # compiled beside the program's other kernels; the build waits for them

    def bind(self, addresses, workspace, stream):
        calls = [launcher(source, [*addresses, workspace]) for source in self.sources]
        if not calls:
            return nothing
        return calls[0] if len(calls) == 1 else lambda: [call() for call in calls]


def _workspace(kernel, view):
    t = kernel.term
    count = t.args[1].size
    if count >= 2 ** 31:
        raise BackendError(f"the cupy backend adds at most 2**31 - 1 indices in one add_at, not {count}: {t!r}, "
                           f"built at {t.where_built}")
    if t.attrs.size >= 2 ** 31:  # the sort packs a place into 32 bits of its key and keeps it as an int
        raise BackendError(f"the cupy backend adds into at most 2**31 - 1 places along the axis of an add_at, not "
                           f"{t.attrs.size}: {t!r}, built at {t.where_built}")
    return add_at_plan(*t.args, t, t.attrs.axis).nbytes if count and t.size else 0


TARGET = Target("scatter", (ADD_AT,), AddAt, _workspace)
