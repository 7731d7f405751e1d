"""The GPU's targets: one module for each kind of call a step makes, each declaring a ``Target``.

A target names the ops whose kernels it runs and how a ``Runner`` is made for one kernel of the plan; its
lowering rules, where rules build its op, are the file of the same name in ``lowering/``. The executor walks the
plan and calls runners, knowing none by name:

- ``fused``: the generated kernels (fused regions, and the window, gather and copy kernels);
- ``gemm``: cuBLASLt; ``conv``: cuDNN's convolutions (and their im2col, NCHW form between copies and weight-gradient kernels);
- ``int8``: our int8 tensor-core kernels, or cuBLASLt's; ``float8``: cuBLASLt's scaled float8 GEMM;
  ``attention``: cuDNN's flash attention;
- ``collectives``: NCCL's all-reduce of a bucket of gradients, beside the kernels after it.

A runner is built once, when the program is built, from the plan's view of its values (``View``); the same
runner answers the memory planner's question (its workspace) and runs the step.
"""

import functools
import importlib
import pkgutil
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ....errors import BackendError


class Runner:
    """One kernel of the plan, ready to run: ``values`` are the values whose device addresses its call takes, in
    order (its operands, then its results); ``workspace_bytes`` the scratch it needs, at an address of its own."""

    values = ()
    workspace_bytes = 0
    tuned = False  # it chooses among candidates when the program is built (``tune``)
    library = None  # the library call it makes (cuBLASLt's, cuDNN's, an int8 kernel's), where it makes one
    detail = ""  # what tells its kernel apart in a profile (a gemm's epilogue, a convolution's mode)

    def tune(self, addresses, workspace, stream):
        """Choose among its candidates, timed on the buffers at ``addresses`` (whose contents it overwrites)."""

    def bind(self, addresses, workspace, stream):
        """The call (no arguments) that runs it on ``addresses`` and ``workspace`` on ``stream`` (a CuPy stream, also
        CuPy's current one when the call is made): made once for each set of addresses a step runs at, so a call
        does no lookups of its own."""
        raise NotImplementedError

    def describe(self):
        """What it runs, as ``explain()`` shows it."""
        return self.library.describe() if self.library is not None and hasattr(self.library, "describe") else ""


@dataclass(frozen=True)
class View:
    """What a target may know of the planned step: each value's element ``strides``, its fixed device address
    (``addresses``; None for a feed, known only at a call), whether it is a constant of the program (``constant``),
    the dtypes whose images are stored channels last, the compile options, and the stream asynchronous calls run on."""

    strides: dict
    addresses: dict
    constant: Callable
    channels_last_for: frozenset
    options: dict
    side: object = None


@dataclass(frozen=True)
class Target:
    """A kind of call: the ``ops`` whose kernels it runs, and ``runner(kernel, view)``, a ``Runner`` for one of them.
    ``workspace(kernel, view)``, where given, answers the planner without building a runner (whose kernels depend on
    where the plan puts the values); otherwise the runner is built once, for planner and executor both
    (``reusable``: it depends on the values' strides and the options only)."""

    name: str
    ops: tuple
    runner: Callable
    workspace: Callable | None = None
    reusable: bool = False


@functools.cache
def _by_op():
    """Every module of this package that declares a ``TARGET``, by the ops it runs: a new target is a new module."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        target = getattr(importlib.import_module(f"{__name__}.{info.name}"), "TARGET", None)
        if target is not None:
            found.update(dict.fromkeys(target.ops, target))
    return found


def target_of(t):
    """The target that runs the kernel of term ``t``."""
    target = _by_op().get(t.op)
    if target is None:
        raise BackendError(f"the cupy backend cannot run {t.op.name} yet: {t!r}, built at {t.where_built}")
    return target


KEPT = 512  # reusable runners kept between the planner's questions and the executor's build (cuBLASLt's, cuDNN's)
_local = threading.local()  # one thread compiles one program at a time: its runners are never another program's


def _kept():
    if not hasattr(_local, "kept"):
        _local.kept = OrderedDict()
    return _local.kept


def runner(kernel, view):
    """The runner of ``kernel`` (a schedule's kernel: its term and the terms it defines)."""
    target = target_of(kernel.term)
    if not target.reusable:
        return target.runner(kernel, view)
    t = kernel.term
    key = (t, tuple(view.strides.get(x) for x in (*t.args, *kernel.terms)), tuple(sorted(view.options.items())),
           view.channels_last_for, tuple(view.constant(a) for a in t.args))
    kept = _kept()
    made = kept.pop(key, None)
    if made is None:
        made = target.runner(kernel, view)
    kept[key] = made
    while len(kept) > KEPT:
        kept.popitem(last=False)
    return made


def forget():
    """Forget the runners kept for reuse: the program being built has its own now (its executor's)."""
    _kept().clear()


def workspace_bytes(kernel, view):
    """The scratch bytes ``kernel``'s runner needs, for the memory planner."""
    target = target_of(kernel.term)
    return target.workspace(kernel, view) if target.workspace is not None else runner(kernel, view).workspace_bytes
