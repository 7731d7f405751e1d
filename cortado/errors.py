"""The exceptions cortado raises: one family, so ``except ct.CortadoError`` catches them all.

Each also derives from the built-in exception a Python user would expect (a shape error is a
``ValueError``, a dtype error a ``TypeError``), so code written against NumPy keeps working.
"""


class CortadoError(Exception):
    """Base class of every error cortado raises on purpose."""


class ShapeError(CortadoError, ValueError):
    """Operands whose shapes the op cannot accept, or an attribute (axis, shape) out of range."""


class DTypeError(CortadoError, TypeError):
    """An unknown dtype, operands whose dtypes the op cannot accept, or a value that is no tensor."""


class FeedError(CortadoError, KeyError):
    """A feed that is missing, unexpected, or ambiguous by name."""

    def __str__(self):  # KeyError would quote the message; show it as written
        return str(self.args[0]) if self.args else ""


class IndexRangeError(CortadoError, IndexError):
    """An index tensor holding a value outside the axis it indexes, found when the values are known. ``index`` and
    ``size`` (where known) are that value and the axis' length, so that a caller can say it in the user's terms."""

    def __init__(self, message, index=None, size=None):
        super().__init__(message)
        self.index, self.size = index, size


class RewriteError(CortadoError):
    """A rewrite that cannot be applied, or rewriting that does not terminate."""


class GradError(CortadoError, TypeError):
    """A gradient asked for with respect to something that is not a variable, or with wrong cotangents."""


class PlanError(CortadoError):
    """A memory plan that cannot be made or does not verify."""


class BackendError(CortadoError):
    """A backend that cannot run a program (missing device, unsupported op)."""
