"""``Program``: a compiled step. Call it with feeds; it returns the outputs and updates its state.

    step = ct.compile([loss], inputs=[x, y], state={W: Wv}, updates={W: W - 0.1 * gW})
    (loss_value,) = step(x=xv, y=yv)
    step(xv, yv)           # the same: values in the order of ``inputs``
    step.state["W"]        # the current value (a read-only view; assign to replace it); step.state[W] too
    step.memory            # the MemoryPlan: peak_bytes, lower_bound_bytes, naive_bytes, plot()
    print(step.explain())  # the rules that fired, the kernels, the plan
"""

import threading
from collections.abc import Mapping

import numpy as np

from .errors import FeedError
from .exprgraph import feeds as feed_checks
from .exprgraph.dtypes import converted, type_string
from .exprgraph.graph import two_variables_named
from .exprgraph.ops import FUSED_OP, VAR
from .exprgraph.ops.collectives import ALL_REDUCE
from .exprgraph.printing import body_text, call_text, inline, result_label
from .exprgraph.term import Term
from .memplan import aligned
from .rules.engine import refusals


class State(Mapping):
    """A program's state by variable name: views of the live buffers (read-only where NumPy can say so;
    on the GPU, CuPy arrays that the next call updates). A state variable indexes it as its name does
    (``state[W]`` is ``state["W"]``), as it keys ``state=`` and ``updates=`` in ``compile``.

    ``state["W"] = value`` replaces a value (checked like a feed, copied in), never in the middle of a call. It is
    the one way to write one: it also writes what the program keeps of it (a weight's cast to bfloat16, which the
    GPU keeps as state of its own, ``rules.kept_casts``), which a write into a GPU array in place would leave stale.
    """

    def __init__(self, arrays, write, inputs=()):
        self._arrays = {v.name: (v, a) for v, a in arrays.items()}
        self._write = write
        self._inputs = frozenset(inputs)  # the program's inputs' names, which a call feeds

    def _name(self, key):
        """The name of the state variable ``key`` is or names; a FeedError for anything else."""
        name = key.name if isinstance(key, Term) else key
        if name not in self._arrays:
            fed = f" ({name!r} is an input, fed at each call)" if name in self._inputs else ""
            raise FeedError(f"no state variable {key!r}{fed}; the state is {sorted(self._arrays) or 'empty'}")
        var = self._arrays[name][0]
        if isinstance(key, Term) and key is not var:
            raise FeedError(f"state: {two_variables_named(var, key)}")
        return name

    def variable(self, key):
        """The state variable (the term) that ``key`` names: what a function of the variable (an optimizer's
        ``decay(name, variable)``) is asked about."""
        return self._arrays[self._name(key)][0]

    def __getitem__(self, key):
        array = self._arrays[self._name(key)][1]
        if isinstance(array, np.ndarray):
            array = array.view()
            array.flags.writeable = False
        return array

    def __setitem__(self, key, value):
        name = self._name(key)
        var, _ = self._arrays[name]
        self._write(var, feed_checks.bind({name: var}, {name: value}, what="the value written to")[var])

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self):
        return len(self._arrays)

    def __repr__(self):
        return "State(" + ", ".join(f"{n}: {type_string(v.shape, v.dtype)}" for n, (v, _) in self._arrays.items()) + ")"


class Program:
    """One compiled step; built by ``ct.compile``.

    A program owns one arena, one feed table and its state, so calls on it are serialised: calls from
    several threads run one at a time, each whole (for steps that run side by side, compile one program
    per thread).
    """

    def __init__(self, signature, outputs, updates, kernels, plan, executor, traces, backend, sinks, buckets=(),
                 kept_casts=None):
        self.signature = signature
        self.outputs = tuple(outputs)
        self.updates = updates
        self.kernels = tuple(kernels)
        self.memory = plan
        self.traces = traces
        self.backend = backend
        self._sinks = sinks
        self.buckets = tuple(buckets)  # a data-parallel program's all-reduce buckets (``distributed.Bucket``)
        self._executor = executor
        self._inputs = {v.name: v for v in signature.inputs}
        self._running = threading.Lock()
        self._casts = {}  # {state variable: [(the state variable holding a cast of it, the cast's dtype)]}
        for kept, (source, dtype) in (kept_casts or {}).items():
            self._casts.setdefault(source, []).append((kept, dtype))
        hidden = {kept for casts in self._casts.values() for kept, _ in casts}
        self.state = State({v: a for v, a in executor.state.items() if v not in hidden}, self._write_state,
                           self._inputs)

    def _write_state(self, var, value):
        """Write ``var``'s value, and the casts of it that the program keeps as state (``rules.kept_casts``)."""
        with self._running:
            self._executor.write_state(var, value)
            for kept, dtype in self._casts.get(var, ()):
                self._executor.write_state(kept, converted(value.get() if hasattr(value, "get") else value, dtype))

    @property
    def device_bytes(self):
        """Every byte the program holds on the GPU: arena, state, outputs, constants (0 on the CPU)."""
        return self._executor.device_bytes

    @property
    def kernels_run(self):
        """How many of ``kernels`` do work each step, those ``profile`` times: the others are views, or feeds read
        where they lie."""
        launched = self._executor.launched
        return len(self.kernels) if launched is None else len(launched)

    @property
    def inputs(self):
        return self.signature.inputs

    def __call__(self, *values, **named):
        """The outputs for these feeds, then the updates. Feeds are values in the order of ``inputs``
        (``program(xv, yv)``, as a JAX or PyTorch function is called), by name (``program(x=xv, y=yv)``), both
        (each input once), or one mapping by name or variable (``program({"x": xv})``).

        Every feed is checked before anything runs, so a rejected call changes no state.
        """
        bound = feed_checks.bind(self._inputs, self._feeds(values, named), state=self.state, compiled=True)  # in _inputs' order
        with self._running:
            results = self._executor.run(dict(zip(self._inputs, bound.values())))
        return results[0] if self.signature.single else results

    def profile(self, *values, **named):
        """The time of each kernel of one step on these feeds (given as to a call): a table, slowest first.

        On the GPU the step runs eagerly (no CUDA graph) with an event around each kernel; on the CPU the host's
        clock is read around each kernel's calls, made one by one. Either way it updates the state as a call does.
        """
        bound = feed_checks.bind(self._inputs, self._feeds(values, named), state=self.state, compiled=True)
        with self._running:
            times = self._executor.profile({v.name: value for v, value in bound.items()})
        total = sum(ms for _, ms in times) or 1.0
        waits = len(times) - self.kernels_run  # the GPU's waits for work beside the step, timed as they stand
        lines = [f"{self.kernels_run} kernels{f' and {waits} waits' if waits > 0 else ''}, {total:.3f} ms in all:"]
        lines += [f"  {ms:9.3f} ms {ms / total:6.1%}  {label}" for label, ms in sorted(times, key=lambda x: -x[1])]
        return "\n".join(lines)

    def _feeds(self, values, named):
        """The feeds of a call as one mapping: values by position feed the inputs in order (``None`` alone, as
        ``program(None)`` was once written for no feeds, is no feeds)."""
        if not values or (len(values) == 1 and values[0] is None):
            return named
        if len(values) == 1 and isinstance(values[0], Mapping):
            if named:
                raise FeedError("give the feeds either as one mapping or as keyword arguments, not both")
            return values[0]
        if len(values) > len(self.inputs):
            raise FeedError(f"{len(values)} feeds given by position, but the program has {len(self.inputs)} "
                            f"input(s), in this order: ({self._inputs_text()})")
        positional = {v.name: value for v, value in zip(self.inputs, values)}
        twice = [name for name in positional if name in named]
        if twice:
            raise FeedError(f"{twice} fed both by position and by name (inputs in order: {self._inputs_text()})")
        return {**positional, **named}

    def _inputs_text(self):
        return ", ".join(f"{v.name}: {type_string(v.shape, v.dtype)}" for v in self.inputs)

    def __repr__(self):
        return (f"<Program ({self._inputs_text()}) -> {len(self.outputs)} outputs, {len(self.updates)} updates; "
                f"{self.kernels_run} kernels run on {self.backend}; arena {self.memory.peak_bytes} bytes>")

    def explain(self, examples=3):
        """The rules that fired in each stage (the first ``examples`` rewrites of each, before and after), the
        kernels in order, and the memory plan."""
        return "\n".join(self._rules(examples) + [""] + self._schedule() + self._buckets()
                         + ["", "memory: " + self.memory.summary()])

    def _rules(self, examples):
        lines = ["rules:"]
        for stage, trace in self.traces.items():
            counts, label = trace.counts(), trace.label or stage
            if not counts:
                lines.append(f"  {label}: nothing fired")
            else:
                lines.append(f"  {label}: {len(trace)} rewrite{'' if len(trace) == 1 else 's'}: "
                             + ", ".join(f"{n} x{c}" for n, c in counts.most_common()))
                lines += [f"      {step}" for step in list(trace)[:examples]]
                if len(trace) > examples:
                    lines.append(f"      ... and {len(trace) - examples} more (explain(examples=n) shows n of each "
                                 "stage)")
            if stage == "your rules":  # why a rule of yours that matched did not fire: the first refusal of each
                lines += [f"      refused: {line}" for line in refusals(trace)]
            elif stage == "simplify":  # the guarded rewrites not made, and why (fast_math=True makes some)
                lines += [f"      {line}" for line in refusals(trace, kept_only=True)]
        return lines

    def _schedule(self):
        """A line for each kernel and each update. A kernel's operands are named by the kernels that make them
        (``k3.matmul``, ``k5.fused[2]``), so the data flow reads from the text; a region's body is written once, on
        its kernel's line: a backward region reads hundreds of a forward one's values, and the body written at each
        would grow the text with the square of the step."""
        lines = [f"kernels ({len(self.kernels)} in order; {self.kernels_run} do work each step, the others are "
                 "views, feeds read where they lie, or values another kernel writes in place):"]
        named = {t: result_label(t, i) for i, k in enumerate(self.kernels) for t in k.terms}

        def shown(t):
            return named.get(t) or inline(t, 1)

        for i, kernel in enumerate(self.kernels):
            t = kernel.term
            if t.op is VAR:
                what = f"load {t.name}"
            elif t.op is FUSED_OP:
                what = f"fused({', '.join(shown(a) for a in t.args)}) {body_text(t)}"
            else:
                what = call_text(t, shown)
            if t in self._executor.choices:
                what += f"  [{self._executor.choices[t].describe()}]"
            where = ", ".join(self._where(d) for d in kernel.terms)
            lines.append(f"  k{i:<3} {what}  -> {where}" + ("  (beside the step)" if i in self._executor.beside else ""))
        for var, value in self.updates.items():
            how = "computed in place" if self._sinks.get(value) is var else "copied in after the step"
            lines.append(f"  update {var.name} <- {shown(value)}: {how}")
        return lines

    def _buckets(self):
        """Each all-reduce bucket: its gradients, its bytes, and the kernels it runs beside."""
        if not self.buckets:
            return []
        lines = ["", f"data parallel: {len(self.buckets)} all-reduce bucket(s), averaged over the ranks"]
        for i, k in enumerate(self.kernels):
            if k.term.op is not ALL_REDUCE:
                continue
            readers = [j for j in range(i + 1, len(self.kernels)) if any(r in k.terms for r in self.kernels[j].reads)]
            joined = readers[0] if readers else len(self.kernels)
            beside = f"beside k{i + 1}..k{joined - 1}" if joined > i + 1 else "beside no kernel"
            waited = f"k{joined} waits for it" if readers else "the step's end waits for it"
            bucket = k.term.attr("bucket")
            where = ("reduced in place" if all(r in self.memory and self.memory[r].takes_from is g
                                               for g, r in zip(k.term.args, k.terms))
                     else "read where they lie" if self._side_by_side(k.term.args) else "packed first")
            lines.append(f"  bucket {bucket}: k{i}, {len(k.terms)} gradient(s), {self.buckets[bucket].nbytes / 1024:.1f} KiB "
                         f"{where}, issued after k{i - 1}, runs {beside}; {waited}")
        return lines

    def _side_by_side(self, values):
        """Whether the plan put ``values`` one after another in the arena (else a bucket's call copies them together)."""
        if not all(v in self.memory for v in values):
            return False
        places = [self.memory[v] for v in values]
        return all(b.offset == a.offset + aligned(a.nbytes, self.memory.alignment) for a, b in zip(places, places[1:]))

    def _where(self, t):
        typ = type_string(t.shape, t.dtype)
        layout = self._executor.layout(t)
        typ += f" {layout}" if layout else ""
        if t in self.memory:
            p = self.memory[t]
            shared = f" (in place of {self.memory[p.takes_from].label})" if p.takes_from is not None else ""
            return f"{typ} @ {p.offset}{shared}"
        if t in self._sinks:
            return f"{typ} in state {self._sinks[t].name}"
        if t in self._executor.direct_outputs:
            return f"{typ} in output {self.outputs.index(t)}"
        if t.op is VAR:
            return f"{typ} fed, read where the caller keeps it"
        return f"{typ} (a view)"
