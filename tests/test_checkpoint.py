"""Checkpoints: safetensors files written and read back exactly, a training run resumed from one continuing bit for
bit on every backend, and weights loaded by name from a state_dict."""

import importlib.util

import numpy as np
import pytest
from peers import HAS_TORCH, needs_torch
from reference_checks import BACKENDS, host, skip_without_device

import cortado as ct
from cortado import checkpoint, nn, optim
from cortado.exprgraph.dtypes import BFLOAT16

HAS_SAFETENSORS = importlib.util.find_spec("safetensors") is not None


def _arrays():
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((3, 4)).astype(np.float32), "count": np.array(7, np.int32),
              "mask": np.array([True, False]), "x64": rng.standard_normal(5), "empty": np.zeros((0, 3), np.float16),
              "transposed": rng.standard_normal((4, 3)).astype(np.float32).T}
    if BFLOAT16 is not None:
        arrays["half"] = rng.standard_normal((2, 2)).astype(BFLOAT16)
    return arrays


def test_a_file_reads_back_exactly_with_its_metadata(tmp_path):
    path = str(tmp_path / "a.safetensors")
    checkpoint.write(path, _arrays(), {"steps": 12})
    arrays, metadata = checkpoint.read(path)
    assert metadata == {"steps": "12"} and list(arrays) == list(_arrays())
    for name, expected in _arrays().items():
        assert arrays[name].dtype == expected.dtype and arrays[name].shape == expected.shape
        np.testing.assert_array_equal(arrays[name], expected)
    with open(path, "rb") as file:
        assert int.from_bytes(file.read(8), "little") % 8 == 0  # the header padded as safetensors pads it


@pytest.mark.skipif(not HAS_SAFETENSORS, reason="safetensors is not installed")
def test_files_open_with_the_safetensors_library(tmp_path):
    from safetensors.numpy import load_file, save_file

    path = str(tmp_path / "a.safetensors")
    plain = {k: v for k, v in _arrays().items() if k != "half"}
    checkpoint.write(path, plain)
    for name, array in load_file(path).items():
        np.testing.assert_array_equal(array, plain[name])
    theirs = str(tmp_path / "b.safetensors")
    save_file({k: np.ascontiguousarray(v) for k, v in plain.items()}, theirs)
    arrays, _ = checkpoint.read(theirs)
    for name, array in arrays.items():
        np.testing.assert_array_equal(array, plain[name])
    if HAS_TORCH and BFLOAT16 is not None:
        from safetensors.torch import load_file as torch_load

        checkpoint.write(path, {"half": _arrays()["half"]})
        half = torch_load(path)["half"]
        np.testing.assert_array_equal(half.float().numpy(), _arrays()["half"].astype(np.float32))


def _training(backend, seed=0, compute_in=None):
    """An MLP classifier, AdamW on a warm-up and cosine schedule with clipping: every kind of state a step keeps;
    computing in ``compute_in`` where given (its float32 weights cast where they are read)."""
    model = nn.MLP(6, 16, 16, 3, activation=ct.tanh)
    if compute_in is not None:
        model = model.compute_in(compute_in)
    x, y = ct.var("x", (8, 6)), ct.var("y", (8,), "int32")
    loss = nn.cross_entropy(model(x), y)
    params = model.parameters()
    adamw = optim.AdamW(optim.warmup_cosine(1e-2, 3, 20), weight_decay=0.1, clip_norm=1.0)
    state, updates = adamw.updates(params, ct.grad(loss, list(params.values())))
    return ct.compile([loss], inputs=[x, y], state={**model.initial_values(seed), **state}, updates=updates,
                      backend=backend)


def _batches(count):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
            for _ in range(count)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_resumed_from_a_checkpoint_continues_bit_for_bit(backend, tmp_path):
    skip_without_device(backend)
    batches = _batches(10)
    straight = _training(backend)
    losses = [float(host(straight(x=x, y=y)[0])) for x, y in batches]
    first = _training(backend)
    for x, y in batches[:5]:
        first(x=x, y=y)
    path = str(tmp_path / "run.safetensors")
    ct.save(first, path)
    resumed = _training(backend, seed=5)  # other first weights: the checkpoint replaces them all
    ct.load(resumed, path)
    resumed_losses = [float(host(resumed(x=x, y=y)[0])) for x, y in batches[5:]]
    assert resumed_losses == losses[5:]
    for name in straight.state:
        np.testing.assert_array_equal(host(resumed.state[name]), host(straight.state[name]), err_msg=name)


def test_loading_a_checkpoint_that_does_not_match_says_how(tmp_path):
    program = _training("numpy")
    path = str(tmp_path / "run.safetensors")
    arrays = {name: np.array(program.state[name]) for name in program.state}
    checkpoint.write(path, {k: v for k, v in arrays.items() if k != "0.bias"})
    with pytest.raises(ct.FeedError, match=r"missing \['0.bias'\]"):
        ct.load(program, path)
    checkpoint.write(path, {**arrays, "extra": np.zeros(2)})
    with pytest.raises(ct.FeedError, match=r"not in the program \['extra'\]"):
        ct.load(program, path)
    checkpoint.write(path, {**arrays, "0.bias": np.zeros(3, np.float32)})
    with pytest.raises(ct.FeedError, match="'0.bias' has shape"):
        ct.load(program, path)
    checkpoint.write(path, {**arrays, "0.bias": np.zeros(16)})
    with pytest.raises(ct.FeedError, match="'0.bias' is float64"):
        ct.load(program, path)
    with open(path, "wb") as file:
        file.write(b"\x05\x00\x00\x00\x00\x00\x00\x00{not")
    with pytest.raises(ct.FeedError, match="not a safetensors file"):
        ct.load(program, path)


def test_a_pytorch_file_and_a_missing_directory_are_said_to_be_so(tmp_path):
    """torch.save writes a zip archive (or, with its legacy format, a pickle): told apart from a damaged checkpoint,
    with what to do. A save into a directory that does not exist names the directory, not a temporary file."""
    import pickle
    import zipfile

    program = _training("numpy")
    with zipfile.ZipFile(tmp_path / "model.pt", "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"weight": [1.0]}))
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps({"weight": [1.0]}, protocol=2))
    for name in ("model.pt", "legacy.pt"):
        with pytest.raises(ct.FeedError, match=r"a PyTorch \(torch.save\) file, it seems: read it with torch.load "
                                               r"and give its state_dict to ct.load_state_dict"):
            ct.load(program, tmp_path / name)
    missing = tmp_path / "runs" / "first"
    with pytest.raises(ct.FeedError, match=f"there is no directory {missing} to write it in"):
        ct.save(program, missing / "step.safetensors")


def test_a_variable_named_as_safetensors_metadata_key_is_refused_when_saved(tmp_path):
    """The file was written, then could not be read: its tensor read as the header's metadata."""
    meta = ct.var("__metadata__", (3,))
    program = ct.compile([meta], state={meta: np.ones(3, np.float32)})
    with pytest.raises(ct.FeedError, match="a tensor cannot be named '__metadata__'"):
        ct.save(program, str(tmp_path / "m.safetensors"))


def test_an_empty_tensor_listed_after_another_at_its_offset_reads(tmp_path):
    """Entries were ordered by where they start alone: an empty one listed after a tensor starting at its offset
    seemed to overlap it, and a file the safetensors library reads was refused."""
    header = b'{"m": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}, ' \
             b'"m_empty": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'
    path = tmp_path / "empty.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + np.arange(3, dtype="<f4").tobytes())
    arrays, _ = checkpoint.read(str(path))
    assert arrays["m_empty"].shape == (0,) and arrays["m"].tolist() == [0.0, 1.0, 2.0]


def test_a_state_dict_loads_by_name():
    program = _training("numpy")
    weights = {"0.weight": np.ones((16, 6)), "2.bias": np.arange(16)}  # converted to the variables' float32
    assert ct.load_state_dict(program, weights) == ["0.weight", "2.bias"]
    np.testing.assert_array_equal(program.state["2.bias"], np.arange(16, dtype=np.float32))
    with pytest.raises(ct.FeedError, match=r"names \['fc.weight'\], which the program's state does not have"):
        ct.load_state_dict(program, {"fc.weight": np.ones(2)})
    assert ct.load_state_dict(program, {"fc.weight": np.ones(2), "4.bias": np.zeros(3)}, strict=False) == ["4.bias"]


def test_a_state_dict_value_its_variable_cannot_hold_is_refused_not_wrapped():
    counts, halves, x = ct.var("c", (2,), "int32"), ct.var("h", (2,), "float16"), ct.var("x", (2,))
    program = ct.compile([ct.sum(x) + ct.sum(ct.cast(counts, "float32")) + ct.sum(ct.cast(halves, "float32"))],
                         inputs=[x], state={counts: np.zeros(2, np.int32), halves: np.zeros(2, np.float16)})
    for value, message in ((np.array([2 ** 40, 1]), "holds 1099511627776 at \\(0,\\), which int32 cannot hold"),
                           (np.array([1.0, np.nan]), "holds nan at \\(1,\\)"), (np.array([1.5, 1.0]), "holds 1.5")):
        with pytest.raises(ct.FeedError, match=message):
            ct.load_state_dict(program, {"c": value}, strict=False)
    with pytest.raises(ct.FeedError, match="holds 1000000.0 at \\(0,\\), which float16 cannot hold"):
        ct.load_state_dict(program, {"h": np.array([1e6, 1.0])}, strict=False)
    np.testing.assert_array_equal(program.state["c"], [0, 0])  # a refused value changes nothing
    ct.load_state_dict(program, {"c": np.array([3, 4], np.int64), "h": np.array([0.1, np.inf])}, strict=False)
    np.testing.assert_array_equal(program.state["c"], [3, 4])
    assert program.state["h"][0] == np.float16(0.1) and np.isinf(program.state["h"][1])  # rounded; inf stays inf


def test_checkpoint_calls_given_the_wrong_things_say_so(tmp_path):
    program = _training("numpy")
    with pytest.raises(ct.FeedError, match="ct.save takes a compiled program"):
        ct.save({"a": 1}, str(tmp_path / "x"))
    with pytest.raises(ct.FeedError, match="ct.load takes a compiled program"):
        ct.load(None, str(tmp_path / "x"))
    with pytest.raises(ct.FeedError, match="is a directory"):
        ct.save(program, str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # no partial file left
    with pytest.raises(ct.FeedError, match=r"maps names to arrays .* not list \(dict\(pairs\)"):
        ct.load_state_dict(program, [("0.bias", np.zeros(16))])
    path = tmp_path / "bad.safetensors"
    for header in (b"[1,2]", b'{"a": {"dtype": "F32", "shape": "abc", "data_offsets": [0, 4]}}'):
        path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
        with pytest.raises(ct.FeedError, match="not an object|lack a dtype, shape or two data offsets"):
            ct.load(program, str(path))


@needs_torch
def test_a_pytorch_models_state_dict_gives_its_outputs():
    import torch

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model = nn.MLP(6, 16, 3, activation=ct.tanh)
    x = ct.var("x", (4, 6))
    program = ct.compile([model(x)], inputs=[x], state=model.initial_values(), backend="numpy")
    ct.load_state_dict(program, reference.state_dict())
    xv = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    (ours,) = program(x=xv)
    np.testing.assert_allclose(ours, reference(torch.from_numpy(xv)).detach().numpy(), rtol=1e-5, atol=1e-6)
    if BFLOAT16 is not None:
        halves = {k: v.to(torch.bfloat16) for k, v in reference.state_dict().items()}
        ct.load_state_dict(program, halves)
        np.testing.assert_array_equal(program.state["0.weight"], halves["0.weight"].float().numpy())


@needs_torch
def test_pytorchs_float8_tensors_load_by_their_bits():
    """``torch.from_numpy``'s way failed on them with torch's own TypeError (a float8 safetensors file read by
    safetensors.torch, say)."""
    import torch

    pytest.importorskip("ml_dtypes")
    v = ct.var("v", (2, 3), "float8_e4m3fn")
    program = ct.compile([ct.cast(v, "float32")], state={v: np.zeros((2, 3), np.float32).astype(v.dtype)})
    ct.load_state_dict(program, {"v": torch.full((2, 3), -1.5).to(torch.float8_e4m3fn)})
    np.testing.assert_array_equal(program()[0], np.full((2, 3), -1.5, np.float32))


def test_strict_loading_asks_for_no_buffer_pytorchs_layers_lack():
    """A dropout's random stream is cortado's state alone: a PyTorch model's state_dict with dropout loads strictly,
    and the stream keeps its values; a batch norm's running statistics are asked for, as PyTorch asks."""
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.1), nn.Linear(16, 3)).eval()
    x = ct.var("x", (2, 6))
    program = ct.compile([model(x)], inputs=[x], state=model.initial_values(), backend="numpy")
    seed = np.array(program.state["1.seed"])
    weights = {name: np.zeros(v.shape, np.float32) for name, v in model.parameters().items()}
    assert sorted(ct.load_state_dict(program, weights, model=model)) == sorted(weights)
    assert np.array(program.state["1.seed"]) == seed
    norm = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm(4)).eval()
    program = ct.compile([norm(x)], inputs=[x], state=norm.initial_values(), backend="numpy")
    with pytest.raises(ct.FeedError, match=r"lacks \['1.num_batches_tracked', '1.running_mean', '1.running_var'\]"):
        ct.load_state_dict(program, {name: np.zeros(v.shape, np.float32) for name, v in norm.parameters().items()},
                           model=norm)


@needs_torch
def test_a_pytorch_model_with_dropout_loads_strictly_and_gives_its_outputs_in_inference():
    import torch

    torch.manual_seed(1)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 3)).eval()
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.2), nn.Linear(16, 3)).eval()
    x = ct.var("x", (4, 6))
    program = ct.compile([model(x)], inputs=[x], state=model.initial_values(), backend="numpy")
    ct.load_state_dict(program, reference.state_dict(), model=model)
    xv = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(program(x=xv)[0], reference(torch.from_numpy(xv)).detach().numpy(), rtol=1e-5, atol=1e-6)


def _training_step(model, optimizer):
    """A step of ``model`` (four features in) making the mean square of its output on batches of 16 smaller, with
    the layers' state updates beside the optimizer's."""
    x = ct.var("x", (16, 4))
    loss = ct.mean(model(x) ** 2)
    params = model.parameters()
    opt_state, updates = optimizer.updates(params, ct.grad(loss, list(params.values())))
    return ct.compile([loss], inputs=[x], state={**model.initial_values(), **opt_state},
                      updates={**updates, **model.state_updates(loss)})


def test_a_trained_step_is_evaluated_by_a_program_of_its_own_given_its_state_by_name(tmp_path):
    """docs/training.md's recipe: the model in eval() on a batch of another size, compiled with the model's state, the
    trained values set from the step's state (its optimizer's moments left out); from a checkpoint too, where
    ct.load says how."""
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm(8), nn.Linear(8, 2))
    step = _training_step(model, optim.AdamW(1e-2))
    rng = np.random.default_rng(0)
    for _ in range(3):
        step(x=rng.standard_normal((16, 4)).astype(np.float32))
    model.eval()
    xe = ct.var("xe", (5, 4))
    predict = ct.compile([model(xe)], inputs=[xe], state=model.initial_values())
    model.train()
    set_names = ct.load_state_dict(predict, step.state, strict=False)
    assert "1.running_var" in set_names and not any(name.startswith("adamw") for name in set_names)
    batch = rng.standard_normal((5, 4)).astype(np.float32)
    inference = model.eval()(xe)
    trained = {v.name: np.asarray(step.state[v.name]) for v in ct.Graph(inference).schedule
               if v.op.name == "var" and v.name != "xe"}
    expected = ct.evaluate(inference, {"xe": batch, **trained})
    model.train()
    np.testing.assert_allclose(predict(xe=batch)[0], expected, rtol=1e-6)
    path = str(tmp_path / "run.safetensors")
    ct.save(step, path)
    with pytest.raises(ct.FeedError, match=r"not in the program \['adamw.*strict=False\) sets the names both have"):
        ct.load(predict, path)
    ct.load_state_dict(predict, checkpoint.read(path)[0], strict=False)
    np.testing.assert_allclose(predict(xe=batch)[0], expected, rtol=1e-6)


def test_a_state_dict_of_which_no_name_matches_is_refused_even_loosely():
    """strict=False sets the names both have; where there are none (DataParallel's 'module.' prefix, another model)
    nothing would be set without a word."""
    model = nn.Linear(2, 2)
    x = ct.var("x", (1, 2))
    program = ct.compile([model(x)], inputs=[x], state=model.initial_values())
    with pytest.raises(ct.FeedError, match=r"none of its names \(module.weight, ...\) is a state variable of the "
                                           r"program \(bias, weight, ...\); nothing was set"):
        ct.load_state_dict(program, {"module.weight": np.zeros((2, 2))}, strict=False)


def test_strict_loading_given_the_model_names_what_the_dict_lacks(tmp_path):
    model = nn.MLP(6, 16, 3)
    x = ct.var("x", (2, 6))
    program = ct.compile([model(x)], inputs=[x], state=model.initial_values(), backend="numpy")
    with pytest.raises(ct.FeedError, match=r"lacks \['0.bias', '2.bias', '2.weight'\], of the model"):
        ct.load_state_dict(program, {"0.weight": np.zeros((16, 6))}, model=model)
    path = str(tmp_path / "holes.safetensors")
    checkpoint.write(path, {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)})
    with open(path, "r+b") as file:  # make b's bytes overlap a's
        raw = bytearray(file.read())
        raw = raw.replace(b'"data_offsets":[8,16]', b'"data_offsets":[4,12]')
        file.seek(0)
        file.write(raw)
    with pytest.raises(ct.FeedError, match="do not hold"):
        checkpoint.read(path)
    with open(path, "wb") as file:
        file.write(len(b'{"a":{"dtype":"F32"}}').to_bytes(8, "little") + b'{"a":{"dtype":"F32"}}')
    with pytest.raises(ct.FeedError, match=r"entries for \['a'\] lack"):
        checkpoint.read(path)


def test_an_epochs_last_smaller_batch_runs_through_a_step_of_its_own_with_the_state_moved_across():
    """docs/training.md's recipe for one batch shape: a step for the last batch's shape, given the state so far and
    giving it back, trains as the updates say (its weights, moments and step count), and the step of the full
    batches refuses the smaller one with a message saying so."""
    model = nn.MLP(6, 8, 3)
    x, y = ct.var("x", (16, 6)), ct.var("y", (16,), "int32")
    loss = nn.cross_entropy(model(x), y)
    params = model.parameters()
    adamw = optim.AdamW(lr=1e-2)
    opt_state, updates = adamw.updates(params, ct.grad(loss, list(params.values())))
    step = ct.compile([loss], inputs=[x, y], updates=updates, state={**model.initial_values(seed=0), **opt_state})
    last = ct.var("x_last", (5, 6)), ct.var("y_last", (5,), "int32")
    loss_last = nn.cross_entropy(model(last[0]), last[1])
    state_last, updates_last = adamw.updates(params, ct.grad(loss_last, list(params.values())))
    step_last = ct.compile([loss_last], inputs=list(last), updates=updates_last,
                           state={**model.initial_values(seed=0), **state_last})
    rng = np.random.default_rng(0)
    xb, yb = rng.standard_normal((16, 6)).astype(np.float32), rng.integers(0, 3, 16).astype(np.int32)
    xl, yl = rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5).astype(np.int32)
    step(x=xb, y=yb)
    with pytest.raises(ct.ShapeError, match=r"has shape \(5, 6\); a program runs on the shapes it was compiled for: "
                                            r"drop a last, smaller batch, or compile a step for that shape"):
        step(x=xl, y=yl)
    with pytest.raises(ct.ShapeError) as larger:  # a larger feed is no last batch; nor is a feed to ct.evaluate
        step(x=np.zeros((32, 6), np.float32), y=yb)
    with pytest.raises(ct.ShapeError) as evaluated:
        ct.evaluate(loss, {"x": xl, "y": yl, **{name: step.state[name] for name in params}})
    assert "last, smaller batch" not in str(larger.value) + str(evaluated.value)
    ct.load_state_dict(step_last, step.state)
    before = {name: np.array(value) for name, value in step_last.state.items()}
    step_last(x_last=xl, y_last=yl)
    expected = ct.evaluate(list(updates_last.values()), {"x_last": xl, "y_last": yl, **before})
    for v, value in zip(updates_last, expected):
        np.testing.assert_allclose(step_last.state[v.name], value, rtol=1e-5, atol=1e-7)
    ct.load_state_dict(step, step_last.state)
    assert int(step.state["adamw.step"]) == 2
    step(x=xb, y=yb)
    assert int(step.state["adamw.step"]) == 3


def test_a_models_state_comes_back_by_pytorchs_names_without_the_optimizers_or_cortados_own_buffers():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm(8), nn.Dropout(0.1), nn.Linear(8, 2))
    step = _training_step(model, optim.AdamW(1e-2))
    step(x=np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32))
    exported = ct.state_dict(step, model)
    assert set(exported) == {"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                             "1.num_batches_tracked", "3.weight", "3.bias"}  # no moments, no dropout stream
    np.testing.assert_array_equal(exported["1.running_mean"], step.state["1.running_mean"])
    other = nn.Linear(3, 3)
    with pytest.raises(ct.FeedError, match=r"ct.state_dict: the program's state has no \['weight', 'bias'\]"):
        ct.state_dict(step, other)


@needs_torch
def test_a_model_trained_here_loads_strictly_into_pytorch_and_computes_the_same():
    import torch

    torch.manual_seed(2)
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm(8), nn.Linear(8, 2))
    step = _training_step(model, optim.SGD(0.1, momentum=0.9))
    rng = np.random.default_rng(3)
    for _ in range(3):
        step(x=rng.standard_normal((16, 4)).astype(np.float32))
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ct.state_dict(step, model).items()})  # strictly
    model.eval()
    xe = ct.var("xe", (5, 4))
    predict = ct.compile([model(xe)], inputs=[xe], state=model.initial_values())
    model.train()
    ct.load_state_dict(predict, ct.state_dict(step, model), model=model)
    batch = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(predict(xe=batch)[0], theirs.eval()(torch.from_numpy(batch)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
