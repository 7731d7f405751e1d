"""State updates that a built term owes the step computing it: a layer in training notes them where it builds its
output (``cortado.nn``: a batch norm's running statistics, a dropout's random stream), and ``ct.compile`` warns
where a step computes such an output without them among its updates (``model.state_updates``), which would leave
the running statistics at their first values and draw the same dropout masks every step, without a word."""

import weakref

_owed = weakref.WeakKeyDictionary()  # output term -> [(what computed it, the variables' names, the consequence)]


def owe(term, what, names, unupdated):
    """Note that the step computing ``term`` (built by ``what``) should update the variables ``names``; without them
    ``unupdated`` (what goes wrong, for the warning)."""
    _owed.setdefault(term, []).append((what, tuple(names), unupdated))


def unpaid(terms, updated):
    """The notes ``(what, names, unupdated)`` on ``terms`` none of whose variables is in ``updated`` (names), each
    once."""
    found = []
    for term in terms:
        for note in _owed.get(term, ()):
            if not set(note[1]) & set(updated) and note not in found:
                found.append(note)
    return found
