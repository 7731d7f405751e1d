"""Fused regions compiled to C: one loop nest a region, all of a program's in one shared library, built by the
system's C compiler when the program is built and cached on disk.

NumPy runs a region as one call an op, each a pass over memory; a loop nest computes every op of an element at
once, in registers (``csource`` says which regions). ``-ffp-contract=off`` keeps every ``a * b + c`` rounded twice,
as NumPy rounds it. ``-fno-trapping-math`` lets GCC compute both sides of a ``where`` and select, in vectors: with
traps possible it kept a branch an element (a gelu's select on the sign of random values took 0.9 ms over 2^18
elements, 0.034 ms vectorised); no trap is ever enabled, so every value is IEEE's either way, and the exception
flags the speculated side may raise are read by no one (NumPy clears them before its own loops). Where no compiler
works, every region stays NumPy's and a one-line notice says so
(``CORTADO_NATIVE=0`` asks for that).

Libraries are kept in ``$CORTADO_CACHE_DIR/cpu`` (by default ``~/.cache/cortado/cpu``), named by the hash of
their source, the flags, the compiler's version and the machine, so a second run loads them at once.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

import numpy as np

from . import csource

# -mno-avx512f: GCC 12.2 at -O3 vectorised a plain strided copy with AVX-512 permutes wrongly (8 x 3 x 2 doubles of
# a pad's rows, one element taken from the wrong row: a convolution's gradient off); AVX2's are well trodden
FLAGS = ("-O3", "-march=native", "-mno-avx512f", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
         "-fopenmp-simd", "-pthread", "-shared", "-fPIC")


def cache_dir():
    root = os.environ.get("CORTADO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "cortado")
    return os.path.join(root, "cpu")


@functools.cache
def toolchain():
    """``(compiler, its version)``, or None where regions stay NumPy's."""
    if os.environ.get("CORTADO_NATIVE", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return _notice("no C compiler found (gcc or cc)")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        if not _compiles(compiler, "void probe(void) {}\n"):
            return _notice(f"{compiler} does not build a shared library here")
    except (OSError, subprocess.SubprocessError) as error:
        return _notice(f"{compiler} failed: {error}")
    return compiler, version.splitlines()[0] if version else ""


def _notice(reason):
    print(f"cortado: fused regions run as NumPy calls on the CPU: {reason}", file=sys.stderr)
    return None


def _compiles(compiler, source):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "probe.c")
        with open(path, "w") as file:
            file.write(source)
        done = subprocess.run([compiler, *FLAGS, path, "-o", os.path.join(folder, "probe.so")], capture_output=True,
                              text=True, timeout=60)
        return done.returncode == 0


# the most C parts one sequence calls (``Batch._one_call``): the C compiler's time and memory grow faster than a
# function's length (a step's 100k calls as one function: 21 s and 1.6 GB of GCC 12 at -O3, as sequences of 1024 2 s
# and 0.3 GB), and the calls of a sequence of sequences cost nothing beside the loop nests they run
MOST_CALLS = 1024


class Batch:
    """The regions of one program: each ``add``s its C function and gets a stand-in call; ``bind`` compiles them all
    into one library and puts the C calls in the stand-ins' places."""

    def __init__(self):
        self.sources, self.names, self.stand_ins, self.bound = [], set(), {}, {}
        self.kept = []  # the pointer arrays of C parts called by a sequence, which holds only their addresses
        self.pooled = False  # whether the bound library's calls run parts on the pool's threads (``ct_in_parts``)
        self.pacing = None  # where they do, on how many of its threads (``Pacing``)
        self.parted = True  # whether the regions ``split`` offers run so (``bind``)

    def add(self, pieces, numpy_calls):
        """A stand-in for a region's calls: ``pieces`` in turn, each a C function ``(name, its text, pointers)`` (each
        pointer an address, or an array at its first element), a call of NumPy's (a maximum between two loop nests)
        or a choice of ``split``; where the library cannot be built, ``numpy_calls`` run in their place."""
        parts = {parted: self._parts(pieces, parted) for parted in (True, False)}

        def stand_in():
            raise RuntimeError("a native region was called before its library was bound")

        self.stand_ins[id(stand_in)] = (stand_in, parts, numpy_calls)
        return stand_in

    def _parts(self, pieces, parted):
        """The parts of ``add``'s ``pieces``, each run of C parts one, the choices of ``split`` taken as ``parted``
        says."""
        chosen = []
        for piece in pieces:
            chosen += ([piece.parted] if parted else list(piece.whole)) if isinstance(piece, Split) else [piece]
        parts = [piece if callable(piece) else self._part(piece) for piece in chosen]
        return [self._one_call(run) if len(run) > 1 else run[0] for run in _runs(parts)]

    def _part(self, piece):
        """The C part ``(name, its pointer array)`` of C piece ``piece``, its function defined."""
        name, source, pointers = piece
        self.define(name, source)
        addresses = [x.ctypes.data if isinstance(x, np.ndarray) else x for x in pointers]
        return name, (ctypes.c_void_p * max(len(addresses), 1))(*addresses)

    def split(self, parts, whole):
        """A choice (``Split``) between ``whole`` (C pieces on one thread) and one C piece running the C pieces of each
        of ``parts`` (lists: the same work cut in parts that share nothing they write) in turn, each list on a thread
        of the pool (``ct_in_parts``)."""
        called = []
        for pieces in parts:
            run = [self._part(piece) for piece in pieces]
            called.append(self._one_call(run) if len(run) > 1 else run[0])
        self.kept.extend(pointers for _, pointers in called)
        calls = [f"{name}((void* const*)p[{k}]);" for k, (name, _) in enumerate(called)]
        name, source = csource.in_parts("parts", f"{{\n{csource.switch('part', calls)}}}\n", len(called))
        return Split((name, source, [ctypes.addressof(pointers) for _, pointers in called]), tuple(whole))

    def define(self, name, source):
        """C function ``name`` of text ``source`` in the library, once (another's C may call it)."""
        if name not in self.names:  # two loop nests of the same text are one function
            self.names.add(name)
            self.sources.append(source)

    def _one_call(self, run):
        """One C part calling the C parts of ``run`` in turn (``csource.sequence``), their pointers kept alive; a run of
        more than ``MOST_CALLS`` parts as sequences of that many, called in turn by one more."""
        if len(run) > MOST_CALLS:
            chunks = [run[i:i + MOST_CALLS] for i in range(0, len(run), MOST_CALLS)]
            return self._one_call([self._one_call(chunk) if len(chunk) > 1 else chunk[0] for chunk in chunks])
        name, source = csource.sequence([name for name, _ in run])
        self.define(name, source)
        self.kept.extend(pointers for _, pointers in run)
        return name, (ctypes.c_void_p * len(run))(*[ctypes.addressof(pointers) for _, pointers in run])

    def later(self, pieces, numpy_calls):
        """``add``'s stand-in for a call made inside another call of the step (a block of an attention): it runs what
        the stand-in is bound to."""
        key = id(self.add(pieces, numpy_calls))
        return lambda: self.bound[key]()

    def bind(self, calls, parted=True):
        """``calls`` with every stand-in replaced by its C functions' calls (a region ``split`` offers on the pool's
        threads where ``parted``, else on one), and each run of consecutive calls that are one C function each (a step's
        backward pass: products, loop nests, updates) made one call of a ``csource.sequence``: ``(calls, firsts)``,
        ``firsts[k]`` the index in ``calls`` of the first of those the ``k``-th call made stands for."""
        self.parted = parted
        if not self.stand_ins:
            return calls, list(range(len(calls)))
        runs = {}  # the index of a run's first call -> its C parts
        for i, call in enumerate(calls):
            part = self._one_c_part(call)
            if part is None:
                continue
            first = next(reversed(runs), None)
            if first is not None and first + len(runs[first]) == i:
                runs[first].append(part)
            else:
                runs[i] = [part]
        runs = {first: (self._one_call(parts), len(parts)) for first, parts in runs.items() if len(parts) > 1}
        try:
            library = load(header() + "\n".join(self.sources))
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            _notice(f"their C did not build ({str(error)[:300]})")
            library = None
        self.pooled = library is not None and any("ct_in_parts(" in source for source in self.sources)
        self.pacing = Pacing(library, threads()) if self.pooled else None
        for key, (_, choices, numpy_calls) in self.stand_ins.items():
            parts = choices[self.parted]
            if library is None:
                self.bound[key] = functools.partial(_in_turn, tuple(numpy_calls))  # one call in its place, as planned
                continue
            made = [part if callable(part) else functools.partial(_function(library, part[0]), part[1])
                    for part in parts]
            self.bound[key] = made[0] if len(made) == 1 else functools.partial(_in_turn, tuple(made))
        if library is None:
            return self.unmerged(calls), list(range(len(calls)))
        bound, firsts, i = [], [], 0
        while i < len(calls):
            firsts.append(i)
            if i in runs:
                (name, pointers), count = runs[i]  # (a sequence of sequences holds fewer pointers than it makes calls)
                bound.append(functools.partial(_function(library, name), pointers))
                i += count
            else:
                bound.append(self.bound.get(id(calls[i]), calls[i]))
                i += 1
        return bound, firsts

    def unmerged(self, calls):
        """``calls`` (as given to ``bind``, after it) with every stand-in replaced by what it is bound to, and no run
        made one call: the same work, each kernel's calls apart from the next kernel's (``Executor.profile``)."""
        return [self.bound.get(id(call), call) for call in calls]

    def _one_c_part(self, call):
        """The one C part ``(name, pointers)`` stand-in ``call`` is bound to, or None (NumPy's, several, or no
        stand-in)."""
        entry = self.stand_ins.get(id(call))
        parts = entry[1][self.parted] if entry is not None else None
        if parts is None or len(parts) != 1 or callable(parts[0]):
            return None
        return parts[0]


class Pacing:
    """How many of the pool's threads a step's parts run on: after the first ``WARM`` steps, ``ROUNDS`` rounds of
    steps try each of the caller alone, the caller and 1, 3, 7, ... workers and the caller and all of them, each step
    timed whole, and the fastest is kept (tried again every ``RETRY`` steps). Which thread computes a part changes none
    of its bits. Cores may share data slowly, and a small step's parts may take more handing over than computing: on
    the 2-core machine of the CPU benchmarks the CNN example's step took 0.95 ms on the caller alone and, from one
    process to the next, 1.47 ms or 0.81 ms on two threads, a part run by the worker taking up to twice the caller's
    time for it."""

    WARM, ROUNDS, RETRY = 2, 2, 1000

    def __init__(self, library, count):
        self.helpers = ctypes.c_int.in_dll(library, "ct_helpers")
        self.ways = sorted({0, count - 1} | {2 ** k - 1 for k in range(1, count.bit_length()) if 2 ** k < count})
        self.steps, self.seconds = 0, [0.0] * len(self.ways)  # each way's trials' time

    def run(self, step):
        """``step()``, on as many threads as chosen so far."""
        trials = self.ROUNDS * len(self.ways)
        phase, self.steps = self.steps % self.RETRY, self.steps + 1
        if not self.WARM <= phase < self.WARM + trials:
            if phase == self.WARM + trials:
                self.helpers.value = self.ways[self.seconds.index(min(self.seconds))]
            return step()
        if phase == self.WARM:
            self.seconds = [0.0] * len(self.ways)
        way = (phase - self.WARM) % len(self.ways)
        self.helpers.value = self.ways[way]
        start = time.perf_counter()
        try:
            return step()
        finally:
            self.seconds[way] += time.perf_counter() - start


class Split(NamedTuple):
    """``Batch.split``'s choice: C piece ``parted`` runs a region on the pool's threads, the C pieces ``whole`` on
    one."""

    parted: tuple
    whole: tuple


def _runs(parts):
    """``parts`` cut into runs: each NumPy call alone, consecutive C parts together."""
    runs = []
    for part in parts:
        if runs and not callable(part) and not callable(runs[-1][-1]):
            runs[-1].append(part)
        else:
            runs.append([part])
    return runs


def _function(library, name):
    function = getattr(library, name)
    function.restype, function.argtypes = None, [ctypes.c_void_p]
    return function


def _in_turn(calls):
    for call in calls:
        call()


# A pool of threads for a function whose work parts cleanly (an attention's heads, a product's rows, a region's
# elements): ``ct_in_parts(part, p, parts)`` runs ``part(p, 0)`` .. ``part(p, parts - 1)``, each part claimed by
# whichever thread takes it first: the caller, or one of the workers the library starts once (again after a fork),
# so a worker that a busy machine has not scheduled (or that sleeps) holds nothing up. A claim is one compare-and-swap
# of a word holding the call's ticket, its number of parts and its next part, so a worker late from an earlier call
# never takes a part of a later one, nor a part past the end of its own (the number read beside the word could be the
# next call's). Each worker spins at most ``CT_SPIN`` seconds for the next call, yielding the core between looks, then
# sleeps: an OpenMP team's default spin ran for milliseconds on AMD cores (their ``pause`` is slow), taking a core
# from OpenBLAS's own thread in the products that followed (the GPT example's step took 36 ms instead of 10). A call
# made while another thread holds the pool, or on a machine of one core, runs every part itself.
POOL = r"""#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#define CT_SPIN 1e-3
#if defined(__x86_64__) || defined(__i386__)
#define CT_PAUSE() __builtin_ia32_pause()
#else
#define CT_PAUSE() ((void)0)
#endif
typedef void (*ct_part)(void* const* p, long part);
static struct {  /* ``next``: the call's ticket (its low 32 bits), then its number of parts and its next part (16 each) */
  pthread_mutex_t lock; pthread_cond_t wake; ct_part part; void* const* p;
  unsigned long posted, next; long done; int sleeping, busy, started; pid_t pid;
} ct_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};
static double ct_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static void ct_take_parts(unsigned long ticket) {  /* run parts of call ``ticket`` until none is left to claim */
  for (;;) {
    unsigned long word = __atomic_load_n(&ct_pool.next, __ATOMIC_ACQUIRE);
    if (word >> 32 != (ticket & 0xffffffffUL) || (word & 0xffff) >= (word >> 16 & 0xffff)) return;
    if (!__atomic_compare_exchange_n(&ct_pool.next, &word, word + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
    ct_pool.part(ct_pool.p, word & 0xffff);  /* the call cannot end, nor another begin, before this part is done */
    __atomic_add_fetch(&ct_pool.done, 1, __ATOMIC_RELEASE);
  }
}
int ct_helpers = 1 << 30;  /* how many workers take parts (``Pacing``); 0: every part on the caller */
static void* ct_worker(void* first) {
  unsigned long seen = (unsigned long)first;
  const int index = __atomic_add_fetch(&ct_pool.started, 1, __ATOMIC_RELAXED);  /* 1 to CT_THREADS - 1 */
  for (;;) {
    const double until = ct_now() + CT_SPIN;
    while (__atomic_load_n(&ct_pool.posted, __ATOMIC_ACQUIRE) == seen && ct_now() < until) { CT_PAUSE(); sched_yield(); }
    pthread_mutex_lock(&ct_pool.lock);
    ++ct_pool.sleeping;
    while (__atomic_load_n(&ct_pool.posted, __ATOMIC_ACQUIRE) == seen) pthread_cond_wait(&ct_pool.wake, &ct_pool.lock);
    --ct_pool.sleeping;
    pthread_mutex_unlock(&ct_pool.lock);
    seen = __atomic_load_n(&ct_pool.posted, __ATOMIC_ACQUIRE);
    if (index <= __atomic_load_n(&ct_helpers, __ATOMIC_RELAXED)) ct_take_parts(seen);
  }
  return 0;
}
static int ct_workers_running(void) {
  if (ct_pool.pid == getpid()) return 1;
  pthread_attr_t attributes;
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || pthread_attr_init(&attributes)) return 0;
  pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  pthread_mutex_init(&ct_pool.lock, 0); pthread_cond_init(&ct_pool.wake, 0);  /* afresh in a forked child */
  ct_pool.sleeping = 0; ct_pool.started = 0;
  int started = 0;
  for (int k = 1; k < CT_THREADS; ++k) {
    pthread_t thread;
    started += !pthread_create(&thread, &attributes, ct_worker, (void*)ct_pool.posted);
  }
  pthread_attr_destroy(&attributes);
  if (!started) return 0;
  ct_pool.pid = getpid();
  return 1;
}
static void ct_in_parts(ct_part part, void* const* p, long parts) {
  const int held = parts >= 2 && parts <= 0xffff && !__atomic_exchange_n(&ct_pool.busy, 1, __ATOMIC_ACQUIRE);
  if (!held || ct_helpers <= 0 || !ct_workers_running()) {
    for (long k = 0; k < parts; ++k) part(p, k);
    if (held) __atomic_store_n(&ct_pool.busy, 0, __ATOMIC_RELEASE);
    return;
  }
  ct_pool.part = part; ct_pool.p = p; ct_pool.done = 0;
  pthread_mutex_lock(&ct_pool.lock);
  const unsigned long ticket = ct_pool.posted + 1;
  __atomic_store_n(&ct_pool.next, (ticket & 0xffffffffUL) << 32 | (unsigned long)parts << 16, __ATOMIC_RELEASE);
  __atomic_store_n(&ct_pool.posted, ticket, __ATOMIC_RELEASE);
  if (ct_pool.sleeping) pthread_cond_broadcast(&ct_pool.wake);
  pthread_mutex_unlock(&ct_pool.lock);
  ct_take_parts(ticket);
  while (__atomic_load_n(&ct_pool.done, __ATOMIC_ACQUIRE) != parts) { CT_PAUSE(); sched_yield(); }
  __atomic_store_n(&ct_pool.busy, 0, __ATOMIC_RELEASE);
}
"""


@functools.cache
def threads():
    """How many threads the step's C parts run on: ``CORTADO_THREADS``, else the cores this process may use."""
    chosen = os.environ.get("CORTADO_THREADS")
    if chosen:
        try:
            return max(1, int(chosen))
        except ValueError:
            raise ValueError(f"CORTADO_THREADS={chosen!r}: give a whole number of threads") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# elementwise work runs in parts of at least this many elements, one a thread: a hand-off took 1 to 3 us on two cores,
# an AdamW update of 16384 elements 4.9 us on one thread and 4.1 on two, one of 8192 2.6 and 3.1
ELEMENTS_A_PART = 1 << 13


def parts(amount, smallest):
    """Into how many parts work of ``amount`` (elements, multiply-adds) is cut: one a thread, none below ``smallest``."""
    return max(1, min(threads(), amount // smallest))


def header():
    """The C every library starts with: the pool (sized for ``threads()``) and the helpers its functions share."""
    return f"#define CT_THREADS {threads()}\n" + POOL + HELPERS


HELPERS = """#include <stdint.h>
#if defined(__GNUC__) && !defined(__clang__)
#define CT_NOT_VECTORIZED __attribute__((optimize("no-tree-loop-vectorize")))
#else
#define CT_NOT_VECTORIZED
#endif
static inline float ct_maxf(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float ct_minf(float a, float b) { return (a < b || a != a) ? a : b; }
static inline double ct_max(double a, double b) { return (a > b || a != a) ? a : b; }
static inline double ct_min(double a, double b) { return (a < b || a != a) ? a : b; }
#define CT_PAIRWISE(name, type) \
static type name(const type* a, long n) { \
  if (n < 8) { type sum = 0; for (long i = 0; i < n; ++i) sum = sum + a[i]; return sum; } \
  if (n <= 128) { \
    type r[8]; long i; \
    for (int j = 0; j < 8; ++j) r[j] = a[j]; \
    for (i = 8; i < n - n % 8; i += 8) for (int j = 0; j < 8; ++j) r[j] = r[j] + a[i + j]; \
    type sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])); \
    for (; i < n; ++i) sum = sum + a[i]; \
    return sum; \
  } \
  long half = n / 2; half -= half % 8; \
  return name(a, half) + name(a + half, n - half); \
}
CT_PAIRWISE(ct_pairwisef, float)
CT_PAIRWISE(ct_pairwise, double)
"""


def load(source):
    """The shared library of ``source``, from the disk cache or compiled now."""
    compiler, version = toolchain()
    key = hashlib.sha256("\0".join([source, " ".join(FLAGS), version, platform.machine(),
                                    platform.processor(), _cpu_model()]).encode()).hexdigest()[:32]
    folder = cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder)
        probe.close()
    except OSError:  # a cache that cannot be written: this process's own folder
        folder = _private_folder()
    path = os.path.join(folder, f"{key}.so")
    if not os.path.exists(path):
        with tempfile.TemporaryDirectory(dir=folder) as work:
            c_path = os.path.join(work, "regions.c")
            with open(c_path, "w") as file:
                file.write(source)
            built = os.path.join(work, "regions.so")
            done = subprocess.run([compiler, *FLAGS, c_path, "-o", built], capture_output=True, text=True,
                                  timeout=600)
            if done.returncode:
                raise RuntimeError(f"{compiler} refused the regions' C: {done.stderr[-2000:]}")
            os.replace(built, path)
    return ctypes.CDLL(path)


@functools.cache
def _private_folder():
    return tempfile.mkdtemp(prefix="cortado-cpu-")


@functools.cache
def _cpu_model():
    """What ``-march=native`` compiles for: a library built on one CPU may not run on another."""
    try:
        with open("/proc/cpuinfo") as file:
            return next((line for line in file if line.startswith(("model name", "flags"))), "")
    except OSError:
        return ""
