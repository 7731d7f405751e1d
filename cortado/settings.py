"""The checks of the numbers users give layers, optimizers and schedules (a rate, an epsilon, a size, a seed): one
that is no number, out of its range, or a fraction where a whole number is meant is refused, naming its owner and
its name. A string or a NaN there is a mistake, never a value to convert; a NumPy scalar or a 0-d array is the
number it holds."""

import math

import numpy as np

from .errors import CortadoError


def real(owner, name, value, low=None, high=None, above=False, below=False):
    """``value`` as a float, where it is a finite real number at least ``low`` (above it with ``above``) and at most
    ``high`` (below it with ``below``)."""
    number = _scalar(value)
    if not isinstance(number, (int, float, np.integer, np.floating)) or not math.isfinite(number) \
            or (low is not None and (number <= low if above else number < low)) \
            or (high is not None and (number >= high if below else number > high)):
        bounds = [f"{'above' if above else 'at least'} {low}" if low is not None else "",
                  f"{'below' if below else 'at most'} {high}" if high is not None else ""]
        said = " and ".join(bound for bound in bounds if bound)
        raise CortadoError(f"{owner}: {name} is a finite number{', ' + said if said else ''}, not {value!r}")
    return float(number)


def whole(owner, name, value, low=0, error=CortadoError):
    """``value`` as an int, where it is a whole number (not a bool, not a float of one) of at least ``low``;
    ``error``: the exception to raise (a ``ShapeError`` for a size)."""
    number = _scalar(value)
    if not isinstance(number, (int, np.integer)) or number < low:
        raise error(f"{owner}: {name} is a whole number of at least {low}, not {value!r}")
    return int(number)


def _scalar(value):
    """The number ``value`` holds, where it is a 0-d array; a bool is none."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    return None if isinstance(value, (bool, np.bool_)) else value
