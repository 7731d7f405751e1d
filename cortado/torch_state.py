"""PyTorch's state_dicts: a model's parameters and buffers to and from a program's state, by the names PyTorch gives
them, so that weights move between a PyTorch model and its cortado twin.

    ct.load_state_dict(step, torch_model.state_dict())   # a PyTorch model's weights, by name
    ct.state_dict(step, model)                           # and back: {name: array}, as PyTorch names them
"""

from collections.abc import Mapping

from .checkpoint import _checked, _host, _program
from .errors import FeedError
from .exprgraph.dtypes import BFLOAT16


def load_state_dict(program, state_dict, strict=True, model=None):
    """Set ``program``'s state from ``state_dict`` (``{name: array}``: a PyTorch ``state_dict()``, NumPy or CuPy
    arrays), by name: each value must have its variable's shape; it is converted to the variable's dtype. With
    ``strict``, every name in the dict must be a state variable of the program, and, given the ``model``
    (a ``cortado.nn`` module), every parameter and buffer of the model must be in the dict, as PyTorch's
    ``load_state_dict`` checks, but buffers PyTorch's layers do not have (``Buffer.ours``: a dropout's random
    stream, a float8 layer's amax histories), which keep their values; otherwise only the names both have are set.
    A value its variable's dtype cannot hold (an int out of range, a NaN or a fraction for an int, a finite float
    beyond a narrower float's range) is refused, not wrapped or rounded to infinity. Returns the names set."""
    _program(program, "ct.load_state_dict")
    if not isinstance(state_dict, Mapping) or not all(isinstance(name, str) for name in state_dict):
        raise FeedError(f"a state_dict maps names to arrays (model.state_dict()), not {type(state_dict).__name__}"
                        + ("" if isinstance(state_dict, Mapping) else " (dict(pairs) makes one of pairs)"))
    names = [name for name in state_dict if name in program.state]
    if strict:
        extra = sorted(set(state_dict) - set(program.state))
        missing = sorted(set(_pytorchs_names(model)) - set(state_dict)) if model is not None else []
        if extra or missing:
            raise FeedError("state_dict " + "; ".join(part for part in (
                f"names {extra}, which the program's state does not have" if extra else "",
                f"lacks {missing}, of the model" if missing else "") if part)
                + " (strict=False sets the names both have)")
    if state_dict and not names:  # strict=False matched nothing: a prefix (DataParallel's "module."), another model
        raise FeedError(f"state_dict: none of its names ({', '.join(sorted(state_dict)[:3])}, ...) is a state variable "
                        f"of the program ({', '.join(sorted(program.state)[:3])}, ...); nothing was set")
    checked = {name: _checked(program, name, _numpy(state_dict[name]), "the state_dict", same_dtype=False)
               for name in names}
    for name, array in checked.items():  # all checked first: a refused state_dict changes nothing
        program.state[name] = array
    return names


def state_dict(program, model):
    """The ``model``'s parameters and buffers as ``program`` holds them, ``{name: NumPy array}`` by the names PyTorch
    gives them (those of its layers that PyTorch's have: not ``Buffer.ours``), the inverse of
    ``load_state_dict(program, ..., model=model)``: ``torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in
    ct.state_dict(step, model).items()})`` (PyTorch converts each to its tensor's dtype as it copies it)."""
    _program(program, "ct.state_dict")
    names = _pytorchs_names(model)
    missing = [name for name in names if name not in program.state]
    if missing:
        raise FeedError(f"ct.state_dict: the program's state has no {missing[:3]}{' ...' if len(missing) > 3 else ''} "
                        f"of the model; was the program compiled with model.initial_values()?")
    return {name: _host(program.state[name]).copy() for name in names}


def _pytorchs_names(model):
    """The names of ``model``'s parameters and of its buffers that PyTorch's layers have too (not ``Buffer.ours``)."""
    return list(model.parameters()) + [name for name, b in model.named_buffers() if not b.ours]



def _numpy(value):
    """A NumPy array of ``value``: a torch tensor (bfloat16 by its bits), a CuPy or NumPy array."""
    if hasattr(value, "detach"):  # torch, without importing it
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":  # NumPy has no bfloat16 of torch's: read its bits
            import torch

            return tensor.view(torch.int16).numpy().view(BFLOAT16)
        return tensor.numpy()
    return _host(value)
