"""An optimizer's state in PyTorch's format: ct.optimizer_state_dict gives torch.optim's state_dict of a step's moments
and count, ct.load_optimizer_state_dict takes one back, refusing, with what and why, a state or settings the step
would not continue; against torch.optim itself, a run moved either way continues as it would have."""

import copy

import numpy as np
import pytest
from peers import needs_torch

import cortado as ct
from cortado import nn, optim

OPTIMIZERS = {
    "sgd": lambda: optim.SGD(0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd nesterov": lambda: optim.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: optim.Adam(1e-2, weight_decay=0.1),
    "adamw matrices": lambda: optim.AdamW(1e-2, betas=(0.8, 0.99), weight_decay=0.1, decay=lambda n, p: p.ndim == 2),
}


def _step(optimizer, seed=0, model=None):
    """A step of an MLP (4 features to 2) fitting batches of 16 by mean squared error with ``optimizer``; the model."""
    model = nn.MLP(4, 8, 2, activation=ct.tanh) if model is None else model
    x, y = ct.var("x", (16, 4)), ct.var("y", (16, 2))
    loss = nn.mse_loss(model(x), y)
    params = model.parameters()
    state, updates = optimizer.updates(params, ct.grad(loss, list(params.values())))
    return ct.compile([loss], inputs=[x, y], state={**model.initial_values(seed), **state},
                      updates={**updates, **model.state_updates(loss)}), model


def _batches(count, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal((16, 2)).astype(np.float32))
            for _ in range(count)]


def _state(program):
    return {name: np.array(program.state[name]) for name in program.state}


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_a_run_moved_through_pytorchs_format_continues_bit_for_bit(kind):
    """Weights by ct.state_dict, moments and count by ct.optimizer_state_dict, into a step of other first values:
    the two steps then agree to the bit; the groups' param_names say the order, so the way back needs no names."""
    optimizer = OPTIMIZERS[kind]()
    batches = _batches(6)
    first, model = _step(optimizer)
    for x, y in batches[:3]:
        first(x=x, y=y)
    moved, _ = _step(optimizer, seed=7, model=model)
    exported = ct.optimizer_state_dict(first, optimizer, list(model.parameters())[::-1])  # any order, said by names
    ct.load_state_dict(moved, ct.state_dict(first, model), model=model)
    step = None if isinstance(optimizer, optim.Adam) else 3  # PyTorch's SGD keeps no count
    assert sorted(ct.load_optimizer_state_dict(moved, optimizer, exported, step=step)) == sorted(
        name for name in first.state if name.startswith(optimizer.name))
    for x, y in batches[3:]:
        assert first(x=x, y=y)[0] == moved(x=x, y=y)[0]
    for name, value in _state(first).items():
        np.testing.assert_array_equal(moved.state[name], value, err_msg=name)


def test_the_state_dict_has_pytorchs_form():
    adamw = OPTIMIZERS["adamw matrices"]()
    program, model = _step(adamw)
    names = ["0.weight", "2.weight", "0.bias", "2.bias"]  # as a PyTorch optimizer of a decayed and an undecayed group
    unstepped = ct.optimizer_state_dict(program, adamw, names)
    assert unstepped["state"] == {}  # PyTorch makes a parameter's state at its first step
    settings = {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-8, "amsgrad": False, "maximize": False,
                "decoupled_weight_decay": True}
    assert unstepped["param_groups"] == [
        {**settings, "weight_decay": 0.1, "params": [0, 1], "param_names": names[:2]},
        {**settings, "weight_decay": 0.0, "params": [2, 3], "param_names": names[2:]}]
    x, y = _batches(1)[0]
    program(x=x, y=y)
    exported = ct.optimizer_state_dict(program, adamw, names)
    assert list(exported["state"]) == [0, 1, 2, 3] and list(exported["state"][2]) == ["step", "exp_avg", "exp_avg_sq"]
    step = exported["state"][2]["step"]
    assert step.dtype == np.float32 and step.shape == () and step == 1  # as PyTorch's Adam keeps it
    np.testing.assert_array_equal(exported["state"][2]["exp_avg_sq"], program.state["adamw.v.0.bias"])
    exported["state"][2]["exp_avg"][:] = 5  # a copy, not a view of the program's state
    assert not np.any(program.state["adamw.m.0.bias"] == 5)


def test_a_schedules_rate_is_the_next_steps_and_sgd_keeps_no_count():
    """PyTorch's group holds the rate its next step takes (its scheduler set it after the last step); SGD's state
    has its momentum buffers and no step, and SGD without momentum has no state at all."""
    rate = optim.lambda_lr(0.1, lambda epoch: 0.5 ** epoch, total=10)
    sgd = optim.SGD(rate, momentum=0.9)
    program, model = _step(sgd)
    for x, y in _batches(2):
        program(x=x, y=y)
    exported = ct.optimizer_state_dict(program, sgd, list(model.parameters()))
    assert exported["param_groups"][0]["lr"] == 0.1 * 0.5 ** 2
    assert list(exported["state"][0]) == ["momentum_buffer"]
    plain = optim.SGD(0.1)
    program, model = _step(plain)
    program(*_batches(1)[0])
    exported = ct.optimizer_state_dict(program, plain, list(model.parameters()))
    assert exported["state"] == {} and exported["param_groups"][0]["momentum"] == 0.0
    with pytest.raises(ct.FeedError, match="PyTorch's SGD keeps no step count: give step="):
        ct.load_optimizer_state_dict(program, plain, exported)
    ct.load_optimizer_state_dict(program, plain, exported, step=4)
    assert program.state["sgd.step"] == 4


def _bad(change):
    """A copy of ``exported`` (below) that ``change`` changes."""
    def changed(exported):
        exported = copy.deepcopy(exported)
        change(exported)
        return exported
    return changed


def _group(**settings):
    return _bad(lambda d: d["param_groups"][0].update(settings))


def _state_of(index, **entries):
    return _bad(lambda d: d["state"][index].update(entries))


def _split(d):
    """Two groups of other rates, as PyTorch gives a group of its own a rate of its own."""
    first = dict(d["param_groups"][0], params=[0, 1], param_names=d["param_groups"][0]["param_names"][:2])
    second = dict(d["param_groups"][0], lr=1e-3, params=[2, 3], param_names=d["param_groups"][0]["param_names"][2:])
    d["param_groups"] = [first, second]


def _unnamed(d):
    for group in d["param_groups"]:
        del group["param_names"]


ADAMW_REFUSALS = {
    "amsgrad": (_group(amsgrad=True), {}, r"param_groups\[0\] has amsgrad=True for '0.weight', where AdamW 'adamw' "
                                          r"has False: a step of other settings would not continue PyTorch's run"),
    "amsgrad's state": (_state_of(1, max_exp_avg_sq=np.zeros(8, np.float32)), {},
                        r"state\[1\] \('0.bias'\) holds \['max_exp_avg_sq'\], which AdamW 'adamw' does not keep"),
    "betas": (_group(betas=(0.8, 0.999)), {}, r"has betas=\(0.8, 0.999\) for '0.weight', where AdamW 'adamw' has "
                                              r"\(0.9, 0.999\)"),
    "eps": (_group(eps=1e-6), {}, "has eps=1e-06"),
    "lr": (_bad(_split), {}, r"param_groups\[1\] has lr=0.001 for '2.weight', where AdamW 'adamw' has 0.01"),
    "weight decay": (_group(weight_decay=0.0), {}, "has weight_decay=0.0 for '0.weight', where AdamW 'adamw' has 0.01"),
    "maximize": (_group(maximize=True), {}, "has maximize=True"),
    "Adam's": (_group(decoupled_weight_decay=False), {}, "has decoupled_weight_decay=False"),
    "SGD's": (_bad(lambda d: d["param_groups"][0].pop("betas")), {},
              r"param_groups\[0\] has no 'betas': it is not a torch.optim.AdamW's"),
    "steps": (_state_of(3, step=np.array(1, np.float32)), {},
              r"parameters have taken different numbers of steps \(0.weight: 2, 0.bias: 2, 2.weight: 2, 2.bias: 1\); "
              r"the program keeps one count"),
    "a step of a fraction": (_bad(lambda d: [s.update(step=np.float32(2.5)) for s in d["state"].values()]), {},
                             r"the step of '0.weight' holds 2.5 at \(\), which int32 cannot hold"),
    "a parameter unstepped": (_bad(lambda d: d["state"].pop(3)), {},
                              r"no state for \['2.bias'\] and has it for the others: PyTorch makes it at a "
                              r"parameter's first step"),
    "a moment half lost": (_bad(lambda d: d["state"][0].pop("exp_avg_sq")), {},
                           r"state\[0\] \('0.weight'\) lacks \['exp_avg_sq'\]"),
    "a moment beyond float32": (_state_of(1, exp_avg=np.full(8, 1e300)), {},
                                r"state\[1\]\['exp_avg'\]: 'adamw.m.0.bias' holds 1e\+300 at \(0,\), which float32 "
                                r"cannot hold"),
    "names in another order": (_bad(_unnamed), {"names": ["0.bias", "0.weight", "2.weight", "2.bias"]},
                               r"state\[0\]\['exp_avg'\]: 'adamw.m.0.bias' has shape \(8, 4\); the program's is "
                               r"\(8,\)"),
    "no names": (_bad(_unnamed), {}, r"give names=, the parameters' names in the order PyTorch's optimizer lists them"),
    "names unlike param_names": (_bad(lambda d: None), {"names": ["0.weight", "2.weight", "0.bias", "2.bias"]},
                                 r"names\[1\] is '2.weight', where the state_dict's param_names have '0.bias'"),
    "too few names": (_bad(_unnamed), {"names": ["0.weight", "0.bias", "2.weight"]},
                      r"names: not \['2.bias'\], which AdamW 'adamw' updates"),
    "names of no parameter": (_bad(_unnamed), {"names": ["0.weight", "0.weight", "2.weight", "x", "2.bias"]},
                              r"names: \['0.weight'\] more than once; \['x'\], which are not state variables of the "
                              r"program; not \['0.bias'\], which AdamW 'adamw' updates"),
    "a name of no moments": (_bad(_unnamed), {"names": ["0.weight", "0.bias", "2.weight", "2.bias", "adamw.step"]},
                             r"\['adamw.step'\], which AdamW 'adamw' does not update \(the program has no "
                             r"adamw.m.<name>\)"),
    "more indices than names": (_bad(lambda d: (_unnamed(d), d["param_groups"][0]["params"].append(4))),
                                {"names": ["0.weight", "0.bias", "2.weight", "2.bias"]},
                                r"4 names for the 5 parameters of the state_dict's param_groups"),
    "a step that disagrees": (_bad(lambda d: None), {"step": 5}, r"step=5, where the state_dict's is 2"),
    "state of other indices": (_bad(lambda d: d.update(state={str(k): v for k, v in d["state"].items()})), {},
                               r"its state has entries \['0', '1', '2'\] \.\.\., which no param_group lists"),
    "param_names in some groups": (_bad(lambda d: (_split(d), d["param_groups"][1].pop("param_names"))), {},
                                   r"give names=, the parameters' names in the order"),
    "an optimizer": (lambda d: object(), {}, r"an optimizer's state_dict is \{'state': .*, not object"),
    "a model's state_dict": (lambda d: {"0.weight": np.zeros((8, 4))}, {},
                             r"\(torch_optimizer.state_dict\(\)\), not a dict of keys \['0.weight'\]"),
}


@pytest.mark.parametrize("case", ADAMW_REFUSALS)
def test_a_state_the_step_would_not_continue_is_refused_saying_what_and_why(case):
    change, arguments, message = ADAMW_REFUSALS[case]
    adamw = optim.AdamW(1e-2)
    program, model = _step(adamw)
    for x, y in _batches(2):
        program(x=x, y=y)
    exported = ct.optimizer_state_dict(program, adamw, list(model.parameters()))
    before = _state(program)
    with pytest.raises(ct.FeedError, match=message):
        ct.load_optimizer_state_dict(program, adamw, change(exported), **arguments)
    for name, value in before.items():  # nothing set
        np.testing.assert_array_equal(program.state[name], value, err_msg=name)


def test_sgds_state_is_refused_where_its_buffers_or_settings_do_not_fit():
    sgd = optim.SGD(0.1, momentum=0.9, dampening=0.1)
    program, model = _step(sgd)
    names = list(model.parameters())
    program(*_batches(1)[0])
    exported = ct.optimizer_state_dict(program, sgd, names)
    for change, arguments, message in (
            (_bad(lambda d: None), {}, "PyTorch's SGD keeps no step count: give step=, the number of steps taken"),
            (_bad(lambda d: None), {"step": 0}, r"step=0, where the state_dict's is at least 1 \(momentum buffers\)"),
            (_bad(lambda d: None), {"step": -1}, "step is a whole number of at least 0, not -1"),
            (_group(momentum=0.8), {"step": 1}, "has momentum=0.8"),
            (_group(dampening=0.0), {"step": 1}, "has dampening=0.0"),
            (_group(nesterov=True), {"step": 1}, "has nesterov=True"),
            (_state_of(2, momentum_buffer=None), {"step": 1}, r"no state for \['2.weight'\]"),
            (_bad(lambda d: [s.update(momentum_buffer=None) for s in d["state"].values()]), {"step": 1},
             r"step=1, where the state_dict's is 0 \(no momentum buffers yet\)")):
        with pytest.raises(ct.FeedError, match=message):
            ct.load_optimizer_state_dict(program, sgd, change(exported), **arguments)
    unstepped = _bad(lambda d: [s.update(momentum_buffer=None) for s in d["state"].values()])(exported)
    ct.load_optimizer_state_dict(program, sgd, unstepped)  # buffers of None: PyTorch's, before a first step
    assert program.state["sgd.step"] == 0 and not np.any(program.state["sgd.momentum.0.weight"])


def test_the_optimizer_given_must_be_the_programs():
    program, model = _step(optim.AdamW(1e-2))
    names = list(model.parameters())
    with pytest.raises(ct.FeedError, match=r"the program has no state variable other.step: it was not compiled with "
                                           r"the state of AdamW 'other'"):
        ct.optimizer_state_dict(program, optim.AdamW(1e-2, name="other"), names)
    with pytest.raises(ct.FeedError, match="takes the optim.SGD, optim.Adam or optim.AdamW .* not str"):
        ct.load_optimizer_state_dict(program, "adamw", {"state": {}, "param_groups": []}, names)
    with pytest.raises(ct.FeedError, match="takes a compiled program"):
        ct.optimizer_state_dict(None, optim.AdamW(1e-2), names)
    with pytest.raises(ct.FeedError, match=r"names are the parameters' names \(strings\) .* not '0.weight'"):
        ct.optimizer_state_dict(program, optim.AdamW(1e-2), "0.weight")


def test_a_schedules_rate_is_not_compared_and_settings_as_tensors_are_numbers():
    """PyTorch's rate under a scheduler is the scheduler's latest: a cortado schedule takes the count and reads its
    own; lr and betas given as 0-d arrays (PyTorch allows tensors) compare as the numbers they hold."""
    adam = optim.Adam(optim.warmup_cosine(1e-2, 2, 10))
    program, model = _step(adam)
    program(*_batches(1)[0])
    exported = ct.optimizer_state_dict(program, adam, list(model.parameters()))
    exported["param_groups"][0].update(lr=np.array(123.0), betas=(np.array(0.9), np.array(0.999)))
    ct.load_optimizer_state_dict(program, adam, exported)
    assert program.state["adam.step"] == 1


# Against torch.optim: the same MLP, the same batches, in both.

PYTORCH = {  # torch_model -> PyTorch's optimizer, twin of OPTIMIZERS[kind]
    "sgd": lambda m: __import__("torch").optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.1,
                                                   weight_decay=0.01),
    "sgd nesterov": lambda m: __import__("torch").optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda m: __import__("torch").optim.Adam(m.named_parameters(), lr=1e-2, weight_decay=0.1),  # names kept
    "adamw matrices": lambda m: __import__("torch").optim.AdamW(
        [{"params": [p for p in m.parameters() if p.ndim == 2], "weight_decay": 0.1},
         {"params": [p for p in m.parameters() if p.ndim != 2], "weight_decay": 0.0}], lr=1e-2, betas=(0.8, 0.99)),
}


def _pytorchs(seed=0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _train_pytorchs(model, optimizer, batches, scheduler=None):
    import torch

    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def _order(torch_model, torch_optimizer):
    """The parameters' names in the order ``torch_optimizer`` lists them, its groups one after another."""
    names = {id(p): n for n, p in torch_model.named_parameters()}
    return [names[id(p)] for group in torch_optimizer.param_groups for p in group["params"]]


def _assert_same_parameters(program, torch_model):
    for name, value in torch_model.state_dict().items():
        np.testing.assert_allclose(program.state[name], value.numpy(), rtol=2e-5, atol=2e-6, err_msg=name)


@needs_torch
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_a_pytorch_run_resumed_here_continues_as_in_pytorch(kind):
    theirs = _pytorchs()
    torch_optimizer = PYTORCH[kind](theirs)
    batches = _batches(6)
    _train_pytorchs(theirs, torch_optimizer, batches[:3])
    optimizer = OPTIMIZERS[kind]()
    program, model = _step(optimizer, seed=3)
    ct.load_state_dict(program, theirs.state_dict(), model=model)
    names = None if kind == "adam" else _order(theirs, torch_optimizer)  # built from named_parameters, Adam's says
    ct.load_optimizer_state_dict(program, optimizer, torch_optimizer.state_dict(), names,
                                 step=None if isinstance(optimizer, optim.Adam) else 3)
    _train_pytorchs(theirs, torch_optimizer, batches[3:])
    for x, y in batches[3:]:
        program(x=x, y=y)
    _assert_same_parameters(program, theirs)


@needs_torch
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_a_run_trained_here_continues_in_pytorch_as_here(kind):
    import torch

    optimizer = OPTIMIZERS[kind]()
    program, model = _step(optimizer)
    batches = _batches(6)
    for x, y in batches[:3]:
        program(x=x, y=y)
    theirs = _pytorchs(seed=5)
    torch_optimizer = PYTORCH[kind](theirs)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ct.state_dict(program, model).items()})
    exported = ct.optimizer_state_dict(program, optimizer, _order(theirs, torch_optimizer))
    exported["state"] = {i: {k: torch.from_numpy(v) for k, v in s.items()} for i, s in exported["state"].items()}
    torch_optimizer.load_state_dict(exported)
    if isinstance(optimizer, optim.Adam):
        assert torch_optimizer.state_dict()["state"][0]["step"] == torch.tensor(3.0)
    _train_pytorchs(theirs, torch_optimizer, batches[3:])
    for x, y in batches[3:]:
        program(x=x, y=y)
    _assert_same_parameters(program, theirs)


@needs_torch
def test_a_pytorch_run_with_a_scheduler_resumes_here_at_its_rate():
    """LambdaLR's rate after three steps is the fourth step's of optim.lambda_lr at the count Adam's state gives."""
    import torch

    theirs = _pytorchs()
    torch_optimizer = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch_optimizer, lambda epoch: 0.5 ** epoch)
    batches = _batches(6)
    _train_pytorchs(theirs, torch_optimizer, batches[:3], scheduler)
    adamw = optim.AdamW(optim.lambda_lr(1e-2, lambda epoch: 0.5 ** epoch, total=10))
    program, model = _step(adamw, seed=3)
    ct.load_state_dict(program, theirs.state_dict(), model=model)
    ct.load_optimizer_state_dict(program, adamw, torch_optimizer.state_dict(), _order(theirs, torch_optimizer))
    assert program.state["adamw.step"] == 3
    _train_pytorchs(theirs, torch_optimizer, batches[3:], scheduler)
    for x, y in batches[3:]:
        program(x=x, y=y)
    _assert_same_parameters(program, theirs)


def test_groups_given_as_lists_of_names_are_pytorchs_groups():
    """A PyTorch optimizer of one group a layer, all of one setting: the groups come back as given, where runs of
    one setting would merge them; a group whose parameters are stepped with two settings is refused."""
    adamw = OPTIMIZERS["adamw matrices"]()
    program, model = _step(adamw)
    by_layer = [["0.weight", "0.bias"], ["2.weight", "2.bias"]]
    with pytest.raises(ct.FeedError, match=r"'0.bias' is stepped with other settings than the parameters before it"):
        ct.optimizer_state_dict(program, adamw, by_layer)
    sgd = optim.SGD(0.1, momentum=0.9)
    program, model = _step(sgd)
    groups = ct.optimizer_state_dict(program, sgd, by_layer)["param_groups"]
    assert [(g["params"], g["param_names"]) for g in groups] == [([0, 1], by_layer[0]), ([2, 3], by_layer[1])]


def test_accumulated_gradients_are_not_exported_and_a_load_starts_without_them():
    adamw = optim.AdamW(1e-2)
    model = nn.MLP(4, 8, 2, activation=ct.tanh)
    x, y = ct.var("x", (16, 4)), ct.var("y", (16, 2))
    params = model.parameters()
    state, updates = adamw.updates(params, ct.grad(nn.mse_loss(model(x), y), list(params.values())), accumulate=2)
    program = ct.compile([], inputs=[x, y], state={**model.initial_values(0), **state}, updates=updates)
    batches = _batches(3)
    for xb, yb in batches[:2]:
        program(x=xb, y=yb)
    exported = ct.optimizer_state_dict(program, adamw, list(params))  # after the applying call
    program(x=batches[2][0], y=batches[2][1])
    with pytest.raises(ct.FeedError, match=r"has accumulated the gradients of 1 call\(s\) it has not applied yet"):
        ct.optimizer_state_dict(program, adamw, list(params))
    ct.load_optimizer_state_dict(program, adamw, exported)
    assert program.state["adamw.phase"] == 0 and not np.any(program.state["adamw.sum.0.weight"])
