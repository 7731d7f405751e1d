"""``stability``: rewrite numerically fragile forms into stable ops, as PyTensor's stabilize set does.

``log(1 + x)`` loses every digit of a small ``x`` (in float32, ``log(1 + 1e-10)`` is 0) where
``log1p(x)`` keeps them; ``log(sum(exp(x)))`` overflows for logits near 1000 where ``logsumexp``
does not; ``log(softmax(x))`` is ``-inf`` wherever the softmax underflows, ``log_softmax`` never.
``log(sigmoid(x))`` becomes ``-softplus(-x)``, finite for every finite ``x``, and
``log(1 - sigmoid(x))`` becomes ``-softplus(x)`` in each form it is written in: ``log(-sigmoid(x) + 1)``
is first ``log1p(-sigmoid(x))``, which is caught too. Rules whose pattern adds to or negates ``x``
apply to floating ``x`` only: integers wrap around.

``stabiliser`` applies the set everywhere until nothing changes, as ``compile`` does; the
reverse-mode driver runs it on a model before differentiating it, so a gradient is that of the
stable form, finite where the stable form is. It applies the ``attention`` rule too (``rules.attention``):
what is recognised as one op before differentiation has its gradient as one op.
"""

from .attention import attention
from .engine import Fixpoint, Postwalk, Rule, RuleSet
from .guards import floating

real = floating("_x")  # on integers 1 + x and -x wrap around: the identities below need real x

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
    Rule("softmax", "exp(_x) / sum(exp(_x), axis=_a, keepdims=True)", "softmax(_x, axis=_a)"),
    Rule("sigmoid", "1 / (1 + exp(-_x))", "sigmoid(_x)", guard=real),
    Rule("log-sigmoid", "log(sigmoid(_x))", "-softplus(-_x)", guard=real),
    Rule("log-one-minus-sigmoid", "log(1 - sigmoid(_x))", "-softplus(_x)"),
    Rule("log1p-negative-sigmoid", "log1p(-sigmoid(_x))", "-softplus(_x)"),
], name="stability")

stabiliser = Fixpoint(Postwalk(stability + attention))
