"""Fused regions compiled to C: one loop nest a region, all of a program's in one shared library, built by the
system's C compiler when the program is built and cached on disk.

NumPy runs a region as one call an op, each a pass over memory; a loop nest computes every op of an element at
once, in registers (``csource`` says which regions). ``-ffp-contract=off`` keeps every ``a * b + c`` rounded twice,
as NumPy rounds it. Where no compiler works, every region stays NumPy's and a one-line notice says so
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
from typing import NamedTuple

import numpy as np

from . import csource

FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fopenmp-simd", "-pthread", "-shared", "-fPIC")


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


class Batch:
    """The regions of one program: each ``add``s its C function and gets a stand-in call; ``bind`` compiles them all
    into one library and puts the C calls in the stand-ins' places."""

    def __init__(self):
        self.sources, self.names, self.stand_ins, self.bound = [], set(), {}, {}
        self.kept = []  # the pointer arrays of C parts called by a sequence, which holds only their addresses
        self.in_two = False  # whether the bound library's calls run parts on two threads (``ct_in_two``)
        self.halved = True  # whether the regions ``halves`` offers run so (``bind``)

    def add(self, pieces, numpy_calls):
        """A stand-in for a region's calls: ``pieces`` in turn, each a C function ``(name, its text, pointers)`` (each
        pointer an address, or an array at its first element), a call of NumPy's (a maximum between two loop nests)
        or a choice of ``halves``; where the library cannot be built, ``numpy_calls`` run in their place."""
        parts = {halved: self._parts(pieces, halved) for halved in (True, False)}

        def stand_in():
            raise RuntimeError("a native region was called before its library was bound")

        self.stand_ins[id(stand_in)] = (stand_in, parts, numpy_calls)
        return stand_in

    def _parts(self, pieces, halved):
        """The parts of ``add``'s ``pieces``, each run of C parts one, the choices of ``halves`` taken as ``halved``
        says."""
        chosen = []
        for piece in pieces:
            chosen += ([piece.halves] if halved else list(piece.whole)) if isinstance(piece, Halves) else [piece]
        parts = [piece if callable(piece) else self._part(piece) for piece in chosen]
        return [self._one_call(run) if len(run) > 1 else run[0] for run in _runs(parts)]

    def _part(self, piece):
        """The C part ``(name, its pointer array)`` of C piece ``piece``, its function defined."""
        name, source, pointers = piece
        self.define(name, source)
        addresses = [x.ctypes.data if isinstance(x, np.ndarray) else x for x in pointers]
        return name, (ctypes.c_void_p * max(len(addresses), 1))(*addresses)

    def halves(self, halves, whole):
        """A choice (``Halves``) between ``whole`` (C pieces on one thread) and one C piece running the C pieces of each
        of ``halves`` (two lists: the same work cut in two parts that share nothing they write) in turn, each list
        on a thread of its own (``ct_in_two``)."""
        parts = []
        for pieces in halves:
            run = [self._part(piece) for piece in pieces]
            parts.append(self._one_call(run) if len(run) > 1 else run[0])
        self.kept.extend(pointers for _, pointers in parts)
        text = f"{{\n  if (part) {parts[1][0]}((void* const*)p[1]);\n  else {parts[0][0]}((void* const*)p[0]);\n}}\n"
        name, source = csource.in_two("halves", text)
        return Halves((name, source, [ctypes.addressof(pointers) for _, pointers in parts]), tuple(whole))

    def define(self, name, source):
        """C function ``name`` of text ``source`` in the library, once (another's C may call it)."""
        if name not in self.names:  # two loop nests of the same text are one function
            self.names.add(name)
            self.sources.append(source)

    def _one_call(self, run):
        """One C part calling the C parts of ``run`` in turn (``csource.sequence``), their pointers kept alive."""
        name, source = csource.sequence([name for name, _ in run])
        self.define(name, source)
        self.kept.extend(pointers for _, pointers in run)
        return name, (ctypes.c_void_p * len(run))(*[ctypes.addressof(pointers) for _, pointers in run])

    def later(self, pieces, numpy_calls):
        """``add``'s stand-in for a call made inside another call of the step (a block of an attention): it runs what
        the stand-in is bound to."""
        key = id(self.add(pieces, numpy_calls))
        return lambda: self.bound[key]()

    def bind(self, calls, halved=True):
        """``calls`` with every stand-in replaced by its C functions' calls (a region ``halves`` offers on two threads
        where ``halved``, else on one), and each run of consecutive calls that are one C function each (a step's
        backward pass: products, loop nests, updates) made one call of a ``csource.sequence``: ``(calls, firsts)``,
        ``firsts[k]`` the index in ``calls`` of the first of those the ``k``-th call made stands for."""
        self.halved = halved
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
        runs = {first: self._one_call(parts) for first, parts in runs.items() if len(parts) > 1}
        try:
            library = load(HEADER + "\n".join(self.sources))
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            _notice(f"their C did not build ({str(error)[:300]})")
            library = None
        self.in_two = library is not None and any("ct_in_two(" in source for source in self.sources)
        for key, (_, choices, numpy_calls) in self.stand_ins.items():
            parts = choices[self.halved]
            if library is None:
                self.bound[key] = functools.partial(_in_turn, tuple(numpy_calls))  # one call in its place, as planned
                continue
            made = [part if callable(part) else functools.partial(_function(library, part[0]), part[1])
                    for part in parts]
            self.bound[key] = made[0] if len(made) == 1 else functools.partial(_in_turn, tuple(made))
        if library is None:
            return [self.bound.get(id(call), call) for call in calls], list(range(len(calls)))
        bound, firsts, i = [], [], 0
        while i < len(calls):
            firsts.append(i)
            if i in runs:
                name, pointers = runs[i]
                bound.append(functools.partial(_function(library, name), pointers))
                i += len(pointers)
            else:
                bound.append(self.bound.get(id(calls[i]), calls[i]))
                i += 1
        return bound, firsts

    def _one_c_part(self, call):
        """The one C part ``(name, pointers)`` stand-in ``call`` is bound to, or None (NumPy's, several, or no
        stand-in)."""
        entry = self.stand_ins.get(id(call))
        parts = entry[1][self.halved] if entry is not None else None
        if parts is None or len(parts) != 1 or callable(parts[0]):
            return None
        return parts[0]


class Halves(NamedTuple):
    """``Batch.halves``'s choice: C piece ``halves`` runs a region on two threads, the C pieces ``whole`` on one."""

    halves: tuple
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


# Two threads for a function whose work halves cleanly (an attention's heads, a product's rows): ``ct_in_two(part, p)``
# runs ``part(p, 0)`` in the calling thread and ``part(p, 1)`` in whichever thread claims it first: a worker the
# library starts once (again after a fork), or the caller itself once its own half is done, so a worker that a busy
# machine has not scheduled (or that sleeps) holds nothing up. The worker spins at most ``CT_SPIN`` seconds for the
# next call, yielding the core between looks, then sleeps: an OpenMP team's default spin ran for milliseconds on this
# machine's AMD cores (their ``pause`` is slow), taking the second core from OpenBLAS's own thread in the products
# that followed (the GPT example's step took 36 ms instead of 10). A call made while another thread holds the
# worker, or on a machine of one core, runs both halves itself.
TWO_THREADS = r"""#include <pthread.h>
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
static struct {
  pthread_mutex_t lock; pthread_cond_t wake; ct_part part; void* const* p;
  long posted, claimed, done; int sleeping, busy; pid_t pid;
} ct_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};
static double ct_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int ct_claim(long ticket) {  /* whether this thread takes the second half of call ``ticket`` */
  long before = ticket - 1;
  return __atomic_compare_exchange_n(&ct_pool.claimed, &before, ticket, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static void* ct_worker(void* first) {
  long seen = (long)first;
  for (;;) {
    const double until = ct_now() + CT_SPIN;
    while (__atomic_load_n(&ct_pool.posted, __ATOMIC_ACQUIRE) == seen && ct_now() < until) { CT_PAUSE(); sched_yield(); }
    pthread_mutex_lock(&ct_pool.lock);
    ct_pool.sleeping = 1;
    while (__atomic_load_n(&ct_pool.posted, __ATOMIC_ACQUIRE) == seen) pthread_cond_wait(&ct_pool.wake, &ct_pool.lock);
    ct_pool.sleeping = 0;
    pthread_mutex_unlock(&ct_pool.lock);
    seen = __atomic_load_n(&ct_pool.posted, __ATOMIC_ACQUIRE);
    if (ct_claim(seen)) {
      ct_pool.part(ct_pool.p, 1);
      __atomic_store_n(&ct_pool.done, seen, __ATOMIC_RELEASE);
    }
  }
  return 0;
}
static int ct_worker_running(void) {
  if (ct_pool.pid == getpid()) return 1;
  pthread_t thread; pthread_attr_t attributes;
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || pthread_attr_init(&attributes)) return 0;
  pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  pthread_mutex_init(&ct_pool.lock, 0); pthread_cond_init(&ct_pool.wake, 0);  /* afresh in a forked child */
  ct_pool.claimed = ct_pool.done = ct_pool.posted; ct_pool.sleeping = 0;
  const int failed = pthread_create(&thread, &attributes, ct_worker, (void*)ct_pool.posted);
  pthread_attr_destroy(&attributes);
  if (failed) return 0;
  ct_pool.pid = getpid();
  return 1;
}
static void ct_in_two(ct_part part, void* const* p) {
  if (__atomic_exchange_n(&ct_pool.busy, 1, __ATOMIC_ACQUIRE)) { part(p, 0); part(p, 1); return; }
  if (!ct_worker_running()) { part(p, 0); part(p, 1); __atomic_store_n(&ct_pool.busy, 0, __ATOMIC_RELEASE); return; }
  ct_pool.part = part; ct_pool.p = p;
  pthread_mutex_lock(&ct_pool.lock);
  const long ticket = ct_pool.posted + 1;
  __atomic_store_n(&ct_pool.posted, ticket, __ATOMIC_RELEASE);
  if (ct_pool.sleeping) pthread_cond_signal(&ct_pool.wake);
  pthread_mutex_unlock(&ct_pool.lock);
  part(p, 0);
  if (ct_claim(ticket)) part(p, 1);
  else while (__atomic_load_n(&ct_pool.done, __ATOMIC_ACQUIRE) != ticket) { CT_PAUSE(); sched_yield(); }
  __atomic_store_n(&ct_pool.busy, 0, __ATOMIC_RELEASE);
}
"""

HEADER = TWO_THREADS + """#include <stdint.h>
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
