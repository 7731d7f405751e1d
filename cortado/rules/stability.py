"""``stability``: rewrite numerically fragile forms into stable ops, as PyTensor's stabilize set does.

``log(1 + x)`` loses every digit of a small ``x`` (in float32, ``log(1 + 1e-10)`` is 0) where
``log1p(x)`` keeps them; ``log(sum(exp(x)))`` overflows for logits near 1000 where ``logsumexp``
does not; ``log(softmax(x))`` is ``-inf`` wherever the softmax underflows, ``log_softmax`` never.
``log(sigmoid(x))`` becomes ``-softplus(-x)``, finite for every finite ``x``, and
``log(1 - sigmoid(x))`` becomes ``-softplus(x)`` in each form it is written in: ``log(-sigmoid(x) + 1)``
is first ``log1p(-sigmoid(x))``, which is caught too. Rules whose pattern adds to or negates ``x``
apply to floating ``x`` only: integers wrap around.

The forms people write out become the ops, with the constant on either side, as ``grad`` meets
them before ``simplify`` orders them: ``exp(x) / (1 + exp(x))``, ``1 / (1 + exp(-x))`` and
``1 - 1 / (1 + exp(x))`` are ``sigmoid(x)`` (at ``x = 89`` the first is ``inf / inf``, nan, and the
gradient of ``1 / (1 + exp(x))`` is ``0 * inf``); ``x - log(sum(exp(x), a, keepdims=True))`` is
``log_softmax`` (``x - logsumexp`` loses the digits of ``x - max`` for large ``x``); and
``log(mean(exp(x)))`` is ``logsumexp(x) - log(n)``.

``stabiliser`` applies the set everywhere until nothing changes, as ``compile`` does; the
reverse-mode driver runs it on a model before differentiating it, so a gradient is that of the
stable form, finite where the stable form is. It applies the ``attention`` rule too (``rules.attention``):
what is recognised as one op before differentiation has its gradient as one op.
"""

import math

from ..exprgraph import constructors as ct
from ..exprgraph.term import Term
from .attention import attention
from .engine import Fixpoint, Postwalk, Rule, RuleSet
from .guards import floating

real = floating("_x")  # on integers 1 + x and -x wrap around: the identities below need real x


def _log_mean_exp(b):
    """``log(mean(exp(x)))`` as ``logsumexp(x) - log(n)``, ``n`` the count averaged: the mean of
    ``exp`` overflows where ``logsumexp`` does not. Tensors only (text has no shapes to count)."""
    x, axes = b["_x"], b["_a"]
    if not isinstance(x, Term):
        return None
    n = math.prod(x.shape[i] for i in axes)
    if n == 0:
        return None  # an empty mean is nan, an empty logsumexp -inf
    total = ct.logsumexp(x, axis=axes, keepdims=b["_k"])
    return total if n == 1 else total - math.log(n)


stability = RuleSet([
    Rule("log1p", "log(1 + _x)", "log1p(_x)", guard=real),
    Rule("log1p-right", "log(_x + 1)", "log1p(_x)", guard=real),
    Rule("expm1", "exp(_x) - 1", "expm1(_x)"),
    Rule("expm1-constant-first", "-1 + exp(_x)", "expm1(_x)"),
    Rule("softplus", "log1p(exp(_x))", "softplus(_x)"),
    Rule("logsumexp", "log(sum(exp(_x), axis=_a, keepdims=_k))", "logsumexp(_x, axis=_a, keepdims=_k)"),
    Rule("logsumexp-all", "log(sum(exp(_x)))", "logsumexp(_x)"),
    Rule("log-softmax", "log(softmax(_x, axis=_a))", "log_softmax(_x, axis=_a)"),
    Rule("log-softmax-last", "log(softmax(_x))", "log_softmax(_x)"),
    Rule("log-mean-exp", "log(mean(exp(_x), axis=_a, keepdims=_k))", _log_mean_exp, guard=real),
    Rule("log-softmax-written", "_x - logsumexp(_x, axis=_a, keepdims=True)", "log_softmax(_x, axis=_a)", guard=real),
    Rule("log-softmax-written-all", "_x - logsumexp(_x)", "log_softmax(_x, axis=None)", guard=real),
    Rule("softmax", "exp(_x) / sum(exp(_x), axis=_a, keepdims=True)", "softmax(_x, axis=_a)"),
    Rule("softmax-all", "exp(_x) / sum(exp(_x))", "softmax(_x, axis=None)"),
    Rule("sigmoid", "1 / (1 + exp(-_x))", "sigmoid(_x)", guard=real),
    Rule("sigmoid-constant-last", "1 / (exp(-_x) + 1)", "sigmoid(_x)", guard=real),
    Rule("sigmoid-of-negative", "1 / (1 + exp(_x))", "sigmoid(-_x)", guard=real),
    Rule("sigmoid-of-negative-constant-last", "1 / (exp(_x) + 1)", "sigmoid(-_x)", guard=real),
    Rule("sigmoid-ratio", "exp(_x) / (1 + exp(_x))", "sigmoid(_x)", guard=real),
    Rule("sigmoid-ratio-constant-last", "exp(_x) / (exp(_x) + 1)", "sigmoid(_x)", guard=real),
    Rule("sigmoid-complement", "1 - sigmoid(-_x)", "sigmoid(_x)", guard=real),
    Rule("log-sigmoid-of-negative", "log(sigmoid(-_x))", "-softplus(_x)", guard=real),
    Rule("log-sigmoid", "log(sigmoid(_x))", "-softplus(-_x)", guard=real),
    Rule("log-one-minus-sigmoid", "log(1 - sigmoid(_x))", "-softplus(_x)"),
    Rule("log1p-negative-sigmoid", "log1p(-sigmoid(_x))", "-softplus(_x)"),
], name="stability")

stabiliser = Fixpoint(Postwalk(stability + attention))
