"""PyTorch's state_dicts: a model's parameters and buffers to and from a program's state, by the names PyTorch gives
them, so that weights and an optimizer's state move between a PyTorch run and its cortado twin.

    ct.load_state_dict(step, torch_model.state_dict())   # a PyTorch model's weights, by name
    ct.state_dict(step, model)                           # and back: {name: array}, as PyTorch names them
    ct.load_optimizer_state_dict(step, adamw, torch_optimizer.state_dict(), names)   # moments and step count
    ct.optimizer_state_dict(step, adamw, names)          # and back, in torch.optim's format

A PyTorch optimizer keeps each parameter's state by its position in the optimizer's groups, not by name: ``names``
are the parameters' names in that order, which PyTorch's optimizer alone knows (``[n for n, _ in
torch_model.named_parameters()]`` for ``torch.optim.AdamW(torch_model.parameters())``; an optimizer's groups list
its parameters one group after another).
"""

from collections import Counter
from collections.abc import Mapping

import numpy as np

from . import optim
from .checkpoint import checked_value, converted_losslessly, on_host, compiled_program
from .errors import FeedError
from .exprgraph.dtypes import as_dtype
from .settings import whole


def load_state_dict(program, state_dict, strict=True, model=None):
    """Set ``program``'s state from ``state_dict`` (``{name: array}``: a PyTorch ``state_dict()``, NumPy or CuPy
    arrays), by name: each value must have its variable's shape; it is converted to the variable's dtype. With
    ``strict``, every name in the dict must be a state variable of the program, and, given the ``model``
    (a ``cortado.nn`` module), every parameter and buffer of the model must be in the dict, as PyTorch's
    ``load_state_dict`` checks, but buffers PyTorch's layers do not have (``Buffer.ours``: a dropout's random
    stream, a float8 layer's amax histories), which keep their values; otherwise only the names both have are set.
    A value its variable's dtype cannot hold (an int out of range, a NaN or a fraction for an int, a finite float
    beyond a narrower float's range) is refused, not wrapped or rounded to infinity. Returns the names set."""
    compiled_program(program, "ct.load_state_dict")
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
    checked = {name: checked_value(program, name, _numpy(state_dict[name]), "the state_dict", same_dtype=False)
               for name in names}
    for name, array in checked.items():  # all checked first: a refused state_dict changes nothing
        program.state[name] = array
    return names


def state_dict(program, model):
    """The ``model``'s parameters and buffers as ``program`` holds them, ``{name: NumPy array}`` by the names PyTorch
    gives them (those of its layers that PyTorch's have: not ``Buffer.ours``), the inverse of
    ``load_state_dict(program, ..., model=model)``: ``torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in
    ct.state_dict(step, model).items()})`` (PyTorch converts each to its tensor's dtype as it copies it)."""
    compiled_program(program, "ct.state_dict")
    names = _pytorchs_names(model)
    missing = [name for name in names if name not in program.state]
    if missing:
        raise FeedError(f"ct.state_dict: the program's state has no {missing[:3]}{' ...' if len(missing) > 3 else ''} "
                        f"of the model; was the program compiled with model.initial_values()?")
    return {name: on_host(program.state[name]).copy() for name in names}


def load_optimizer_state_dict(program, optimizer, state_dict, names=None, step=None):
    """Set the state ``optimizer`` keeps in ``program`` (its moments or momentum buffers and its step count) from a
    PyTorch optimizer's ``state_dict()``, which keeps each parameter's state by its position in the optimizer's
    groups: ``names`` are the parameters' names in that order (``[n for n, _ in torch_model.named_parameters()]``
    for an optimizer of ``torch_model.parameters()``); where it was built from ``named_parameters()`` its groups
    keep them (``param_names``) and ``names`` may be left out. ``step`` is the number of steps taken, which PyTorch's
    SGD does not keep (Adam keeps it; a ``step`` given must agree). Values are converted to their variables' dtypes
    as ``load_state_dict`` converts them. Refused, naming what, where the program would not continue PyTorch's run:
    other settings (lr, where ``optimizer``'s is a number, not a schedule; betas, eps, each parameter's weight decay
    as ``decay`` says, momentum, dampening, nesterov, amsgrad, maximize), state ``optimizer`` does not keep, steps
    that differ between parameters (the program keeps one count), state for some parameters and none for others
    (PyTorch makes it at a parameter's first step), names that are not the parameters ``optimizer`` updates. Nothing
    is set where anything is refused. PyTorch's state is between steps, so an ``accumulate=`` optimizer's sums of
    gradients and its count of calls are set to zero. Returns the state variables set."""
    compiled_program(program, "ct.load_optimizer_state_dict")
    _optimizer(program, optimizer, "ct.load_optimizer_state_dict")
    groups, state = _parts(state_dict)
    indices = [index for group in groups for index in group["params"]]
    stray = [key for key in state if key not in indices]
    if stray:
        raise FeedError(f"the optimizer's state_dict: its state has entries {stray[:3]}{' ...' if len(stray) > 3 else ''}"
                        f", which no param_group lists (they list {indices[:3]}{' ...' if len(indices) > 3 else ''}): "
                        f"not the state of these groups")
    names = _names(program, optimizer, groups, names)
    _check_settings(program, optimizer, groups, names)
    entries = _entries(optimizer, state, indices, names)
    count = f"{optimizer.name}.step"
    values = {count: checked_value(program, count, np.array(_count(optimizer, entries, names, step)), "step",
                              same_dtype=False)}
    for index, name, entry in zip(indices, names, entries):
        for key, kind in _moments(optimizer).items():
            var = f"{optimizer.name}.{kind}.{name}"
            value = _numpy(entry[key]) if entry else np.zeros(program.state[var].shape, program.state[var].dtype)
            values[var] = checked_value(program, var, value, f"the optimizer's state_dict, state[{index}][{key!r}]",
                                   same_dtype=False)
    for var in _accumulation(program, optimizer):  # PyTorch's state is between steps: no gradients summed yet
        values[var] = np.zeros(program.state[var].shape, program.state[var].dtype)
    for var, array in values.items():  # all checked first: a refused state_dict changes nothing
        program.state[var] = array
    return list(values)


def _accumulation(program, optimizer):
    """The state variables of ``optimizer``'s gradient accumulation (``accumulate=``) in ``program``: its count of
    calls and its sums, or none."""
    return [name for name in program.state
            if name == f"{optimizer.name}.phase" or name.startswith(f"{optimizer.name}.sum.")]


def optimizer_state_dict(program, optimizer, names):
    """The state ``optimizer`` keeps in ``program`` as a PyTorch optimizer's ``state_dict()`` (NumPy arrays for its
    tensors), the inverse of ``load_optimizer_state_dict``: ``names`` are the parameters' names in the order the
    PyTorch optimizer lists them, a group for each run of consecutive parameters with the same settings (decayed or
    not), or a list of lists of them, one for each of its groups (whose settings must then agree within each); each
    group with its ``param_names``; no state before the first step, as PyTorch has none then; Adam's ``step`` a
    float32 of shape (), as PyTorch keeps it; ``lr`` the rate of the next step where it is a schedule. SGD's step
    count is not in it: PyTorch's SGD keeps none. PyTorch has no sums of gradients being accumulated
    (``accumulate=``), so a step between the calls that apply them is refused. The settings of how PyTorch computes
    (foreach, fused, capturable) are not in it: PyTorch's ``load_state_dict`` sets them to its defaults."""
    compiled_program(program, "ct.optimizer_state_dict")
    _optimizer(program, optimizer, "ct.optimizer_state_dict")
    sizes = [len(group) for group in names] if _nested(names) else None
    names = _parameters(program, optimizer, [name for group in names for name in group] if sizes else names)
    phase = program.state[f"{optimizer.name}.phase"] if f"{optimizer.name}.phase" in program.state else 0
    if int(on_host(phase)):
        raise FeedError(f"ct.optimizer_state_dict: {_described(optimizer)} has accumulated the gradients of "
                        f"{int(on_host(phase))} call(s) it has not applied yet, which PyTorch's state has no place for; "
                        f"export after the call that applies them")
    count = int(on_host(program.state[f"{optimizer.name}.step"]))
    moments = _moments(optimizer)
    state = {}
    if count and moments:  # PyTorch makes a parameter's state at its first step
        for index, name in enumerate(names):
            entry = {"step": np.array(count, np.float32)} if _counts_per_parameter(optimizer) else {}
            state[index] = entry | {key: on_host(program.state[f"{optimizer.name}.{kind}.{name}"]).copy()
                                    for key, kind in moments.items()}
    return {"state": state, "param_groups": _groups(program, optimizer, names, count, sizes)}


def _nested(names):
    """Whether ``names`` are given group by group: a list of lists (not of strings)."""
    return isinstance(names, list | tuple) and bool(names) and all(isinstance(g, list | tuple) for g in names)


def _groups(program, optimizer, names, count, sizes=None):
    """PyTorch's param_groups of the parameters ``names``, in order, after ``count`` steps: the groups of ``sizes``
    where given, each of one setting, else one for each run of consecutive parameters with the same settings, as a
    PyTorch optimizer with a group of decayed parameters and one of the others lists them."""
    lr = optimizer.lr(count + 1) if isinstance(optimizer.lr, optim.Schedule) else optimizer.lr
    starts = set(np.cumsum([0] + sizes[:-1]).tolist()) if sizes else set()
    groups = []
    for index, name in enumerate(names):
        settings = {"lr": lr, **_settings(program, optimizer, name)}
        differ = bool(groups) and any(groups[-1][key] != value for key, value in settings.items())
        if differ and sizes and index not in starts:
            raise FeedError(f"ct.optimizer_state_dict: {name!r} is stepped with other settings than the parameters "
                            f"before it in its group ({groups[-1]['param_names']}); PyTorch steps a group with one")
        if not groups or index in starts or (differ and not sizes):
            groups.append(settings | {"params": [], "param_names": []})
        groups[-1]["params"].append(index)
        groups[-1]["param_names"].append(name)
    return groups


def _optimizer(program, optimizer, what):
    """Refuse an ``optimizer`` that PyTorch has no twin of, or whose state ``program`` does not keep."""
    if not isinstance(optimizer, optim.SGD | optim.Adam):
        raise FeedError(f"{what} takes the optim.SGD, optim.Adam or optim.AdamW that the program's updates came from, "
                        f"not {type(optimizer).__name__}")
    if f"{optimizer.name}.step" not in program.state:
        raise FeedError(f"{what}: the program has no state variable {optimizer.name}.step: it was not compiled with "
                        f"the state of {_described(optimizer)} (optimizer.updates' first result)")


def _described(optimizer):
    """``optimizer`` as a message names it: its class and its name (``AdamW 'adamw'``)."""
    return f"{type(optimizer).__name__} {optimizer.name!r}"


def _moments(optimizer):
    """``{PyTorch's key: the kind of our variable}`` of the state ``optimizer`` keeps for each parameter (PyTorch's
    ``exp_avg`` is ``adamw.m.<name>``)."""
    if isinstance(optimizer, optim.Adam):
        return {"exp_avg": "m", "exp_avg_sq": "v"}
    return {"momentum_buffer": "momentum"} if optimizer.momentum else {}


def _counts_per_parameter(optimizer):
    """Whether PyTorch's twin of ``optimizer`` keeps a step count in each parameter's state (Adam does, SGD not)."""
    return isinstance(optimizer, optim.Adam)


def _settings(program, optimizer, name):
    """The settings of a PyTorch param_group that steps the parameter ``name`` as ``optimizer`` does, but its lr."""
    decay = optimizer.weight_decay if optimizer.decays(program.state.variable(name)) else 0.0
    if isinstance(optimizer, optim.Adam):
        return {"betas": optimizer.betas, "eps": optimizer.eps, "weight_decay": decay, "amsgrad": False,
                "maximize": False, "decoupled_weight_decay": optimizer.decoupled}
    return {"momentum": optimizer.momentum, "dampening": optimizer.dampening, "weight_decay": decay,
            "nesterov": optimizer.nesterov, "maximize": False}


def _parts(state_dict):
    """``(param_groups, state)`` of a PyTorch optimizer's ``state_dict()``; anything else refused."""
    if not (isinstance(state_dict, Mapping) and isinstance(state_dict.get("state"), Mapping)
            and isinstance(state_dict.get("param_groups"), list | tuple)
            and all(isinstance(group, Mapping) and isinstance(group.get("params"), list | tuple)
                    for group in state_dict["param_groups"])):
        got = (f"a {type(state_dict).__name__} of keys {sorted(map(str, state_dict))}" if isinstance(state_dict, Mapping)
               else type(state_dict).__name__)
        raise FeedError(f"an optimizer's state_dict is {{'state': {{index: {{...}}}}, 'param_groups': [{{..., 'params': "
                        f"[index, ...]}}, ...]}} (torch_optimizer.state_dict()), not {got}")
    return state_dict["param_groups"], state_dict["state"]


def _names(program, optimizer, groups, names):
    """The parameters' names in the order of ``groups``: ``names``, or the groups' ``param_names``, which must
    agree: one for each index the groups list."""
    count = sum(len(group["params"]) for group in groups)
    kept = [name for group in groups for name in group.get("param_names", ())]
    kept = kept if len(kept) == count else []  # names kept by some groups only name nothing by position
    if names is None and len(kept) != count:
        raise FeedError("ct.load_optimizer_state_dict: give names=, the parameters' names in the order PyTorch's "
                        "optimizer lists them ([n for n, _ in torch_model.named_parameters()] for an optimizer of "
                        "torch_model.parameters()); its state_dict keeps them only for an optimizer of "
                        "named_parameters()")
    names = _parameters(program, optimizer, kept if names is None else names)
    if len(names) != count:
        raise FeedError(f"ct.load_optimizer_state_dict: {len(names)} names for the {count} parameters of the "
                        f"state_dict's param_groups")
    if kept and kept != names:
        at = next(i for i, (a, b) in enumerate(zip(kept, names)) if a != b)
        raise FeedError(f"ct.load_optimizer_state_dict: names[{at}] is {names[at]!r}, where the state_dict's "
                        f"param_names have {kept[at]!r}")
    return names


def _parameters(program, optimizer, names):
    """``names`` as a list, where they are distinct state variables of ``program`` and, where ``optimizer`` keeps
    moments, all the parameters it keeps them of: a parameter left out would keep stale moments."""
    listed = [] if isinstance(names, str | Mapping) else list(names)
    if not listed or not all(isinstance(name, str) for name in listed):
        raise FeedError(f"names are the parameters' names (strings) in the order PyTorch's optimizer lists them, "
                        f"not {names!r}")
    names = listed
    repeated = sorted(name for name, times in Counter(names).items() if times > 1)
    unknown = [name for name in names if name not in program.state]
    problems = [f"{repeated} more than once" if repeated else "",
                f"{unknown}, which are not state variables of the program" if unknown else ""]
    moments = _moments(optimizer)
    if moments:
        prefix = f"{optimizer.name}.{next(iter(moments.values()))}."
        updated = [name[len(prefix):] for name in program.state if name.startswith(prefix)]
        others = [name for name in names if name in program.state and name not in updated]
        unlisted = [name for name in updated if name not in names]
        problems += [f"{others}, which {_described(optimizer)} does not update (the program has no {prefix}<name>)"
                     if others else "", f"not {unlisted}, which {_described(optimizer)} updates" if unlisted else ""]
    if any(problems):
        raise FeedError("names: " + "; ".join(problem for problem in problems if problem))
    return names


def _check_settings(program, optimizer, groups, names):
    """Refuse a group whose settings are not those ``optimizer`` steps each of its parameters with: the program would
    not continue PyTorch's run. A schedule's rate is not compared (PyTorch's is its scheduler's latest)."""
    position = iter(names)
    for number, group in enumerate(groups):
        for _ in group["params"]:
            name = next(position)
            ours = _settings(program, optimizer, name)
            if not isinstance(optimizer.lr, optim.Schedule):
                ours["lr"] = optimizer.lr
            for key, value in ours.items():
                if key not in group and key != "decoupled_weight_decay":  # which older PyTorch's groups lack
                    raise FeedError(f"the optimizer's state_dict: param_groups[{number}] has no {key!r}: it is not "
                                    f"a torch.optim.{type(optimizer).__name__}'s")
                if key in group and _plain(group[key]) != value:
                    raise FeedError(f"the optimizer's state_dict: param_groups[{number}] has {key}={group[key]!r} for "
                                    f"{name!r}, where {_described(optimizer)} has {value!r}: a step of other "
                                    f"settings would not continue PyTorch's run")


def _plain(setting):
    """A group's setting in Python numbers, as ours are kept (PyTorch allows tensors for lr and betas)."""
    if isinstance(setting, list | tuple):
        return tuple(_plain(value) for value in setting)
    return float(setting) if hasattr(setting, "__float__") and not isinstance(setting, bool) else setting


def _entries(optimizer, state, indices, names):
    """Each parameter's PyTorch state (a None, SGD's buffer before its first step, taken as none): all of what
    ``optimizer`` keeps, or nothing. PyTorch makes a parameter's state at its first step, so where some parameters
    have none and others have it, they have taken different numbers of steps, which one count cannot say."""
    keys = set(_moments(optimizer)) | ({"step"} if _counts_per_parameter(optimizer) else set())
    entries = []
    for index, name in zip(indices, names):
        entry = {key: value for key, value in state.get(index, {}).items() if value is not None}
        unknown, lacking = sorted(set(entry) - keys), sorted(keys - set(entry))
        if unknown or (entry and lacking):
            raise FeedError(f"the optimizer's state_dict: state[{index}] ({name!r}) " + (
                f"holds {unknown}, which {_described(optimizer)} does not keep" if unknown else f"lacks {lacking}"))
        entries.append(entry)
    bare = [name for name, entry in zip(names, entries) if not entry]
    if bare and len(bare) < len(names):
        raise FeedError(f"the optimizer's state_dict has no state for {bare} and has it for the others: PyTorch makes "
                        f"it at a parameter's first step, so they have taken fewer steps (no gradient reached them), "
                        f"and the program steps every parameter with one count")
    return entries


def _count(optimizer, entries, names, step):
    """The step count the program continues from: PyTorch's Adam's (one for every parameter; 0 before the first
    step), or ``step``, which PyTorch's SGD does not keep; a ``step`` given must agree with the state."""
    stepped = any(entries)
    if _counts_per_parameter(optimizer):
        counts = {name: _step(entry["step"], name) for name, entry in zip(names, entries) if entry}
        if len(set(counts.values())) > 1:
            raise FeedError(f"the optimizer's state_dict: its parameters have taken different numbers of steps "
                            f"({', '.join(f'{n}: {c}' for n, c in counts.items())}); the program keeps one count")
        known = said = next(iter(counts.values()), 0)
    else:  # SGD makes its momentum buffers at the first step; without momentum its state says nothing
        known = None if stepped or not optimizer.momentum else 0
        said = "at least 1 (momentum buffers)" if stepped else "0 (no momentum buffers yet)"
    if step is None:
        if known is None:
            raise FeedError("ct.load_optimizer_state_dict: PyTorch's SGD keeps no step count: give step=, the number "
                            "of steps taken (a schedule's rate and dampening's first step read it)")
        return known
    step = whole("ct.load_optimizer_state_dict", "step", step, 0, FeedError)
    if (known is not None and step != known) or (stepped and step == 0):
        raise FeedError(f"ct.load_optimizer_state_dict: step={step}, where the state_dict's is {said}")
    return step


def _step(value, name):
    """PyTorch's ``step`` of the parameter ``name`` (a float32 tensor of shape (), or a number) as an int."""
    array = _numpy(value)
    if array.shape != ():
        raise FeedError(f"the optimizer's state_dict: the step of {name!r} has shape {array.shape}, not ()")
    return int(converted_losslessly(array, np.dtype(np.int32), f"the optimizer's state_dict: the step of {name!r}"))


def _pytorchs_names(model):
    """The names of ``model``'s parameters and of its buffers that PyTorch's layers have too (not ``Buffer.ours``)."""
    return list(model.parameters()) + [name for name, b in model.named_buffers() if not b.ours]


def _numpy(value):
    """A NumPy array of ``value``: a torch tensor (bfloat16 by its bits), a CuPy or NumPy array."""
    if hasattr(value, "detach"):  # torch, without importing it
        tensor = value.detach().cpu()
        bits = BY_BITS.get(str(tensor.dtype).removeprefix("torch."))
        if bits is not None:  # a dtype NumPy has only as ml_dtypes': read its bits
            import torch

            return tensor.view(getattr(torch, bits[0])).numpy().view(as_dtype(bits[1]))
        return tensor.numpy()
    return on_host(value)


# torch's dtypes that NumPy holds only as ml_dtypes': (torch's integer of their width, ml_dtypes' name)
BY_BITS = {"bfloat16": ("int16", "bfloat16"), "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
           "float8_e5m2": ("uint8", "float8_e5m2")}
