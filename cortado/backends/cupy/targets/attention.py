"""cuDNN's flash attention: ``dnn_attention`` and ``dnn_attention_grad`` terms (``lowering/attention.py`` builds
them), forward (output and statistics) or backward (``dq``, ``dk``, ``dv``), one call each."""

from ..dnn_attention import Attention, attention_copies
from ..lowering.attention import DNN_ATTENTION, DNN_ATTENTION_GRAD
from . import Target
from .library import LibraryCall


class _AttentionCall(LibraryCall):
    tuned = False  # cuDNN's heuristics choose its plan


def _runner(kernel, view):
    library = []

    def build(reads):
        library.append(Attention(kernel.term, reads, view.options["deterministic"]))
        return library[0]

    def arguments(placed, workspace):
        return [placed[x] for x in library[0].values], workspace

    return _AttentionCall(kernel, view, attention_copies(kernel.term, view.strides), build, arguments)


TARGET = Target("attention", (DNN_ATTENTION, DNN_ATTENTION_GRAD), _runner, reusable=True)
