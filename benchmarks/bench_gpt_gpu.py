"""A GPT's training step on the GPU: cortado against torch eager, torch.compile and jax.jit.

    python benchmarks/bench_gpt_gpu.py [--sizes small,large] [--steps N]
                                       [--only cortado,in-order,heuristic,torch,compile,reduce-overhead,jax]
                                       [--out benchmarks/results/gpt_gpu.json]
    python benchmarks/bench_gpt_gpu.py --backend numpy --sizes tiny    (a smoke test on the CPU, no GPU needed)

The model is examples/gpt_by_hand.py's (the model examples/gpt.py builds from cortado.nn, written by hand; the
same kernels), imported from it for ours: token and position embeddings, pre-norm blocks of
causal self-attention and a tanh-approximation gelu MLP, a final layer norm, an output head tied to the token
embeddings, the mean softmax cross-entropy of the next character taken in float32. The parameters and AdamW's
moments are float32; the model computes in bfloat16, each parameter cast where it is read (mixed precision).
One step is the forward pass, the backward pass and AdamW (gpt_by_hand.py's ``adamw``: betas (0.9, 0.99), epsilon 1e-8
added to sqrt(v), the bias corrections folded into the step size, decay ``p - lr * 0.01 * p`` on the matrices
only) at learning rate 3e-3 (gpt_by_hand.py's). Sizes, on the 63 characters of examples/data/shakespeare.txt:

- small: 6 layers, width 384, 6 heads, context 256, batch 64 (10 warm-up steps, 100 timed);
- large: 12 layers, width 768, 12 heads, context 1024, batch 8 (10 warm-up steps, 50 timed);
- tiny: 1 layer, width 32, 2 heads, context 16, batch 4, for ``--backend numpy`` (2 warm-up steps, 5 timed).

Every contestant starts from the same initial weights (gpt_by_hand.py's ``initial_values``, seed 0) and is fed the same
batch of windows every step, as the other GPU benchmarks do. The contestants:

- cortado: ``ct.compile(loss, inputs=[tokens, labels], state=..., updates=adamw(...))`` with the cupy backend's
  defaults (CUDA graphs, autotuned GEMMs, deterministic), fed CuPy arrays; CuPy's CUDA events. Its compile time
  is ``ct.compile``'s wall time plus its first call (which builds and captures the CUDA graph).
- cortado nondeterministic: the same with ``deterministic=False``, which lets cuDNN's attention backward pass add
  its gradients in whatever order its threads finish, as the peers' attention does.
- cortado in order: the same with ``overlap_updates=False``, the optimizer's updates run in order on the program's
  stream rather than beside the backward pass.
- cortado (heuristic GEMMs): the same with ``autotune=False``, every library call the heuristics' first choice:
  what timing the candidates buys, and a program whose bits do not depend on which candidate a process timed
  fastest.
- torch: eager; the same model with F.embedding, F.layer_norm, F.linear (the (in, out) weights transposed as
  views), F.scaled_dot_product_attention(is_causal=True), F.gelu(approximate="tanh") and F.cross_entropy on
  float32 logits; each float32 parameter cast to bfloat16 once a step, where the model reads it, as gpt_by_hand.py does
  (not torch.autocast, which would run the layer norms and the attention's softmax in float32 and keep a cached
  cast per use); ``torch.optim.AdamW(fused=True)`` in two groups, weight decay 0.01 on the 2-d parameters and 0
  on the rest; torch's CUDA events.
- torch.compile: the same loss function compiled (mode "default" unless ``--compile-mode`` says otherwise; its
  backward is compiled by AOTAutograd and run by ``loss.backward()``), and ``optimizer.step`` compiled too, on
  ``AdamW(foreach=True)``: the compiled optimizer of PyTorch's own recipe (inductor fuses its foreach update;
  the fused AdamW kernel is not traced by dynamo). Two compiled graphs a step, with ``backward()`` between them.
- torch.compile reduce-overhead: the same in mode "reduce-overhead", whose graphs replay as CUDA graphs, as ours
  does, so its step does not wait on the host's launches (each step marks its start,
  ``torch.compiler.cudagraph_mark_step_begin``, and keeps a copy of its loss, which the next replay overwrites).
- jax: ``jax.jit`` of (state, tokens, labels) -> (loss, state), the state (parameters, moments, step count)
  donated; ``jax.nn.dot_product_attention(is_causal=True, implementation="cudnn")`` (cuDNN's fused attention;
  "xla" where cuDNN refuses, recorded), AdamW written in jax.numpy as gpt_by_hand.py writes it. JAX runs on streams of its
  own, so its steps are timed by the wall clock until ``block_until_ready``, and set against ours' wall time.

Each contestant runs in a subprocess of its own, one after another (never interleaved), so that no allocator
sees another's blocks and each peak is its own; a peer that is not installed is reported so and the rest run.
In each: the first two steps' losses (checked against torch eager's, relative 3e-2 as for bfloat16 elsewhere),
then the warm-up steps, then each timed step alone between events and synchronised, the median kept, then one
more step whose loss (that of the weights after every step before) is reported to show the runs still agree.
Memory: ours' ``device_bytes`` (arena, state, outputs, constants, workspaces; CuPy feeds are read in place);
torch's ``max_memory_allocated`` over the whole run less what was allocated before the parameters (the batch);
jax's ``peak_bytes_in_use`` with ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (its batch and any scratch XLA's
autotuning took count). The targets are printed as met or not: faster than every peer on small, within
5% of the fastest on large, ours' memory at most 0.8 times torch eager's, large compiled in under 10 s.
"""

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import attempt, clock, log, print_table, require_gpu, time_calls  # noqa: E402
from bench_mlp_gpu import WALL, wall_clock  # noqa: E402
from gpt_by_hand import BETAS, EPSILON, TEXT, WEIGHT_DECAY, Config, adamw, gpt, initial_values, parameters, windows  # noqa: E402
from machine import describe  # noqa: E402
from reporting import write_results  # noqa: E402

import cortado as ct  # noqa: E402

DTYPE = "bfloat16"
LEARNING_RATE = 3e-3  # examples/gpt_by_hand.py's default
LAYER_NORM_EPS = 1e-5  # gpt_by_hand.py's layer_norm's
LOSS_TOLERANCE = 3e-2  # relative, on the first two losses: bfloat16's, as in bench_mlp_gpu.py


@dataclass(frozen=True)
class Size:
    """A model's shape, its batch, and how many steps warm it up and are timed."""

    layers: int
    width: int
    heads: int
    context: int
    batch: int
    warmup: int
    steps: int


SIZES = {
    "small": Size(layers=6, width=384, heads=6, context=256, batch=64, warmup=10, steps=100),
    "large": Size(layers=12, width=768, heads=12, context=1024, batch=8, warmup=10, steps=50),
    "tiny": Size(layers=1, width=32, heads=2, context=16, batch=4, warmup=2, steps=5),
}
TARGETS = {"small_faster_than": 1.0, "large_within": 1.05, "memory_over_torch": 0.8, "large_compile_s": 10.0}

# The contestants by name, in the order they run; --only also takes "compile" for torch.compile. Ours runs last,
# as in the other GPU benchmarks (here each runs in a process of its own anyway).
ORDER = ("torch", "torch.compile", "torch.compile reduce-overhead", "jax", "cortado", "cortado nondeterministic",
         "cortado in order", "cortado (heuristic GEMMs)")
ALIASES = {"compile": "torch.compile", "reduce-overhead": "torch.compile reduce-overhead",
           "nondeterministic": "cortado nondeterministic", "in-order": "cortado in order",
           "heuristic": "cortado (heuristic GEMMs)"}
PEERS = ("torch", "torch.compile", "torch.compile reduce-overhead", "jax")
COMPILE_MODES = {"torch.compile reduce-overhead": "reduce-overhead"}  # a torch.compile contestant's own mode
# ours with a cupy backend option: not on the CPU
GPU_OPTIONS = ("cortado nondeterministic", "cortado in order", "cortado (heuristic GEMMs)")


@dataclass
class Work:
    """One size's case as every contestant sees it: the model's configuration, the initial float32 weights by
    gpt_by_hand.py's parameter names, the batch of windows fed every step (int32), and the step counts."""

    size: str
    config: Config
    batch: int
    values: dict
    tokens: np.ndarray
    labels: np.ndarray
    warmup: int
    steps: int


def workload(size, steps=None, warmup=None):
    """The case of ``size``: the vocabulary of gpt_by_hand.py's text, gpt_by_hand.py's initial weights and one batch of windows,
    all drawn from one generator of seed 0, so that every subprocess builds the same case."""
    shape = SIZES[size]
    text = open(TEXT, encoding="utf-8").read()
    alphabet = sorted(set(text))
    index = {c: i for i, c in enumerate(alphabet)}
    data = np.array([index[c] for c in text], np.int32)
    config = Config(len(alphabet), shape.context, shape.width, shape.heads, shape.layers)
    rng = np.random.default_rng(0)
    values = initial_values(config, parameters(config), rng)
    tokens, labels = windows(data, shape.batch, shape.context, rng)
    return Work(size, config, shape.batch, values, tokens.astype(np.int32), labels.astype(np.int32),
                shape.warmup if warmup is None else warmup, shape.steps if steps is None else steps)


def vocabulary():
    """The number of distinct characters of gpt_by_hand.py's text: the model's vocabulary."""
    return len(set(open(TEXT, encoding="utf-8").read()))


def run_steps(call, timer, timer_name, work, losses=()):
    """The losses of the first two steps (those not yet taken), the median of the timed steps after the warm-up
    (``time_calls``: each alone between the timer's events, then synchronised), and the loss of one more step."""
    losses = list(losses) + [float(call()) for _ in range(2 - len(losses))]
    device, wall = time_calls(call, timer, work.steps, work.warmup)
    final = float(call())
    tokens = work.batch * work.config.context
    return {"ms": 1e3 * device, "wall_ms": 1e3 * wall, "steps_per_s": 1 / device, "tokens_per_s": tokens / device,
            "timer": timer_name, "losses": losses, "final_loss": final, "steps_taken": 2 + work.warmup + work.steps + 1}


# -- cortado ---------------------------------------------------------------------------------------


def cortado_graph(work):
    """``(loss, tokens, labels, state, updates)``: gpt_by_hand.py's model, its gradients and AdamW, as terms."""
    params = parameters(work.config)
    loss, _, tokens, labels = gpt(work.config, work.batch, params, DTYPE)
    gradients = ct.grad(loss, list(params.values()))
    optimizer_state, updates = adamw(list(params.values()), gradients, LEARNING_RATE)
    state = {**{p: work.values[name] for name, p in params.items()}, **optimizer_state}
    return loss, tokens, labels, state, updates


def cortado_contestant(work, backend, compile_mode=None, **options):
    """Ours: gpt_by_hand.py's model, gradients and AdamW compiled into one program; a call returns the loss, read from
    the program's own output. Times the graph's construction (``gpt``, ``ct.grad``, ``adamw``), ``ct.compile`` and
    the first call apart; ``compile_s`` is the last two, what the compile target counts."""
    began = time.perf_counter()
    loss, tokens, labels, state, updates = cortado_graph(work)
    built = time.perf_counter()
    step = ct.compile(loss, inputs=[tokens, labels], state=state, updates=updates, backend=backend, **options)
    compiled = time.perf_counter()
    if backend == "cupy":
        import cupy

        x, y = cupy.asarray(work.tokens), cupy.asarray(work.labels)
        timer, timer_name = clock("cupy"), "cuda events (cupy)"
        device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        device = device.decode() if isinstance(device, bytes) else device
    else:
        x, y = work.tokens, work.labels
        timer, timer_name, device = wall_clock(), WALL, "cpu"
    first = float(step(tokens_in=x, labels=y))
    called = time.perf_counter()
    log(f"cortado {work.size}: graph {built - began:.1f} s, ct.compile {compiled - built:.1f} s, first call "
        f"{called - compiled:.1f} s; {len(step.kernels)} kernels, {step.memory.summary()}")
    result = run_steps(lambda: step(tokens_in=x, labels=y), timer, timer_name, work, [first])
    return {**result, "device": device, "graph_s": built - began, "ct_compile_s": compiled - built,
            "first_call_s": called - compiled, "compile_s": called - built, "kernels": len(step.kernels),
            "device_bytes": step.device_bytes, "arena_bytes": step.memory.peak_bytes}


# -- torch -----------------------------------------------------------------------------------------


def torch_loss(params, tokens, labels, config):
    """The same model and loss in torch, from float32 parameters by gpt_by_hand.py's names (matrices (in, out), as ours)."""
    import torch
    import torch.nn.functional as F

    w = {name: p.to(torch.bfloat16) for name, p in params.items()}  # each cast once a step, as gpt_by_hand.py casts them
    batch, time_, width = *tokens.shape, config.width
    size = width // config.heads

    def linear(h, name):
        return F.linear(h, w[name].t(), w[name + "_bias"])

    def norm(h, name):
        return F.layer_norm(h, (width,), w[name + "_gain"], w[name + "_bias"], eps=LAYER_NORM_EPS)

    x = F.embedding(tokens, w["tokens"]) + w["positions"]
    for layer in range(config.layers):
        q, k, v = linear(norm(x, f"{layer}.norm1"), f"{layer}.qkv").split(width, dim=-1)
        q, k, v = (t.view(batch, time_, config.heads, size).transpose(1, 2) for t in (q, k, v))
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, time_, width)
        x = x + linear(mixed, f"{layer}.proj")
        x = x + linear(F.gelu(linear(norm(x, f"{layer}.norm2"), f"{layer}.fc"), approximate="tanh"), f"{layer}.out")
    logits = norm(x, "norm") @ w["tokens"].t()  # the tied head
    return F.cross_entropy(logits.float().view(-1, config.vocabulary), labels.view(-1))


def torch_optimizer(torch, params, **options):
    """``torch.optim.AdamW`` with gpt_by_hand.py's constants: decay on the 2-d parameters (embeddings and weight
    matrices) and none on the gains and biases. torch applies decay as ``p * (1 - lr * decay)`` before the Adam
    step, the same as gpt_by_hand.py's ``p - lr * decay * p``."""
    matrices = [p for p in params.values() if p.ndim == 2]
    others = [p for p in params.values() if p.ndim != 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": WEIGHT_DECAY}, {"params": others, "weight_decay": 0.0}],
                             lr=LEARNING_RATE, betas=BETAS, eps=EPSILON, **options)


def torch_step(work, device, compile_mode=None):
    """``(step, tokens, labels)``: one training step of the torch model on ``device``, eager (``compile_mode`` None)
    or torch.compile'd in that mode, returning its loss; the batch as torch tensors."""
    import torch

    tokens = torch.tensor(work.tokens, dtype=torch.int64, device=device)
    labels = torch.tensor(work.labels, dtype=torch.int64, device=device)  # cross_entropy takes int64 targets
    params = {name: torch.tensor(v, device=device, requires_grad=True) for name, v in work.values.items()}
    loss_fn = functools.partial(torch_loss, config=work.config)
    if compile_mode is None:
        optimizer = torch_optimizer(torch, params, fused=True)
        update = optimizer.step
    else:
        optimizer = torch_optimizer(torch, params, foreach=True)
        loss_fn = torch.compile(loss_fn, mode=compile_mode)
        update = torch.compile(optimizer.step, mode=compile_mode)

    def step():
        if compile_mode is not None:  # a step's CUDA graphs ("reduce-overhead") may overwrite the last step's outputs
            torch.compiler.cudagraph_mark_step_begin()
        loss = loss_fn(params, tokens, labels)
        loss.backward()
        update()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach() if compile_mode is None else loss.detach().clone()

    return step, tokens, labels


def torch_contestant(work, backend, compile_mode=None):
    """torch eager (``compile_mode`` None), or torch.compile in that mode, on the GPU (on the CPU where ours runs on
    NumPy: the smoke test). Its peak memory is over the whole run, less its batch."""
    import torch

    device = "cuda" if backend == "cupy" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    step, tokens, labels = torch_step(work, device, compile_mode)
    began = time.perf_counter()
    first = float(step())  # the compiled contestant compiles here
    first_call = time.perf_counter() - began
    timer, timer_name = (clock("torch"), "cuda events (torch)") if cuda else (wall_clock(), WALL)
    result = {**run_steps(step, timer, timer_name, work, [first]), "first_call_s": first_call,
              "device": torch.cuda.get_device_name() if cuda else "cpu"}
    if cuda:
        batch = tokens.nbytes + labels.nbytes
        result.update(peak_bytes=torch.cuda.max_memory_allocated() - before - batch,
                      reserved_bytes=torch.cuda.max_memory_reserved(), batch_bytes=batch)
    if compile_mode is not None:
        from torch._dynamo.utils import counters

        result.update(compile_mode=compile_mode, graph_breaks=sum(counters["graph_break"].values()))
    return result


# -- jax -------------------------------------------------------------------------------------------


def jax_loss(params, tokens, labels, config, implementation):
    """The same model and loss in jax (layer norm written as gpt_by_hand.py writes it); ``implementation`` is
    ``jax.nn.dot_product_attention``'s."""
    import jax
    import jax.numpy as jnp

    w = {name: p.astype(jnp.bfloat16) for name, p in params.items()}
    batch, time_, width = *tokens.shape, config.width
    size = width // config.heads

    def linear(h, name):
        return h @ w[name] + w[name + "_bias"]

    def norm(h, name):
        centered = h - jnp.mean(h, axis=-1, keepdims=True)
        variance = jnp.mean(centered * centered, axis=-1, keepdims=True)
        return centered / jnp.sqrt(variance + LAYER_NORM_EPS) * w[name + "_gain"] + w[name + "_bias"]

    x = jnp.take(w["tokens"], tokens, axis=0) + w["positions"]
    for layer in range(config.layers):
        q, k, v = jnp.split(linear(norm(x, f"{layer}.norm1"), f"{layer}.qkv"), 3, axis=-1)
        q, k, v = (t.reshape(batch, time_, config.heads, size) for t in (q, k, v))  # jax's layout: (B, T, N, H)
        mixed = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
        x = x + linear(mixed.reshape(batch, time_, width), f"{layer}.proj")
        x = x + linear(jax.nn.gelu(linear(norm(x, f"{layer}.norm2"), f"{layer}.fc"), approximate=True), f"{layer}.out")
    logits = (norm(x, "norm") @ w["tokens"].T).astype(jnp.float32)  # the tied head
    picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def jax_step(work, implementation):
    """jax.jit of the whole step, AdamW as gpt_by_hand.py's ``adamw`` writes it; the state is donated."""
    import jax
    import jax.numpy as jnp

    loss_fn = functools.partial(jax_loss, config=work.config, implementation=implementation)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, tokens, labels):
        params, m, v, count = state
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, labels)
        count = count + 1
        corrected = LEARNING_RATE * jnp.sqrt(1 - BETAS[1] ** count) / (1 - BETAS[0] ** count)
        m = jax.tree_util.tree_map(lambda m, g: BETAS[0] * m + (1 - BETAS[0]) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: BETAS[1] * v + (1 - BETAS[1]) * g * g, v, grads)

        def update(p, m, v):
            decay = WEIGHT_DECAY * LEARNING_RATE * p if p.ndim == 2 else 0
            return p - corrected * m / (jnp.sqrt(v) + EPSILON) - decay

        return loss, (jax.tree_util.tree_map(update, params, m, v), m, v, count)

    return step


def jax_contestant(work, backend, compile_mode=None):
    """jax.jit of the step, with cuDNN's fused attention on the GPU (XLA's where cuDNN refuses the case, recorded
    as ``attention``); timed by the wall clock until ``block_until_ready``."""
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # not 75% of the GPU up front: its peak is measured
    import jax
    import jax.numpy as jnp

    on_gpu = backend == "cupy"
    if on_gpu and jax.default_backend() != "gpu":
        raise RuntimeError(f"jax runs on {jax.default_backend()}, not on a GPU")
    device = jax.devices()[0]
    tokens, labels = jnp.asarray(work.tokens), jnp.asarray(work.labels)

    def fresh_state():
        params = {name: jnp.asarray(v) for name, v in work.values.items()}
        m, v = ({name: jnp.zeros(value.shape, jnp.float32) for name, value in work.values.items()} for _ in "mv")
        return params, m, v, jnp.zeros((), jnp.float32)  # every buffer its own: each is donated

    implementations = ["cudnn", "xla"] if on_gpu else ["xla"]
    began = time.perf_counter()
    for implementation in implementations:
        step, state = jax_step(work, implementation), fresh_state()
        try:
            loss, state = step(state, tokens, labels)
            first = float(jax.block_until_ready(loss))
            break
        except Exception as error:  # cuDNN's attention refused this case: XLA's, and say so
            if implementation == implementations[-1]:
                raise
            log(f"jax {work.size}: dot_product_attention(implementation={implementation!r}) failed "
                f"({type(error).__name__}: {str(error).splitlines()[0][:300]}); trying the next")
    first_call = time.perf_counter() - began

    def call():
        nonlocal state
        loss, state = step(state, tokens, labels)
        return jax.block_until_ready((loss, state))[0]

    result = {**run_steps(call, wall_clock(), WALL, work, [first]), "first_call_s": first_call,
              "attention": implementation, "device": device.device_kind}
    stats = device.memory_stats() if on_gpu else None
    if stats and "peak_bytes_in_use" in stats:
        result["peak_bytes"] = stats["peak_bytes_in_use"]
    return result


CONTESTANTS = {"torch": torch_contestant, "torch.compile": torch_contestant,
               "torch.compile reduce-overhead": torch_contestant, "jax": jax_contestant,
               "cortado": cortado_contestant,
               "cortado nondeterministic": functools.partial(cortado_contestant, deterministic=False),
               "cortado in order": functools.partial(cortado_contestant, overlap_updates=False),
               "cortado (heuristic GEMMs)": functools.partial(cortado_contestant, autotune=False)}
PACKAGE = {"torch": "torch", "torch.compile": "torch", "torch.compile reduce-overhead": "torch", "jax": "jax",
           "cortado": None, "cortado nondeterministic": None, "cortado in order": None, "cortado (heuristic GEMMs)": None}


# -- one contestant in its own process -------------------------------------------------------------


def child(args):
    """Run one contestant on one size (this process was started by ``contest``) and write its result as JSON."""
    work = workload(args.size, args.steps, args.warmup)
    mode = COMPILE_MODES.get(args.child, args.compile_mode if args.child == "torch.compile" else None)
    result = attempt(f"{args.size}: {args.child}", CONTESTANTS[args.child], work, args.backend, mode)
    package = PACKAGE[args.child] or ("cupy" if args.backend == "cupy" else None)
    if package in sys.modules:
        result["version"] = getattr(sys.modules[package], "__version__", None)
    with open(args.result, "w") as out:  # numbers of NumPy's types as Python's; anything else as its str
        json.dump(result, out, default=lambda value: value.item() if hasattr(value, "item") else str(value))


def missing_package(name, backend):
    """The package contestant ``name`` needs that is not installed here, or None."""
    package = PACKAGE[name] or ("cupy" if backend == "cupy" else None)
    return package if package and importlib.util.find_spec(package) is None else None


def run_child(name, size, args):
    """Contestant ``name`` on ``size`` in a subprocess of this script: its result, or what went wrong."""
    missing = missing_package(name, args.backend)
    if missing:
        log(f"{size}: {name}: not installed ({missing}); skipped")
        return {"error": f"not installed: {missing}", "not_installed": True}
    handle, path = tempfile.mkstemp(suffix=".json", prefix=f"gpt_{size}_")
    os.close(handle)
    command = [sys.executable, os.path.abspath(__file__), "--child", name, "--size", size, "--result", path,
               "--backend", args.backend, "--compile-mode", args.compile_mode]
    command += [f"--{flag}={value}" for flag, value in (("steps", args.steps), ("warmup", args.warmup)) if value is not None]
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    try:
        done = subprocess.run(command, env=env, timeout=args.timeout)
        with open(path) as result:
            text = result.read()
        if text:
            return json.loads(text)
        code = done.returncode
        why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return {"error": f"the subprocess {why} before it wrote a result"}
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    finally:
        os.unlink(path)


# -- the comparison --------------------------------------------------------------------------------


def compare(results):
    """Losses against torch eager's, times against ours (``peer_over_ours``: above 1, ours is faster; jax's wall
    time against ours' wall time), memory against torch eager's; in place, and the memory summary returned."""
    reference = results.get("torch", {})
    ours = results.get("cortado", {})
    for name, result in results.items():
        if "losses" in reference and "losses" in result:
            result["loss_rel_error"] = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference["losses"]))
            result["mismatch"] = not result["loss_rel_error"] <= LOSS_TOLERANCE  # NaN too
            result["final_loss_rel_diff"] = abs(result["final_loss"] - reference["final_loss"]) / abs(reference["final_loss"])
            if result["mismatch"]:
                log(f"!!! MISMATCH: {name}'s first losses {result['losses']} against torch eager's "
                    f"{reference['losses']}: relative error {result['loss_rel_error']:.3e} > {LOSS_TOLERANCE:g} !!!")
        if name != "cortado" and "ms" in result and "ms" in ours:
            result["peer_over_ours"] = result["ms"] / (ours["wall_ms"] if result["timer"] == WALL else ours["ms"])
        peak = result.get("device_bytes") or result.get("peak_bytes")
        if peak:
            result["peak_mib"] = peak / 2**20
    if ours.get("device_bytes") and reference.get("peak_bytes"):
        return {"ours_bytes": ours["device_bytes"], "torch_bytes": reference["peak_bytes"],
                "ours_over_torch": ours["device_bytes"] / reference["peak_bytes"]}
    return {}


def verdict(met, value, detail):
    """A target's line: met, not met, or not measured (``met`` None)."""
    return {"met": met, "value": value, "status": "not measured" if met is None else "met" if met else "not met",
            "detail": detail}


def targets(cases):
    """The targets against this run's cases, each met, not met, or not measured (a peer missing, a
    contestant failed, or the size not run); ``value`` is the number the target bounds."""
    by_size = {case["size"]: case for case in cases}
    found = {}

    def ratios(size):
        """peer/ours of each peer measured on ``size``, the peers not measured, and both as words."""
        contestants = by_size[size].get("contestants", {})
        got = {peer: contestants[peer]["peer_over_ours"] for peer in PEERS
               if "peer_over_ours" in contestants.get(peer, {})}
        lacking = [peer for peer in PEERS if peer not in got]
        words = "peer/ours " + (", ".join(f"{peer} {ratio:.2f}" for peer, ratio in got.items()) or "none")
        return got, lacking, words + (f"; not measured: {', '.join(lacking)}" if lacking else "")

    if "small" in by_size:
        got, lacking, words = ratios("small")
        slowest = min(got.values(), default=None)  # the ratio of the peer closest to ours
        met = None if lacking else slowest > TARGETS["small_faster_than"]
        found["small: faster than every peer"] = verdict(met, slowest, words)
    if "large" in by_size:
        got, lacking, words = ratios("large")
        fastest = min(got, key=got.get, default=None)  # the fastest peer has the smallest peer/ours
        value = 1 / got[fastest] if fastest else None
        met = None if lacking else value <= TARGETS["large_within"]
        shown = f"ours/fastest ({fastest}) {value:.3f}; " if fastest else ""
        found["large: within 5% of the fastest peer"] = verdict(met, value, shown + words)
    for case in cases:
        if case["size"] in ("small", "large"):
            memory = case.get("memory", {})
            ratio = memory.get("ours_over_torch")
            words = (f"ours/torch eager {ratio:.2f} ({memory['ours_bytes'] / 2**20:.0f} MiB against "
                     f"{memory['torch_bytes'] / 2**20:.0f} MiB)" if ratio else "needs ours and torch eager on the GPU")
            found[f"{case['size']}: peak memory at most 0.8x torch eager's"] = verdict(
                None if ratio is None else ratio <= TARGETS["memory_over_torch"], ratio, words)
    if "large" in by_size:
        ours = by_size["large"].get("contestants", {}).get("cortado", {})
        seconds = ours.get("compile_s")
        words = (f"{seconds:.1f} s: ct.compile {ours['ct_compile_s']:.1f} s, first call {ours['first_call_s']:.1f} s "
                 f"(building the graph before: {ours['graph_s']:.1f} s)" if seconds is not None else "ours did not run")
        found["large: compiled in under 10 s"] = verdict(
            None if seconds is None else seconds < TARGETS["large_compile_s"], seconds, words)
    return found


COLUMNS = [("case", "case", "6s"), ("contestant", "contestant", "14s"), ("ms/step", "ms", "10.3f"),
           ("wall ms", "wall_ms", "9.3f"), ("peer/ours", "peer_over_ours", "10.2f"), ("peak MiB", "peak_mib", "9.1f"),
           ("first loss", "first_loss", "11.4f"), ("final loss", "final_loss", "11.4f"),
           ("loss rel err", "loss_rel_error", "13.2e"), ("compile s", "compile_s", "10.1f")]


def print_summary(cases, found):
    """The contestants' table, then each target's verdict."""
    rows = []
    for case in cases:
        for name, result in case["contestants"].items():
            note = ("not installed" if result.get("not_installed") else
                    f"ERROR {result['error']}".splitlines()[0][:120] if "error" in result else
                    "MISMATCH" if result.get("mismatch") else "wall clock" if result.get("timer") == WALL else "")
            compile_s = result.get("compile_s", result.get("first_call_s"))
            rows.append({"case": case["size"], "contestant": name, **result, "note": note, "compile_s": compile_s,
                         "first_loss": (result.get("losses") or [None])[0]})
    print_table(rows, COLUMNS)
    print("peer/ours: its time over ours (above 1: ours is faster; jax: wall clock against ours' wall clock); "
          "compile s: ours' ct.compile plus first call, the peers' first step", flush=True)
    for name, result in found.items():
        print(f"target {name}: {result['status'].upper()} ({result['detail']})", flush=True)
    if not found:
        print("targets: set for small and large only", flush=True)


# -- the command line ------------------------------------------------------------------------------


def versions(backend):
    """What ran, read from the installed packages' metadata (none is imported here: each contestant imports its
    own library in its own process)."""
    found = {"cortado": ct.__version__}
    if backend == "cupy":  # imported already, by require_gpu (its distribution's name says the CUDA it was built for)
        import cupy

        found.update(cupy=cupy.__version__, cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                     cuda_driver=cupy.cuda.runtime.driverGetVersion())
    for package in ("torch", "jax", "jaxlib"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


NOTES = {
    "cortado": "ct.compile(loss, inputs=[tokens, labels], state, updates=adamw(...)) of examples/gpt_by_hand.py's model, "
               "backend defaults (cuda_graph=True, autotune=True, deterministic=True), fed CuPy int32 arrays; "
               "compile_s = ct.compile + first call; graph_s: building gpt(), ct.grad and adamw",
    "cortado nondeterministic": "the same with deterministic=False: cuDNN's attention backward adds its gradients in "
                                "the order its threads finish",
    "cortado in order": "the same with overlap_updates=False: the optimizer's updates in order on the program's "
                        "stream rather than beside the backward pass",
    "cortado (heuristic GEMMs)": "the same with autotune=False: every library call the heuristics' first choice",
    "torch": "eager; explicit bfloat16 casts of the float32 parameters once a step; F.layer_norm, F.linear, "
             "F.scaled_dot_product_attention(is_causal=True), F.gelu(approximate='tanh'), F.cross_entropy on "
             "float32 logits; torch.optim.AdamW(fused=True), decay 0.01 on 2-d parameters, 0 on the rest",
    "torch.compile": "torch.compile(loss_fn) (AOTAutograd compiles its backward) and torch.compile(optimizer.step) "
                     "of AdamW(foreach=True), in compile_mode; loss.backward() between them; first_call_s holds "
                     "the compilation",
    "torch.compile reduce-overhead": "the same in mode 'reduce-overhead' (CUDA graphs): cudagraph_mark_step_begin() "
                                     "before each step, the loss copied out of the graph's output",
    "jax": "jax.jit with the state (params, m, v, count) donated; jax.nn.dot_product_attention(is_causal=True, "
           "implementation in 'attention'); AdamW in jax.numpy as gpt_by_hand.py's; timed by the wall clock until "
           "block_until_ready (ratios against ours' wall time); XLA_PYTHON_CLIENT_PREALLOCATE=false",
    "timing": "each contestant in its own subprocess, one after another; the same batch every step; first two "
              "losses checked against torch eager's, then warmup steps, then each timed step between events and "
              "synchronised, median; final_loss: one more step's loss (after steps_taken - 1 updates)",
    "memory": "ours: device_bytes; torch: max_memory_allocated over the run less the batch allocated before; "
              "jax: device memory_stats peak_bytes_in_use (batch and autotuning scratch included)",
}


def command_line(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None, help="of: " + ", ".join(SIZES) + " (default: small,large on the "
                        "GPU, tiny with --backend numpy)")
    parser.add_argument("--steps", type=int, help="timed steps of every size (default: the size's)")
    parser.add_argument("--warmup", type=int, help="warm-up steps of every size (default: the size's)")
    parser.add_argument("--only", default=None, help="contestants, comma-separated, of: cortado, nondeterministic "
                        "(cortado nondeterministic), in-order (cortado in order), heuristic (cortado (heuristic "
                        "GEMMs); these three the GPU's alone), torch, compile (torch.compile), reduce-overhead "
                        "(torch.compile in that mode), jax (default: all)")
    parser.add_argument("--backend", choices=["cupy", "numpy"], default="cupy",
                        help="ours' backend; numpy: a smoke test on the CPU, the peers (where installed) on the CPU too")
    parser.add_argument("--compile-mode", default="default", help="the torch.compile contestant's mode (default: "
                        "'default'; the reduce-overhead contestant keeps its own)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds each contestant's subprocess may take")
    parser.add_argument("--out", help="the JSON results (default: benchmarks/results/gpt_gpu.json on the GPU; "
                        "none written for --backend numpy unless given)")
    parser.add_argument("--child", choices=ORDER, help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return args
    args.sizes = list(filter(None, (args.sizes or ("small,large" if args.backend == "cupy" else "tiny")).split(",")))
    every = [name for name in ORDER if args.backend == "cupy" or name not in GPU_OPTIONS]
    only = [ALIASES.get(name, name) for name in filter(None, (args.only or ",".join(every)).split(","))]
    for given, known in ((args.sizes, SIZES), (only, ORDER)):
        if set(given) - set(known):
            parser.error(f"unknown {', '.join(sorted(set(given) - set(known)))}; choose from {', '.join(known)}")
    args.only = [name for name in ORDER if name in only]
    if args.out is None and args.backend == "cupy":
        args.out = os.path.join(HERE, "results", "gpt_gpu.json")
    return args


def main(argv=None):
    args = command_line(argv)
    if args.child:
        child(args)
        return
    gpu = None
    if args.backend == "cupy":
        _, gpu = require_gpu()
    log(f"{gpu or 'CPU (smoke test)'}: sizes {', '.join(args.sizes)}; contestants {', '.join(args.only)}, "
        f"each in its own process")
    cases = []
    for size in args.sizes:
        shape = SIZES[size]
        results = {name: run_child(name, size, args) for name in args.only}
        memory = compare(results)
        cases.append({"size": size, "layers": shape.layers, "width": shape.width, "heads": shape.heads,
                      "context": shape.context, "batch": shape.batch, "dtype": DTYPE,
                      "warmup": shape.warmup if args.warmup is None else args.warmup,
                      "steps": shape.steps if args.steps is None else args.steps,
                      "contestants": results, **({"memory": memory} if memory else {})})
        if args.out:  # after every size: a run cut short keeps the sizes it finished
            write_results({"benchmark": "gpt_gpu", "machine": {**describe(), "gpu": gpu}, "backend": args.backend,
                           "versions": versions(args.backend), "learning_rate": LEARNING_RATE, "betas": BETAS,
                           "epsilon": EPSILON, "weight_decay": WEIGHT_DECAY, "loss_tolerance": LOSS_TOLERANCE,
                           "compile_mode": args.compile_mode, "vocabulary": vocabulary(), "targets": targets(cases),
                           "targets_bounds": TARGETS, "notes": NOTES, "cases": cases,
                           "complete": len(cases) == len(args.sizes)}, args.out)
    print_summary(cases, targets(cases))


if __name__ == "__main__":
    main()
