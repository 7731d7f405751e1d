"""Modules: trees of layers whose parameters get unique hierarchical names, as a PyTorch ``state_dict`` names them.

A module declares its parameters (``Parameter``: a shape, a dtype and an initialiser) and its submodules as
attributes, as ``torch.nn.Module`` does. Nothing is named while the tree is built: the first time any module of a
tree is called (or its ``parameters()`` asked for), the whole tree, from its topmost module, gets its names
(``blocks.3.attn.qkv.weight``), one ``ct.var`` each. So a helper that builds a layer twice makes two layers with two
names, and one layer used in two places (a tied head) is one parameter with one name.

Inside ``forward``, ``self.weight`` reads the parameter's variable (cast to the tree's compute dtype, if one is set
with ``compute_in``: float32 master weights, a bfloat16 model). The expressions a module builds are the ones a user
would write by hand, so every rewrite (fusion, GEMM epilogues, attention) applies to them.
"""

import zlib

import numpy as np

from ..errors import CortadoError, DTypeError, ShapeError
from ..exprgraph import constructors as ct
from ..exprgraph import gathering, owed
from ..exprgraph.dtypes import as_dtype, is_float
from ..exprgraph.ops import BROADCAST_TO, CONST, RESHAPE
from ..exprgraph.term import Term
from ..settings import whole

COMPUTE_DTYPES = ("bfloat16", "float16", "float32", "float64")  # what ``compute_in`` takes


def size(layer, name, value):
    """``value``, a layer's size (features, channels, heads, a kernel's side): a whole number of at least 1."""
    return whole(layer, name, value, 1, ShapeError)


def term(layer, x):
    """``x`` as a term, as cortado's functions take it (an array or a nested list is a constant); anything else is
    refused naming the layer."""
    if isinstance(x, (Term, np.ndarray, list, tuple, int, float, np.generic)):
        return ct.as_term(x)
    raise DTypeError(f"{layer} is called with a term (a ct.var fed when the step is called, or another layer's "
                     f"output) or an array, not {type(x).__name__}")


def product_input(layer, x, weight):
    """``x`` as a term, the input of a product layer (linear, convolution) whose weight reads as ``weight``: one of
    another dtype is refused, as PyTorch refuses it. NumPy's promotion would compute the layer, and every layer after
    it, in the wider dtype: a float64 array, NumPy's default, or an int64 one, made a float32 model compute in
    float64 without a word."""
    given, x = x, term(layer, x)
    if is_float(weight.dtype) and x.dtype != weight.dtype:
        widened = (" (a NumPy float64 scalar, np.sqrt(d) say, makes a float32 term float64, as in NumPy 2; a Python "
                   "float does not)" if x.dtype == np.float64 and isinstance(given, Term) else "")
        raise DTypeError(f"{layer} has {weight.dtype} weights and is called with {x.dtype} input{widened}: cast it "
                         f"(ct.cast(x, {weight.dtype.name!r}); an array's .astype({weight.dtype.name!r})), or compute "
                         f"the model in one dtype with model.compute_in(...)")
    return x


def gathered_from_zero(call, gather, x, indices, axis):
    """``gather(x, indices, axis=axis)`` (``ct.take`` or ``ct.take_along_axis``) of labels or token ids, which are
    never negative: signed ones read as unsigned of at least 32 bits, so that a negative one (-1, PyTorch's padding
    label -100) is out of range, an error naming it and ``call`` on the CPU (the GPU clamps it into the axis),
    instead of counting from the end and picking a real row."""
    along = axis % x.ndim
    known = indices
    while known.op in (RESHAPE, BROADCAST_TO):
        known = known.args[0]
    if known.op is CONST:  # checked now, where the user built them
        gathering.check_from_zero(call, known.attr("value").array, along, x.shape[along])
    signed = indices.dtype.kind == "i" and known.op is not CONST
    if signed:
        indices = ct.cast(indices, f"uint{max(32, 8 * indices.dtype.itemsize)}")
    picked = gather(x, indices, axis=axis)
    gathering.written_gather(call, picked, along, x.shape[along], signed)
    return picked


def _entering(x, dtype):
    """``x``, an argument of a module computing in ``dtype``: a floating term of another dtype (float8 aside) cast."""
    if isinstance(x, np.ndarray) and is_float(x.dtype):
        x = ct.as_term(x)
    if isinstance(x, Term) and is_float(x.dtype) and x.dtype.itemsize >= 2 and x.dtype != dtype:
        return ct.cast(x, dtype)
    return x


class Parameter:
    """A trained value of a module: its ``shape``, ``dtype`` and ``init`` (``init(rng, shape, dtype) -> array``);
    its variable once the tree is named."""

    trained = True

    def __init__(self, shape, init, dtype="float32"):
        shape = tuple(whole("a parameter", "each size of its shape", n, 0, ShapeError) for n in shape)
        if not callable(init):
            raise CortadoError(f"a parameter's init is a function (rng, shape, dtype) -> array, not {init!r}")
        self.shape, self.init, self.dtype = shape, init, as_dtype(dtype)
        self.var = None

    def __repr__(self):
        name = f" {self.var.name!r}" if self.var is not None else ""
        return f"{type(self).__name__}{name}{self.shape} {self.dtype}"


class Buffer(Parameter):
    """A value of a module's state that is not trained (a batch norm's running statistics): named as parameters
    are, in the step's state and its checkpoints, updated by the step (``Module.state_updates``), never by an
    optimizer. ``ours``: state PyTorch's layer does not have (a dropout's random stream, a float8 layer's amax
    histories), which a strict ``load_state_dict`` of a PyTorch ``state_dict`` therefore does not ask for."""

    trained = False

    def __init__(self, shape, init, dtype="float32", ours=False):
        super().__init__(shape, init, dtype)
        self.ours = ours


class FromGradient:
    """A buffer's update that is the step loss's gradient with respect to the buffer (a float8 layer's gradient amax
    history: ``ct.float8_gradient``); ``Module.state_updates`` takes it. One per call, so that two calls updating one
    buffer are told apart."""


class Module:
    """The base of every layer: subclasses declare ``Parameter`` and ``Module`` attributes in ``__init__`` and compute
    in ``forward``; calling a module names its tree (once) and calls ``forward``."""

    def __init__(self):
        object.__setattr__(self, "_members", {})  # attribute name -> Parameter or Module, in declaration order
        object.__setattr__(self, "_parent", None)
        object.__setattr__(self, "_compute_dtype", None)
        object.__setattr__(self, "_recorded", [])  # (output, {state variable: new value}) of each call, in training
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_members" not in self.__dict__:
            raise CortadoError(f"{type(self).__name__}.__init__ must call super().__init__() before it sets "
                               f"{name!r}")
        if isinstance(value, Module):
            value._adopt(self, name)
        elif isinstance(value, list | tuple | dict):
            self._refuse_unseen(name, value)
        if isinstance(value, Parameter | Module):
            if value is self:
                raise CortadoError(f"a module cannot be its own member ({name!r})")
            self._members[name] = value
            self.__dict__.pop(name, None)
        else:
            self._members.pop(name, None)
            object.__setattr__(self, name, value)

    def _refuse_unseen(self, name, held):
        """An error where the plain list, tuple or dict ``held`` (the attribute ``name``) holds a module or parameter
        that is no member of this module, whose parameters the model would not see (one that is, kept again in a
        tuple for convenience, is seen)."""
        members = {id(m) for m in self._members.values()}
        items = held.values() if isinstance(held, dict) else held
        if any(isinstance(v, Module | Parameter) and id(v) not in members for v in items):
            raise CortadoError(f"{type(self).__name__}.{name} is a {type(held).__name__} holding modules or "
                               f"parameters the model would not see: hold modules in nn.ModuleList(...), as in "
                               f"PyTorch, or each as an attribute of its own")

    def __getattr__(self, name):  # only for names not found the usual way: members
        if "_members" not in self.__dict__:
            raise CortadoError(f"{type(self).__name__}.__init__ must call super().__init__() (it has no {name!r})")
        members = self.__dict__["_members"]
        if name not in members:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        member = members[name]
        if isinstance(member, Module):
            return member
        return self._read(member, name)

    def _adopt(self, parent, name):
        if self._parent is None and any(p.var is not None for _, p in self._own_parameters()):
            named = next(p.var.name for _, p in self._own_parameters() if p.var is not None)
            raise CortadoError(f"{type(self).__name__} is put in {type(parent).__name__} as {name!r} after its "
                               f"parameters were named ({named!r}, when it was called or asked for its parameters(), "
                               f"buffers() or initial_values() on its own): build the whole model before calling any part of it")
        if self._parent is None:
            object.__setattr__(self, "_parent", parent)

    def _root(self):
        module = self
        while module._parent is not None:
            module = module._parent
        return module

    def _compute_dtype_here(self):
        """The dtype set by ``compute_in`` on this module or the nearest module above it (None: none was set)."""
        module = self
        while module is not None:
            if module._compute_dtype is not None:
                return module._compute_dtype
            module = module._parent
        return None

    def _read(self, parameter, name):
        if parameter.var is None:
            self._root()._name_tree()
        dtype = self._compute_dtype_here()
        var = parameter.var
        if dtype is None or var.dtype == dtype or var.dtype.kind != "f" or not parameter.trained:
            return var
        return ct.cast(var, dtype)

    def _own_parameters(self, prefix=""):
        """``(name, Parameter)`` of every parameter of the tree under this module, each once (the first path that
        reaches it), in declaration order."""
        seen, found = set(), []

        def walk(module, path, visiting):
            if id(module) in visiting:
                raise CortadoError(f"{type(module).__name__} contains itself (at {path.rstrip('.') or 'the top'})")
            for attribute, member in module._members.items():
                if isinstance(member, Module):
                    walk(member, f"{path}{attribute}.", visiting | {id(module)})
                elif id(member) not in seen:
                    seen.add(id(member))
                    found.append((f"{path}{attribute}", member))

        walk(self, prefix, frozenset())
        return found

    def _name_tree(self):
        parameters = self._own_parameters()
        if not parameters or any(p.var is None for _, p in parameters):  # naming now (a tree of none: each call)
            # a list filled after it was set (self.layers = []; .append(...)) is refused as one set full is
            for module in self._modules():
                for attribute, value in vars(module).items():
                    if isinstance(value, list | tuple | dict):
                        module._refuse_unseen(attribute, value)
        for name, parameter in parameters:
            if parameter.var is None:
                parameter.var = ct.var(name, parameter.shape, parameter.dtype)
                parameter.var.attr("declaration").maker = "cortado.nn"
            elif parameter.var.name != name:
                raise CortadoError(f"parameter {parameter.var.name!r} would be named {name!r} here: a module of one "
                                   f"model was used in another before it was put there")

    def named_parameters(self):
        """``(name, Parameter)`` of every trained parameter of the tree under this module, named from its topmost
        module: to change an initialiser before the first values are drawn (``parameter.init = nn.init.normal(0.02)``).
        It names no variable, so a module may set its initialisers in its ``__init__`` and still be put in a bigger
        model (where the names grow its path). Buffers are ``named_buffers()``'s, as in PyTorch."""
        return [(name, p) for name, p in self._paths() if p.trained]

    def named_buffers(self):
        """``(name, Buffer)`` of every buffer of the tree under this module, named as ``named_parameters`` names."""
        return [(name, p) for name, p in self._paths() if not p.trained]

    def _paths(self):
        """``(name, Parameter)`` of the tree under this module, in its own order: its variable's name, or else the
        name naming the tree from its topmost module now would give it."""
        named = {id(p): path for path, p in self._root()._own_parameters()}
        return [(p.var.name if p.var is not None else named[id(p)], p) for _, p in self._own_parameters()]

    def parameters(self):
        """``{name: variable}`` of every trained parameter of the tree (named from its topmost module), in declaration
        order: what ``ct.grad`` differentiates and an optimizer updates."""
        self._root()._name_tree()
        return {p.var.name: p.var for _, p in self._own_parameters() if p.trained}

    def buffers(self):
        """``{name: variable}`` of every ``Buffer`` of the tree: state the step updates but no optimizer does."""
        self._root()._name_tree()
        return {p.var.name: p.var for _, p in self._own_parameters() if not p.trained}

    def train(self, mode=True):
        """Set the tree under this module to training (``mode``) or inference: a batch norm then normalises by the
        batch's statistics and updates its running ones, or by its running ones. Returns the module."""
        for module in self._modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self):
        """``train(False)``."""
        return self.train(False)

    def _modules(self):
        found, stack = [], [self]
        while stack:
            module = stack.pop()
            if all(module is not m for m in found):
                found.append(module)
                stack.extend(m for m in module._members.values() if isinstance(m, Module))
        return found

    def _record(self, output, updates, unupdated):
        """Note the state ``updates`` a call that computed ``output`` makes (in training); ``unupdated``: what a step
        computing ``output`` without them would do wrong, for ``ct.compile``'s warning (``exprgraph.owed``)."""
        self._recorded.append((output, updates))
        owed.owe(output, type(self).__name__, [var.name for var in updates], unupdated)

    def state_updates(self, outputs):
        """``{buffer variable: new value}`` of the calls in training whose results ``outputs`` (a term or a list) read:
        what ``ct.compile``'s ``updates`` needs beside the optimizer's (a batch norm's running statistics). A buffer
        updated by two calls that ``outputs`` read is an error: it can take one new value a step. Updates taken
        from gradients (``FromGradient``: a float8 layer's gradient amax) need ``outputs`` to be the scalar loss."""
        from ..exprgraph.graph import Graph
        from ..grad import grad

        reached = set(Graph(outputs).schedule)
        updates = {}
        for module in self._modules():
            for output, recorded in module._recorded:
                if output not in reached:
                    continue
                for var, value in recorded.items():
                    if var in updates and updates[var] is not value:
                        raise CortadoError(f"{var.name!r} is updated by two calls of {type(module).__name__} in one "
                                           f"step; call it once a step in training, or use it in inference (eval())")
                    updates[var] = value
        from_gradients = [var for var, value in updates.items() if isinstance(value, FromGradient)]
        if from_gradients:
            loss = outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs
            if getattr(loss, "shape", None) != ():
                raise CortadoError(f"{from_gradients[0].name!r} is updated from the loss's gradient (a float8 "
                                   f"layer's gradient amax): give state_updates the scalar loss, not {outputs!r}")
            updates.update(zip(from_gradients, grad(loss, from_gradients)))
        return updates

    def initial_values(self, seed=0):
        """``{variable: array}``: each parameter drawn by its initialiser from a generator seeded by ``seed`` and its
        name, so a parameter's first value does not change when layers are added before it."""
        seed = whole("initial_values", "seed", seed, 0)
        self._root()._name_tree()
        values = {}
        for _, parameter in self._own_parameters():
            name = parameter.var.name
            rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))
            value = np.asarray(parameter.init(rng, parameter.shape, parameter.dtype))
            if value.shape != parameter.shape:
                raise CortadoError(f"the initialiser of {name!r} gave an array of shape {value.shape}, not "
                                   f"{parameter.shape}")
            values[parameter.var] = value.astype(parameter.dtype, copy=False)
        return values

    def compute_in(self, dtype):
        """Compute this module's tree in ``dtype`` (bfloat16, float16): each floating parameter under it is cast where
        it is read, and stays float32 (master weights) for its gradient and its optimizer, and a floating term it is
        called with is cast where it enters, as ``torch.autocast`` casts an op's inputs (a float32 batch would
        otherwise promote every product back to float32); a module below that sets its own keeps it. Returns the
        module. Other dtypes are refused: an integer tree computes nothing a gradient reaches, and a float8 product needs
        the scales of ``nn.Linear(float8=True)``."""
        if dtype is not None:
            dtype = as_dtype(dtype)
            if dtype.name not in COMPUTE_DTYPES:
                raise DTypeError(f"{type(self).__name__}.compute_in({dtype.name!r}): a module computes in one of "
                                 f"{', '.join(COMPUTE_DTYPES)}")
        object.__setattr__(self, "_compute_dtype", dtype)
        return self

    def __call__(self, *args, **kwargs):
        self._root()._name_tree()
        dtype = self._compute_dtype_here()
        if dtype is not None:
            args = tuple(_entering(a, dtype) for a in args)
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    def __repr__(self):
        lines = [f"{type(self).__name__}("]
        for name, member in self._members.items():
            text = repr(member).replace("\n", "\n  ")
            lines.append(f"  {name}: {text}")
        return "\n".join(lines) + ")" if len(lines) > 1 else f"{type(self).__name__}()"


class Sequential(Module):
    """Modules applied one after another, named ``0``, ``1``, ... as PyTorch's ``Sequential`` names them."""

    def __init__(self, *modules):
        super().__init__()
        for i, module in enumerate(modules):
            if not isinstance(module, Module):
                hint = " (wrap a function as nn.Function(f))" if callable(module) else ""
                raise CortadoError(f"{type(self).__name__} holds modules; item {i} is {type(module).__name__}{hint}")
            setattr(self, str(i), module)

    def __getitem__(self, i):
        return list(self._members.values())[i]

    def __len__(self):
        return len(self._members)

    def __iter__(self):
        return iter(self._members.values())

    def forward(self, x):
        for module in self._members.values():
            x = module(x)
        return x


class ModuleList(Sequential):
    """Modules kept in order (``blocks.0``, ``blocks.1``, ...), called by the module that holds them; made from an
    iterable of modules, as PyTorch's (``nn.ModuleList([Block() for _ in range(6)])``)."""

    def __init__(self, modules=()):
        if isinstance(modules, Module):
            raise CortadoError("ModuleList takes an iterable of modules (a list), not one module")
        super().__init__(*modules)

    def append(self, module):
        """Add ``module`` at the end (named by its index), before the tree is named."""
        if not isinstance(module, Module):
            raise CortadoError(f"ModuleList holds modules, not {type(module).__name__}")
        setattr(self, str(len(self)), module)
        return self

    def forward(self, *args):
        raise CortadoError("a ModuleList is not called: call its modules")


class Function(Module):
    """A function without parameters as a module (``Function(ct.relu)``), for a ``Sequential``."""

    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)

    def __repr__(self):
        if type(self).__module__ == "cortado.nn.activations":  # PyTorch's modules by their names: ReLU()
            return f"{type(self).__name__}()"
        return f"{type(self).__name__}({getattr(self.function, '__name__', self.function)})"
