"""A tour of cortado's rewriting: matching, rewriting and simplifying text and tensor expressions,
a rule set of your own, and the trace that explains what fired.

    python examples/rewrite_tour.py
"""

import numpy as np

import cortado as ct
from cortado.rules import (Chain, Fixpoint, Postwalk, Prewalk, Rule, RuleSet, Trace, findex, matchex, placeholders,
                           rewrite, rewrite_all, simplify, subs)

print("-- text in, text out ---------------------------------------------------------")
print(matchex("_x + 2*_y", "a + 2*f(b)"))                     # {'_x': 'a', '_y': 'f(b)'}
print(rewrite("a + 2*b", "_x + 2*_y", "_x * _y"))              # a * b
print(rewrite("foo(1, 2, 3)", "foo(_x, *_xs)", "bar(*_xs, _x)"))  # bar(2, 3, 1)
print(subs("x + y", x="a * b"))                                # a * b + y
print(findex("_x * _y", "a*b + c*(d*e)"))                      # every product, innermost first
print(simplify("2 * (3 * x) + 0 - (y - y)"))                   # 6 * x

print("\n-- tensor expressions ------------------------------------------------------")
x = ct.var("x", (64, 10))
W = ct.var("W", (10, 10))
a, b = placeholders("a b")                                     # patterns in code ...
print(matchex(ct.exp(a) + b, ct.exp(x @ W) + x))
print(rewrite(ct.log(1 + x), "log(1 + _x)", "log1p(_x)"))       # ... or in text
print(simplify(2.0 * (0.5 * (x @ W.T.T)) * 1))                 # matmul(x, W)

print("\n-- stability: where the naive form overflows ------------------------------")
naive = ct.log(ct.softmax(x, axis=1))
stable = Fixpoint(Postwalk(Fixpoint(ct.rules.stability))).run(naive)
logits = np.zeros((64, 10), np.float32)
logits[:, 0] = 1000.0
print("naive: ", ct.evaluate(naive, {"x": logits})[0, :3])     # [0, -inf, -inf]
print("stable:", ct.evaluate(stable, {"x": logits})[0, :3], "=", stable)

print("\n-- a rule set of your own --------------------------------------------------")
# Rules are data: a name, a pattern, a replacement (a pattern or a function), an optional guard.
double_angle = RuleSet([
    Rule("sin-double", "2 * sin(_t) * cos(_t)", "sin(2 * _t)"),
    Rule("cos-squares", "cos(_t) ** 2 - sin(_t) ** 2", "cos(2 * _t)"),
    Rule("pythagoras", "sin(_t) ** 2 + cos(_t) ** 2", "1"),
], name="trigonometry")
# Prewalk sees a parent before its children, so sin(u) ** 2 + cos(u) ** 2 is met whole; then the
# built-in simplifier (algebra, bottom-up, to a fixpoint) cleans up what is left.
everything = Chain(Prewalk(double_angle), ct.rules.simplifier)
trace = Trace()
result = everything.run(ct.rules.parse("(sin(u) ** 2 + cos(u) ** 2) * (2 * sin(v) * cos(v)) + 0"), trace)
print(ct.rules.unparse(result))                                # sin(2 * v)
print(trace.explain())

print("\n-- your rule set in a program ----------------------------------------------")
# The same rules on tensors: compile runs them before its own stages, and explain() lists what they did.
angles = ct.var("angles", (4,))
program = ct.compile([ct.sin(angles) ** 2 + ct.cos(angles) ** 2 + 2 * ct.sin(angles) * ct.cos(angles)],
                     inputs=[angles], rules=double_angle)
print(program.explain().split("\n  simplify")[0])
print(program(angles=np.linspace(0, 1, 4).astype(np.float32))[0])   # 1 + sin(2 * angles)

print("\n-- the trace of a tensor simplification -----------------------------------")
# log(exp(x)) stays: exp(x) overflows to inf past 88.7 in float32 and rounds to 1 for tiny x, where x is another
# value (on text, whose symbols stand for reals, log-exp fires); x * 0.0 stays too: it is NaN where x is infinite.
trace = Trace()
simplify(ct.sum(ct.broadcast_to(ct.log(ct.exp(x)), (3, 64, 10)), axis=0) - x * 0.0 + 0, trace=trace)
print(trace.explain())
print(rewrite_all("log(1 + exp(z))", ct.rules.stability))      # one bottom-up pass: log1p(exp(z))
