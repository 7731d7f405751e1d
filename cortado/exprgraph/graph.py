"""Graphs: the terms reachable from some outputs, in an order that evaluates them.

Every walk here is iterative, so a chain of 100k terms needs no deep Python recursion.
"""

import contextlib
import gc

from ..errors import DTypeError, FeedError
from .ops import VAR
from .term import Term


@contextlib.contextmanager
def collector_paused():
    """Pause Python's cyclic garbage collector for a walk that makes no reference cycles.

    A walk keeps many small containers alive at once; each collection the allocations trigger
    would rescan every live term, which made scheduling a 100k-term graph 3x slower than linear.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def as_outputs(outputs):
    """A tuple of terms from one term or an iterable of them."""
    if isinstance(outputs, Term):
        return (outputs,)
    if isinstance(outputs, dict):
        raise DTypeError("expected a cortado term or a list of them, not a dict (ct.grad of a model's parameters() "
                         "gives one, keyed by name): list(gradients.values()) is its terms")
    try:
        outputs = tuple(outputs)
    except TypeError:
        raise DTypeError(f"expected a cortado term or a list of them, not {type(outputs).__name__}") from None
    for out in outputs:
        if not isinstance(out, Term):
            raise DTypeError(f"expected cortado terms as outputs, got {type(out).__name__} {out!r}")
    return outputs


def schedule(outputs):
    """Every term the outputs depend on, each after its arguments (depth-first post-order)."""
    return post_order(as_outputs(outputs))


def post_order(roots):
    """Every node reachable from ``roots`` once, each after its ``args``: for any node with ``args``."""
    order = []
    seen = set()
    with collector_paused():
        _walk(roots, order, seen)
    return order


def _walk(outputs, order, seen):
    # the results of one kernel of several (a fused region's) are terms with one tuple of args, each of them: once a
    # node with those args is done, every arg is in ``seen``, so the others skip them (else a region of n results and
    # n operands would cost n * n steps); no arg reached from a node can have that node's args (a cycle)
    walked = {}  # id(args) -> args, for the args tuples of nodes done
    for out in outputs:
        if out in seen:
            continue
        seen.add(out)
        stack = [(out, iter(() if id(out.args) in walked else out.args))]
        while stack:
            node, pending = stack[-1]
            for arg in pending:
                if arg not in seen:
                    seen.add(arg)
                    stack.append((arg, iter(() if id(arg.args) in walked else arg.args)))
                    break
            else:
                stack.pop()
                order.append(node)
                walked[id(node.args)] = node.args


def folded(root, memo, value, settled=None):
    """``memo[root]`` once every term under ``root`` has its value there: ``value(term)`` once its arguments' are in
    ``memo``, or ``settled(term)`` where that is not None, its arguments then not walked. Iterative, children first,
    each term once however many calls share ``memo``."""
    stack = [root]
    while stack:
        t = stack[-1]
        if t in memo:
            stack.pop()
            continue
        given = None if settled is None else settled(t)
        pending = [] if given is not None else [a for a in t.args if a not in memo]
        if pending:
            stack.extend(pending)
            continue
        memo[stack.pop()] = given if given is not None else value(t)
    return memo[root]


def users(order):
    """For each term of a schedule, the ``(user, argument position)`` pairs that read it."""
    result = {term: [] for term in order}
    for term in order:
        for position, arg in enumerate(term.args):
            result[arg].append((term, position))
    return result


def readers_of(order):
    """For each term that a term of ``order`` reads, the set of those terms reading it (a term absent: none)."""
    found = {}
    for term in order:
        for arg in set(term.args):
            found.setdefault(arg, set()).add(term)
    return found


class Graph:
    """The outputs, their schedule and the users of each term, computed once."""

    def __init__(self, outputs):
        self.outputs = as_outputs(outputs)
        self.schedule = schedule(self.outputs)
        self.users = users(self.schedule)

    @property
    def variables(self):
        return [t for t in self.schedule if t.op is VAR]

    def variables_by_name(self):
        """``{name: var}``; two different variables with one name are an error, named."""
        found = {}
        for v in self.variables:
            other = found.setdefault(v.name, v)
            if other is not v:
                raise FeedError(two_variables_named(other, v))
        return found

    def __len__(self):
        return len(self.schedule)

    def __str__(self):
        from .printing import format_graph

        return format_graph(self)

    def to_dot(self):
        from .printing import to_dot

        return to_dot(self)


def two_variables_named(first, second):
    """The error for two variables of one name in one graph: each ``ct.var`` call declares a variable of its
    own, and feeds, state and updates know variables by name."""
    makers = {first.attr("declaration").maker, second.attr("declaration").maker}
    models = {"cortado.nn": " (two cortado.nn models built apart name their parameters alike: make them attributes "
                            "of one nn.Module, which names each by its path)",
              "cortado.optim": " (two optimizers of one name keep their state under it: name them apart, "
                               "optim.Adam(..., name='discriminator'))"}.get(makers.pop()) if len(makers) == 1 else None
    return (f"two variables are both named {first.name!r}: {first!r} {first.attr('declaration')!r} and "
            f"{second!r} {second.attr('declaration')!r}. Each ct.var call declares a new variable: to use one "
            f"variable in two places, declare it once and pass that term to both; to have two, give them two "
            f"names{models or ''}")
