"""Data parallelism on the CPU, in a world of one rank: the rewrite (which terms are averaged, in which buckets),
the schedule and plan it asks for (buckets side by side, issued early, waited for late), the errors, the
rendezvous and the launcher. The same program on several GPUs is tests/test_gpu_distributed.py's."""

import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado import distributed
from cortado.distributed import rendezvous
from cortado.errors import BackendError, FeedError
from cortado.exprgraph.graph import schedule


def mlp(sizes=(20, 64, 48, 5), batch=32, dtype="float32"):
    """``(loss, inputs, params)`` of a relu MLP with a softmax cross-entropy loss, the mean over the batch."""
    x, y = ct.var("x", (batch, sizes[0]), dtype), ct.var("y", (batch, sizes[-1]), dtype)
    params, h = [], x
    for i, (n, m) in enumerate(zip(sizes, sizes[1:])):
        W, b = ct.var(f"W{i}", (n, m), dtype), ct.var(f"b{i}", (m,), dtype)
        params += [W, b]
        h = h @ W + b
        if i < len(sizes) - 2:
            h = ct.relu(h)
    loss = ct.mean(ct.logsumexp(h, axis=1) - ct.sum(h * y, axis=1))
    return loss, [x, y], params


def values(params, seed=0):
    rng = np.random.default_rng(seed)
    return {p: (rng.standard_normal(p.shape) * 0.1).astype(p.dtype) for p in params}


def batch_of(inputs, seed=1):
    rng = np.random.default_rng(seed)
    x, y = inputs
    return {"x": rng.standard_normal(x.shape).astype(x.dtype),
            "y": np.eye(y.shape[1], dtype=y.dtype)[rng.integers(0, y.shape[1], y.shape[0])]}


def averaged(update):
    """The all-reduce terms an update value reads."""
    return [t for t in schedule(update) if t.op.name == "all_reduce"]


def test_a_data_parallel_step_of_one_rank_is_the_plain_step_bit_for_bit():
    loss, inputs, params = mlp()
    grads = ct.grad(loss, params)
    updates = {p: p - 0.1 * g for p, g in zip(params, grads)}
    plain = ct.compile([loss], inputs=inputs, state=values(params), updates=updates)
    parallel = ct.compile([loss], inputs=inputs, state=values(params), updates=updates, data_parallel=True,
                          debug=True)
    for step in range(3):
        feeds = batch_of(inputs, step)
        np.testing.assert_array_equal(parallel(**feeds)[0], plain(**feeds)[0])
    for p in params:
        np.testing.assert_array_equal(parallel.state[p.name], plain.state[p.name])
    assert len(parallel.buckets) == 1 and set(parallel.buckets[0].gradients) == set(grads)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=2, max_size=4), st.integers(1, 6), st.integers(4, 4096),
       st.integers(4, 4096), st.booleans())
def test_any_bucketing_of_any_mlp_is_the_plain_step_in_a_world_of_one(sizes, batch, first, rest, momentum):
    """Whatever the caps, every gradient is averaged once, in buckets of one dtype within the caps (or alone),
    the plan verifies, and a world of one steps exactly as the plain program (SGD, or momentum, which reads each
    gradient through a state of its own)."""
    loss, inputs, params = mlp(sizes=tuple(sizes), batch=batch)
    grads = ct.grad(loss, params)
    if momentum:
        velocity = [ct.var(f"v_{p.name}", p.shape) for p in params]
        updates = {v: 0.9 * v + g for v, g in zip(velocity, grads)}
        updates.update({p: p - 0.1 * (0.9 * v + g) for p, v, g in zip(params, velocity, grads)})
        state = {**values(params), **{v: np.zeros(v.shape, np.float32) for v in velocity}}
    else:
        updates, state = {p: p - 0.1 * g for p, g in zip(params, grads)}, values(params)
    caps = {"bucket_bytes": rest, "first_bucket_bytes": first}
    parallel = ct.compile([loss], inputs=inputs, state=state, updates=updates, data_parallel=caps, debug=True)
    plain = ct.compile([loss], inputs=inputs, state=state, updates=updates)
    averaged_gradients = [g for b in parallel.buckets for g in b.gradients]
    assert sorted(map(id, averaged_gradients)) == sorted(map(id, set(grads)))
    for k, b in enumerate(parallel.buckets):
        assert len(b.gradients) == 1 or b.nbytes <= (first if k == 0 else rest)
    for step in range(2):
        feeds = batch_of(inputs, step)
        np.testing.assert_array_equal(parallel(**feeds)[0], plain(**feeds)[0])
    for name in plain.state:
        np.testing.assert_array_equal(parallel.state[name], plain.state[name])


def test_over_several_ranks_the_last_gradient_larger_than_a_bucket_is_averaged_in_blocks_of_rows():
    """Over several ranks (``blocks``) the first layer's weight gradient, the last one made, nothing else running
    beside its all-reduce, is made in blocks of 128 rows (``block_bytes`` at most), each its own bucket, ahead of
    the gradients ready with it; the updates mean what they meant. Where the blocks would share one bucket, where it
    fits one block (by default 64 MiB, whatever the buckets' caps), or in a world of one (``compile``'s own choice),
    it stays one piece."""
    loss, inputs, params = mlp(sizes=(300, 200, 5))
    grads = ct.grad(loss, params)
    updates = {p: p - 0.1 * g for p, g in zip(params, grads)}
    caps = {"bucket_bytes": 128 * 200 * 4, "first_bucket_bytes": 1024, "block_bytes": 128 * 200 * 4}
    rewritten, buckets = distributed.data_parallel(updates, inputs, blocks=True, **caps)
    blocks = [g for b in buckets for g in b.gradients if g.op.name == "matmul" and g.shape[1] == 200]
    assert [g.shape for g in blocks] == [(128, 200), (128, 200), (44, 200)]
    order = [g for b in buckets for g in b.gradients]
    assert [g for g in order[order.index(blocks[0]):] if g.op.name == "matmul"] == blocks  # made last, in order
    assert order.index(grads[1]) > order.index(blocks[-1])  # its bias's gradient, which may be made after them all
    assert len({k for k, b in enumerate(buckets) if set(b.gradients) & set(blocks)}) == 3  # averaged one by one
    assert len(averaged(rewritten[params[0]])) == 3 and grads[0] not in schedule(rewritten[params[0]])
    feeds = {**batch_of(inputs), **{p.name: v for p, v in values(params).items()}}
    for ours, plain in zip(ct.evaluate([rewritten[p] for p in params], feeds), ct.evaluate(list(updates.values()), feeds)):
        np.testing.assert_allclose(ours, plain, rtol=1e-6, atol=1e-7)
    for other in ({**caps, "first_bucket_bytes": 1 << 30}, {**caps, "block_bytes": 300 * 200 * 4},
                  {"bucket_bytes": 128 * 200 * 4, "first_bucket_bytes": 1024}):
        one_piece = [g for b in distributed.data_parallel(updates, inputs, blocks=True, **other)[1] for g in b.gradients]
        assert grads[0] in one_piece  # the blocks would share one bucket / the gradient fits a block (64 MiB here)
    program = ct.compile([loss], inputs=inputs, state=values(params), updates=updates, data_parallel=caps)
    assert grads[0] in [g for b in program.buckets for g in b.gradients]  # a world of one: nothing to overlap


def test_over_several_ranks_each_buckets_gradients_are_made_before_the_next_ones():
    """NCCL takes the buckets in order, so a gradient made late holds back every bucket after its own: over several
    ranks the schedule makes each bucket's gradients before the next one's, each all-reduce issued right after
    the product that completes it (the plan of a two-rank step, built on the CPU)."""
    from dataclasses import replace

    from cortado import compiler
    from cortado.backends import backend_named

    loss, inputs, params = mlp(sizes=(512, 512, 512, 512), batch=64)
    grads = ct.grad(loss, params)
    updates = {p: p - 0.1 * g for p, g in zip(params, grads)}
    rewritten, buckets = distributed.data_parallel(updates, inputs, bucket_bytes=256 << 10, first_bucket_bytes=1 << 20,
                                                   blocks=True, block_bytes=256 << 10)
    signature = replace(compiler._signature([loss], inputs, values(params), rewritten), ranks=2)
    engine = backend_named("numpy")
    kernels = compiler._built(signature, engine, compiler._options(engine, {})).kernels
    names = [k.term.op.name for k in kernels]
    reduces = [i for i, name in enumerate(names) if name == "all_reduce"]
    assert len(reduces) == len(buckets) > 4
    blocks = [i for i, k in enumerate(kernels) if k.term.op.name == "matmul" and k.term.shape == (128, 512)]
    assert len(blocks) == 4 and all(names[i + 1] == "all_reduce" for i in blocks)  # product, all-reduce, product, ...


def test_the_gradient_is_averaged_before_an_update_squares_it():
    """Adam reads ``g`` and ``g * g``: the average of the squares is not the square of the average, so the
    all-reduce must sit on ``g`` itself, the first gradient on the path, never above it."""
    loss, inputs, params = mlp()
    W = params[0]
    g = ct.grad(loss, W)
    m, v = ct.var("m", W.shape), ct.var("v", W.shape)
    updates = {m: 0.9 * m + 0.1 * g, v: 0.99 * v + 0.01 * g * g, W: W - 0.01 * m / (ct.sqrt(v) + 1e-8)}
    rewritten, buckets = distributed.data_parallel(updates, inputs)
    (bucket,) = buckets
    assert bucket.gradients == (g,)
    for var in (m, v):
        (reduce,) = averaged(rewritten[var])
        assert reduce.args == (g,)
    assert rewritten[W] is updates[W]  # it reads no gradient


def test_buckets_follow_the_backward_pass_and_keep_to_their_caps_and_dtypes():
    loss, inputs, params = mlp(sizes=(20, 64, 48, 5))
    grads = ct.grad(loss, params)
    by_param = dict(zip(grads, params))
    updates = {p: p - 0.1 * g for p, g in zip(params, grads)}
    _, buckets = distributed.data_parallel(updates, inputs, bucket_bytes=65 * 48 * 4, first_bucket_bytes=49 * 5 * 4)
    order = [by_param[g].name for b in buckets for g in b.gradients]
    assert order == ["W2", "b2", "W1", "b1", "W0", "b0"]  # the last layer's gradients are ready first
    assert [len(b.gradients) for b in buckets] == [2, 2, 2]
    assert all(b.nbytes <= 65 * 48 * 4 for b in buckets)
    half = ct.var("h", (7,), "float16")
    mixed = {**updates, half: half - ct.grad(ct.sum(ct.cast(half, "float32") * ct.mean(inputs[0])), half)}
    _, buckets = distributed.data_parallel(mixed, inputs)
    assert all(len({g.dtype for g in b.gradients}) == 1 for b in buckets) and len(buckets) == 2


def test_each_bucket_lies_in_one_piece_is_issued_early_and_waited_for_late():
    loss, inputs, params = mlp(sizes=(20, 64, 48, 5))
    grads = ct.grad(loss, params)
    updates = {p: p - 0.1 * g for p, g in zip(params, grads)}
    program = ct.compile([loss], inputs=inputs, state=values(params), updates=updates, data_parallel=True)
    kernels = program.kernels
    (i,) = [i for i, k in enumerate(kernels) if k.term.op.name == "all_reduce"]
    reduce = kernels[i]
    for group in (reduce.term.args, reduce.terms):
        places = [program.memory[t] for t in group]
        for before, after in zip(places, places[1:]):
            assert after.offset == before.offset + -(-before.nbytes // 64) * 64
    defined_at = {t: j for j, k in enumerate(kernels) for t in k.terms}
    assert i == max(defined_at[g] for g in reduce.term.args) + 1  # issued as soon as the last gradient exists
    readers = [j for j, k in enumerate(kernels) if set(k.reads) & set(reduce.terms)]
    assert all(j > i for j in readers)
    assert all(set(k.reads) & set(reduce.terms) or k.term.op.name == "all_reduce"
               for k in kernels[min(readers):])  # whatever waits for it runs last
    for g, r in zip(reduce.term.args, reduce.terms):  # reduced in place: each average takes its gradient's place
        assert program.memory[r].takes_from is g and program.memory[r].offset == program.memory[g].offset
    assert f"bucket 0: k{i}, 6 gradient(s), 18.4 KiB reduced in place" in program.explain()


def test_a_gradient_read_after_its_all_reduce_stays_live_until_the_all_reduce_is_waited_for():
    """An output that is a gradient too keeps the gradient apart from its average, out of place, and alive until
    the kernel that waits for the all-reduce: until then the all-reduce may still be reading it."""
    loss, inputs, params = mlp(sizes=(20, 64, 48, 5))
    grads = ct.grad(loss, params)
    updates = {p: p - 0.1 * g for p, g in zip(params, grads)}
    program = ct.compile([loss, grads[-1]], inputs=inputs, state=values(params), updates=updates, data_parallel=True,
                         debug=True)
    kernels = program.kernels
    (i,) = [i for i, k in enumerate(kernels) if k.term.op.name == "all_reduce"]
    join = min(j for j, k in enumerate(kernels) if set(k.reads) & set(kernels[i].terms))
    assert all(program.memory[r].takes_from is None for r in kernels[i].terms)
    assert all(program.memory[g].end >= join for g in kernels[i].term.args)
    assert "read where they lie" in program.explain()


def test_every_rank_issues_its_buckets_in_one_order_whatever_its_batch():
    """NCCL pairs the ranks' calls in the order they come: a rank with a smaller shard, whose schedule differs,
    must still send bucket 0 first, then 1, and so on."""
    caps = {"bucket_bytes": 16384, "first_bucket_bytes": 16384}
    for batch in (32, 8, 3):
        loss, inputs, params = mlp(sizes=(64, 64, 64, 64, 10), batch=batch)
        grads = ct.grad(loss, params)
        program = ct.compile([loss], inputs=inputs, state=values(params), data_parallel=caps,
                             updates={p: p - 0.1 * g for p, g in zip(params, grads)})
        issued = [k.term.attr("bucket") for k in program.kernels if k.term.op.name == "all_reduce"]
        assert issued == list(range(len(program.buckets))) and len(issued) > 3


def test_small_buckets_overlap_the_rest_of_the_backward_pass():
    loss, inputs, params = mlp(sizes=(20, 64, 48, 5))
    grads = ct.grad(loss, params)
    updates = {p: p - 0.1 * g for p, g in zip(params, grads)}
    _, buckets = distributed.data_parallel(updates, inputs, bucket_bytes=65 * 48 * 4, first_bucket_bytes=49 * 5 * 4)
    program = ct.compile([loss], inputs=inputs, state=values(params), updates=updates, data_parallel=True)
    assert len(program.buckets) == 1  # DDP's caps: this MLP's 18 KiB are one bucket
    first = [i for i, k in enumerate(program.kernels) if k.term.op.name == "all_reduce"]
    assert len(first) == 1
    plain = ct.compile([loss], inputs=inputs, state=values(params), updates=updates)
    caps = {"bucket_bytes": 65 * 48 * 4, "first_bucket_bytes": 49 * 5 * 4}
    staged = ct.compile([loss], inputs=inputs, state=values(params), updates=updates, data_parallel=caps)
    assert [b.gradients for b in staged.buckets] == [b.gradients for b in buckets]
    positions = [i for i, k in enumerate(staged.kernels) if k.term.op.name == "all_reduce"]
    assert len(positions) == 3 and positions[0] < len(staged.kernels) // 2 + 4
    first_readers = [min(j for j, k in enumerate(staged.kernels) if set(k.reads) & set(staged.kernels[i].terms))
                     for i in positions]
    assert first_readers == sorted(first_readers)  # the updates of the first averages run while the last is sent
    assert "runs beside k" in staged.explain()
    feeds = batch_of(inputs)
    np.testing.assert_array_equal(staged(**feeds)[0], plain(**feeds)[0])
    for p in params:
        np.testing.assert_array_equal(staged.state[p.name], plain.state[p.name])


def test_what_cannot_be_made_data_parallel_is_refused_saying_why(monkeypatch):
    loss, inputs, params = mlp()
    W = params[0]
    with pytest.raises(FeedError, match="no update reads a gradient"):
        ct.compile([loss], inputs=inputs, state=values(params), updates={W: W * 0.5}, data_parallel=True)
    running = ct.var("running", (20,))
    updates = {W: W - 0.1 * ct.grad(loss, W), running: 0.9 * running + 0.1 * ct.mean(inputs[0], axis=0)}
    with pytest.raises(FeedError, match="'running' reads the fed 'x' other than through a gradient"):
        ct.compile([loss], inputs=inputs, state={**values(params), running: np.zeros(20, np.float32)},
                   updates=updates, data_parallel=True)
    with pytest.raises(FeedError, match="data_parallel is True, False or a dict"):
        ct.compile([loss], inputs=inputs, state=values(params), updates={W: W - ct.grad(loss, W)},
                   data_parallel={"bucket_mb": 25})
    monkeypatch.setenv("WORLD_SIZE", "3")  # launched, init not called yet
    with pytest.raises(BackendError, match="one of 3 ranks.*numpy backend cannot reduce"):
        ct.compile([loss], inputs=inputs, state=values(params), updates={W: W - ct.grad(loss, W)}, data_parallel=True)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(distributed, "_world", distributed.World(0, 2, 0, object()))
    with pytest.raises(BackendError, match="one of 2 ranks.*numpy backend cannot reduce"):
        ct.compile([loss], inputs=inputs, state=values(params), updates={W: W - ct.grad(loss, W)}, data_parallel=True)


def test_init_without_a_job_is_a_world_of_one_and_bad_variables_are_named(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.init() == distributed.World(0, 1, 0, None)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(BackendError, match="WORLD_SIZE='two' is not an integer"):
        distributed.init()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(BackendError, match="describe no job"):
        distributed.init()


def test_rank_zero_hands_its_bytes_to_every_other_rank():
    port = _free_port()
    received = {}

    def rank(r):
        received[r] = rendezvous.share(b"id-of-rank-0" if r == 0 else b"", r, 3, "127.0.0.1", port, timeout=20)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 1, 0)]  # others first: they retry
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert received == {0: b"id-of-rank-0", 1: b"id-of-rank-0", 2: b"id-of-rank-0"}


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
with open(os.path.join(os.path.dirname(__file__), f"rank{rank}.txt"), "w") as out:  # ranks share stdout
    out.write(f"rank {rank} of {os.environ['WORLD_SIZE']} local {os.environ['LOCAL_RANK']} "
              f"nvls {os.environ['NCCL_NVLS_ENABLE']} at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
              f"args {sys.argv[1:]}")
if sys.argv[1] == "fail" and rank == 1:
    sys.exit(3)
if sys.argv[1] == "fail":
    time.sleep(60)
"""


def test_the_launcher_starts_one_process_a_gpu_and_stops_them_all_when_one_fails(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, "-m", "cortado.launch", "--gpus", "2", str(script), "ok", "--lr", "0.1"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert [line.split(" at ")[0] for line in lines] == ["rank 0 of 2 local 0 nvls 0", "rank 1 of 2 local 1 nvls 0"]
    assert all(line.endswith("args ['ok', '--lr', '0.1']") for line in lines)
    assert len({line.split(" at ")[1] for line in lines}) == 1
    failed = subprocess.run([sys.executable, "-m", "cortado.launch", "--gpus", "2", str(script), "fail"],
                            capture_output=True, text=True, timeout=30)
    assert failed.returncode == 3


NODE_SCRIPT = """
import os, sys
from cortado.distributed import rendezvous
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
token = f"from pid {os.getpid()}".encode() if rank == 0 else b""
shared = rendezvous.share(token, rank, size, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=30)
with open(os.path.join(os.path.dirname(__file__), f"rank{rank}.txt"), "w") as out:
    out.write(f"rank {rank} of {size} local {os.environ['LOCAL_RANK']} node {os.environ['GROUP_RANK']}: "
              f"{shared.decode()}")
"""


def test_two_launchers_given_node_ranks_form_one_job(tmp_path):
    """Two launcher groups of two processes each, as two nodes of one job would be started (here on one machine):
    ranks 0 to 3, local ranks 0 and 1 on each node, and every rank receives rank 0's bytes over the rendezvous."""
    script = tmp_path / "job.py"
    script.write_text(NODE_SCRIPT)
    port = _free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "cortado.launch", "--nodes", "2", "--node-rank", str(node),
                               "--master-addr", "127.0.0.1", "--master-port", str(port), "--gpus", "2", str(script)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (1, 0)]
    for node in nodes:
        assert node.wait(timeout=60) == 0, node.stderr.read()
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in range(4)]
    assert [line.split(":")[0] for line in lines] == [
        "rank 0 of 4 local 0 node 0", "rank 1 of 4 local 1 node 0", "rank 2 of 4 local 0 node 1",
        "rank 3 of 4 local 1 node 1"]
    shared = {line.split(": ")[1] for line in lines}
    assert len(shared) == 1 and shared.pop().startswith("from pid ")


def test_a_launcher_of_several_nodes_needs_rank_zeros_address_and_a_node_rank_in_range():
    for arguments, message in ((["--nodes", "2", "--node-rank", "0"], "--master-addr and --master-port"),
                               (["--nodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "1"],
                                "--node-rank must be from 0 to --nodes - 1")):
        run = subprocess.run([sys.executable, "-m", "cortado.launch", *arguments, "--gpus", "1", "job.py"],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode == 2 and message in run.stderr
