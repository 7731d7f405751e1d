"""Parsing and checking einsum subscripts, with NumPy's semantics.

Everything NumPy accepts is accepted: implicit and explicit output, ``...`` broadcasting,
repeated labels (diagonals and traces), and size-1 labelled dimensions that broadcast. The
subscripts are normalised (explicit output, labels renamed in order of first appearance, no
spaces) so that equivalent einsums are one term.
"""

import string

from .term import shape_violation

LABELS = string.ascii_letters
ELLIPSIS = "..."


def _split_term(term, what):
    """A subscript term as a list of labels, with ELLIPSIS standing for the ``...``."""
    labels = []
    rest = term
    while rest:
        if rest.startswith(ELLIPSIS):
            if ELLIPSIS in labels:
                raise shape_violation(f"{what} {term!r} has more than one '...'")
            labels.append(ELLIPSIS)
            rest = rest[3:]
        elif rest[0] in LABELS:
            labels.append(rest[0])
            rest = rest[1:]
        else:
            raise shape_violation(
                f"{what} {term!r}: {rest[0]!r} is not a subscript label (labels are letters a-z, "
                f"A-Z, plus one optional '...')"
            )
    return labels


def _broadcast_ellipsis(shapes):
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for i in range(-ndim, 0):
        sizes = {s[i] for s in shapes if len(s) >= -i} - {1}
        if len(sizes) > 1:
            raise shape_violation(f"the dimensions under '...' do not broadcast: {shapes}")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def parse(subscripts, shapes):
    """``(normalised subscripts, output shape)`` for an einsum of operands with ``shapes``."""
    if not isinstance(subscripts, str):
        raise shape_violation(f"the subscripts must be a string, not {type(subscripts).__name__}")
    spec = subscripts.replace(" ", "")
    if spec.count("->") > 1:
        raise shape_violation(f"subscripts {subscripts!r} have more than one '->'")
    lhs, arrow, rhs = spec.partition("->")
    inputs = [_split_term(t, "input subscript") for t in lhs.split(",")]
    if len(inputs) != len(shapes):
        raise shape_violation(
            f"subscripts {subscripts!r} name {len(inputs)} operand(s) but {len(shapes)} were given"
        )

    sizes = {}
    ellipsis_shapes = []
    for position, (labels, shape) in enumerate(zip(inputs, shapes)):
        named = [label for label in labels if label != ELLIPSIS]
        if ELLIPSIS in labels:
            if len(named) > len(shape):
                raise shape_violation(
                    f"operand {position} has {len(shape)} dimensions but its subscripts "
                    f"{''.join(labels)!r} name {len(named)}"
                )
            cut = labels.index(ELLIPSIS)
            after = len(labels) - cut - 1
            ellipsis_shapes.append(shape[cut:len(shape) - after])
            dims = list(shape[:cut]) + list(shape[len(shape) - after:])
        else:
            if len(named) != len(shape):
                raise shape_violation(
                    f"operand {position} has {len(shape)} dimensions but its subscripts "
                    f"{''.join(labels)!r} name {len(named)}"
                )
            dims = list(shape)
        own = {}
        for label, size in zip(named, dims):
            if own.setdefault(label, size) != size:
                raise shape_violation(
                    f"operand {position} repeats label {label!r} over dimensions of different "
                    f"sizes ({own[label]} and {size})"
                )
        for label, size in own.items():
            known = sizes.get(label, 1)
            if size != 1 and known != 1 and size != known:
                raise shape_violation(
                    f"label {label!r} has size {known} in one operand and {size} in operand {position}"
                )
            sizes[label] = max(known, size) if 0 not in (known, size) else 0
    ellipsis_shape = _broadcast_ellipsis(ellipsis_shapes)

    if arrow:
        output = _split_term(rhs, "output subscript")
        named_out = [label for label in output if label != ELLIPSIS]
        for label in named_out:
            if named_out.count(label) > 1:
                raise shape_violation(f"output subscript {rhs!r} repeats label {label!r}")
            if label not in sizes:
                raise shape_violation(f"output label {label!r} does not appear in any input")
        if ELLIPSIS not in output and ellipsis_shape:
            raise shape_violation(
                f"the inputs' '...' covers {len(ellipsis_shape)} dimension(s) but the output "
                f"subscript {rhs!r} has no '...' to put them in"
            )
    else:
        counts = {}
        for labels in inputs:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        once = sorted(label for label, n in counts.items() if n == 1 and label != ELLIPSIS)
        output = ([ELLIPSIS] if ellipsis_shapes else []) + once

    out_shape = []
    for label in output:
        out_shape.extend(ellipsis_shape if label == ELLIPSIS else (sizes[label],))
    return _normalise(inputs, output), tuple(out_shape)


def _normalise(inputs, output):
    renamed = {ELLIPSIS: ELLIPSIS}
    for labels in inputs:
        for label in labels:
            renamed.setdefault(label, LABELS[len(renamed) - 1])
    lhs = ",".join("".join(renamed[label] for label in labels) for labels in inputs)
    return lhs + "->" + "".join(renamed[label] for label in output)


def spelled_out(subscripts, shapes):
    """Normalised einsum subscripts with ``...`` replaced by labels: ``(input labels, output labels)``."""
    lhs, output = subscripts.split("->")
    inputs = lhs.split(",")
    if ELLIPSIS not in subscripts:
        return inputs, output
    used = set(subscripts)
    width = max(len(shape) - len(labels.replace(ELLIPSIS, "")) for labels, shape in zip(inputs, shapes)
                if ELLIPSIS in labels)
    spare = [label for label in LABELS if label not in used][:width]
    inputs = [labels.replace(ELLIPSIS, "".join(spare[width - (len(shape) - len(labels) + 3):]))
              for labels, shape in zip(inputs, shapes)]
    return inputs, output.replace(ELLIPSIS, "".join(spare))
