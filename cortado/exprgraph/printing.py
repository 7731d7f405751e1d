"""Readable views of terms and graphs: a one-line form, an SSA listing, and Graphviz DOT."""

from .dtypes import type_string
from .graph import Graph
from .ops import CONST, FUSED_OP, PARAM, VAR


def _as_graph(outputs):
    return outputs if isinstance(outputs, Graph) else Graph(outputs)


def _is_inline_const(term):
    return term.op is CONST and term.attr("value").array.ndim == 0


BODY_INLINE = 160  # the longest body written as nested calls; a longer one, or one cut short, is written as steps


def body_text(term):
    """A fused term's body as one line: its outputs over the parameters ``in0, in1, ...``, as nested calls where
    they are short and whole, else as steps (a long body's ``%0 = add(in0, in1); %1 = tanh(%0); ...; -> %14, %0``),
    which write each value once: a region's outputs share their subterms, which nested calls would repeat or cut
    to ``...``."""
    outputs, index = term.attr("outputs"), term.attr("index")
    shown = "; ".join(inline(o, depth=6) for o in outputs)
    if "..." in shown or len(shown) > BODY_INLINE:
        shown = _steps(outputs)
    return f"{{{shown}}}" + (f"[{index}]" if len(outputs) > 1 else "") + (" made again" if term.attr("again") else "")


def _steps(outputs):
    """``outputs`` as ``%i = op(...)`` steps, each value once, then ``-> `` the outputs."""
    names, steps = {}, []
    for t in _as_graph(list(outputs)).schedule:
        if t.op in (PARAM, VAR, CONST):
            names[t] = inline(t)
        else:
            names[t] = f"%{len(steps)}"
            steps.append(f"{names[t]} = {t.op.name}({', '.join([names[a] for a in t.args] + _attr_text(t))})")
    return "; ".join(steps + ["-> " + ", ".join(names[o] for o in outputs)])


def _attr_text(term):
    if term.op is FUSED_OP:
        return [body_text(term)]
    shown = []
    for name, value in term.attr_dict.items():
        if term.op in (VAR, CONST) or value is False:
            continue
        if name == "dtype":
            value = value.name
        shown.append(f"{name}={value!r}")
    return shown


def inline(term, depth=3):
    """``add(matmul(x, W), b)``: a term as one expression, cut to ``...`` below ``depth``."""
    if term.op is VAR:
        return term.name
    if term.op is PARAM:
        return f"in{term.attr('index')}"
    if _is_inline_const(term):
        return repr(term.attr("value"))
    if term.op is CONST:
        splat = term.attr("value").scalar is not None
        return repr(term.attr("value")) if splat else f"const({type_string(term.shape, term.dtype)})"
    if depth == 0:
        return "..."
    parts = [inline(a, depth - 1) for a in term.args] + _attr_text(term)
    return f"{term.op.name}({', '.join(parts)})"


def call_text(term, shown):
    """``matmul(k2.fused, W)``: ``term``'s op over its operands as ``shown`` writes them, with its attributes."""
    return f"{term.op.name}({', '.join([shown(a) for a in term.args] + _attr_text(term))})"


def result_label(term, kernel):
    """``k3.matmul``, ``k5.fused[2]``: ``term`` by the kernel (its place in the schedule) that computes it, short
    enough to name it wherever it is read (a variable by its name)."""
    if term.op is VAR:
        return term.name
    several = term.op.result_count(term) > 1
    return f"k{kernel}.{term.op.name}" + (f"[{term.attr(term.op.result_attr)}]" if several else "")


def _names(graph):
    """A printed name per term: variables by name (made unique), the rest ``%0, %1, ...``."""
    names = {}
    taken = set()
    counter = 0
    for term in graph.schedule:
        if term.op is VAR:
            name, k = term.name, 1
            while name in taken:
                k += 1
                name = f"{term.name}#{k}"
            taken.add(name)
            names[term] = name
        elif _is_inline_const(term):
            names[term] = repr(term.attr("value"))
        else:
            names[term] = f"%{counter}"
            counter += 1
    return names


def format_graph(outputs):
    """One SSA-style line per term, variables first, outputs last::

        var x : float32[64,784]
        %0 = matmul(x, W) : float32[64,10]
        return %0

    ``outputs`` is a term, a list of terms or a Graph.
    """
    graph = _as_graph(outputs)
    names = _names(graph)
    lines = []
    body = []
    for term in graph.schedule:
        typ = type_string(term.shape, term.dtype)
        if term.op is VAR:
            lines.append(f"var {names[term]} : {typ}")
        elif term.op is CONST:
            if not _is_inline_const(term):
                body.append((f"{names[term]} = const {term.attr('value')!r}", typ))
        else:
            parts = [names[a] for a in term.args] + _attr_text(term)
            body.append((f"{names[term]} = {term.op.name}({', '.join(parts)})", typ))
    width = max((len(text) for text, _ in body), default=0)
    lines += [f"{text:<{width}} : {typ}" for text, typ in body]
    lines.append("return " + ", ".join(names[o] for o in graph.outputs))
    return "\n".join(lines)


def _quote(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(outputs):
    """Graphviz DOT of a term, list of terms or Graph: a node per term, an edge per argument."""
    graph = _as_graph(outputs)
    names = _names(graph)
    ids = {term: f"n{i}" for i, term in enumerate(graph.schedule)}
    outputs = set(graph.outputs)
    lines = ["digraph cortado {", '  node [shape=box, fontname="monospace"];']
    for term in graph.schedule:
        typ = type_string(term.shape, term.dtype)
        if term.op is VAR:
            label, shape = f"{names[term]}\n{typ}", "ellipse"
        elif term.op is CONST:
            label, shape = f"{term.attr('value')!r}\n{typ}", "plaintext"
        else:
            attrs = ", ".join(_attr_text(term))
            label = f"{names[term]} = {term.op.name}" + (f"({attrs})" if attrs else "") + f"\n{typ}"
            shape = "box"
        extra = ", peripheries=2" if term in outputs else ""
        lines.append(f"  {ids[term]} [label={_quote(label)}, shape={shape}{extra}];")
    for term in graph.schedule:
        for position, arg in enumerate(term.args):
            label = f' [label="{position}"]' if len(term.args) > 1 else ""
            lines.append(f"  {ids[arg]} -> {ids[term]}{label};")
    lines.append("}")
    return "\n".join(lines)
