"""The IR: terms, the op table, the functions that build terms, and graphs of them."""

from .constructors import *  # noqa: F401,F403  (the user-facing functions, listed in __all__)
from .constructors import __all__ as CONSTRUCTORS  # noqa: F401
from .graph import Graph, schedule, users  # noqa: F401
from .ops import OPS, Op  # noqa: F401
from .printing import format_graph, inline, to_dot  # noqa: F401
from .term import Term, interned_count  # noqa: F401
