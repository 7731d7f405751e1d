"""The demo and the examples run as a user would run them, and say what they promise."""

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, cwd):
    result = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_demo_trains_the_compiled_mlp_step_and_shows_its_plan(tmp_path):
    out = run(["-m", "cortado", "demo", "--epochs", "30", "--dot", str(tmp_path / "g.dot"),
               "--plan", str(tmp_path / "plan.png")], cwd=ROOT)
    losses = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("epoch")]
    assert len(losses) == 30 and losses[0] < 1.0986 and losses[-1] < 0.6 * losses[0]
    assert "loss curve:" in out and "> 30 epochs" in out
    assert "memory of the step: arena" in out and "lower bound" in out
    assert "training accuracy:" in out
    assert (tmp_path / "g.dot").read_text().startswith("digraph cortado {")
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"


def test_mlp_example_runs_as_a_script(tmp_path):
    out = run([os.path.join(ROOT, "examples", "mlp_numpy.py"), "--epochs", "60", "--seed", "1"], cwd=tmp_path)
    accuracy = float(out.split("training accuracy: ")[1].split("%")[0])
    assert accuracy > 85


def test_expressions_example(tmp_path):
    out = run([os.path.join(ROOT, "examples", "expressions.py")], cwd=tmp_path)
    assert "ShapeError: matmul(float32[8,3], float32[4,3])" in out
    assert "FeedError: no feed for variable 'query'" in out
    assert "float32 float64" in out
    assert "counts by position % 3: [3. 3. 2.]" in out
    assert (tmp_path / "attention.dot").exists()


@pytest.mark.parametrize("example", ["property_test.py"])
def test_example_test_files_pass(example):
    run(["-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(ROOT, "examples", example)], cwd=ROOT)


def test_rewrite_tour(tmp_path):
    out = run([os.path.join(ROOT, "examples", "rewrite_tour.py")], cwd=tmp_path)
    assert "a * b\nbar(2, 3, 1)\na * b + y" in out
    assert "stable: [    0. -1000. -1000.]" in out
    assert "\nsin(2 * v)\n4 rewrites by 4 rules: sin-double x1, pythagoras x1" in out
    assert "  your rules: 2 rewrites: sin-double x1, pythagoras x1" in out
    assert ("sum-of-broadcast: sum(broadcast_to(log(exp(x)), shape=(3, 64, 10)), axes=(0,))  ->  "
            "add(multiply(3.0, log(exp(x))), 0.0)") in out  # + 0.0: a sum of copies of -0.0 is +0.0


def test_the_gpu_example_says_plainly_when_there_is_no_gpu(tmp_path):
    from cortado.backends import gpu_visible

    if gpu_visible():
        out = run([os.path.join(ROOT, "examples", "mlp_gpu.py")], cwd=tmp_path)
        assert "cortado" in out
        return
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "mlp_gpu.py")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr + result.stdout
    assert "needs CuPy and an NVIDIA GPU" in result.stderr + result.stdout


def test_cnn_example_learns_the_drawn_strokes(tmp_path):
    out = run([os.path.join(ROOT, "examples", "cnn.py"), "--epochs", "4", "--backend", "numpy"], cwd=tmp_path)
    losses = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("epoch")]
    assert len(losses) == 4 and losses[0] < np.log(4) and losses[-1] < 0.3 * losses[0]
    held_out = float(out.split("held-out accuracy: ")[1].split("%")[0])
    assert held_out > 90


def test_demo_runs_the_cnn_example_when_asked(tmp_path):
    out = run(["-m", "cortado", "demo", "--model", "cnn", "--epochs", "2"], cwd=ROOT)
    assert "Training a CNN on drawn images" in out and "held-out accuracy:" in out


def test_the_cnn_demo_refuses_the_mlps_drawing_flags_instead_of_ignoring_them():
    from cortado.__main__ import main

    with pytest.raises(SystemExit):
        main(["demo", "--model", "cnn", "--plan", "plan.png"])


def test_quantized_mlp_example_keeps_its_accuracy_in_int8_and_fine_tunes(tmp_path):
    out = run([os.path.join(ROOT, "examples", "quantized_mlp.py"), "--epochs", "60", "--seed", "1"], cwd=tmp_path)
    accuracies = out.split("accuracy: float32 ")[1]
    floating, int8 = (float(part.split("%")[0]) for part in accuracies.split(", int8 "))
    assert floating > 85 and abs(int8 - floating) <= 1.0, out
    tuning = out.split("straight-through gradients): loss ")[1].split(" over")[0]
    first, last = (float(v) for v in tuning.split(" -> "))
    assert last < first, out


def test_data_parallel_example_trains_in_a_world_of_one_and_says_why_two_ranks_cannot_run_here(tmp_path):
    script = os.path.join(ROOT, "examples", "data_parallel.py")
    out = run([script, "--backend", "numpy", "--steps", "120"], cwd=tmp_path)
    assert "rank 0 of 1" in out and float(out.split("training accuracy: ")[1].split("%")[0]) > 60
    two = subprocess.run([sys.executable, "-m", "cortado.launch", "--gpus", "2", script, "--backend", "numpy"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert two.returncode != 0
    assert ("a job of several processes needs CuPy and NCCL" in two.stderr  # a machine without CuPy
            or "LOCAL_RANK=1, but this node has 1 GPU(s)" in two.stderr  # a machine of one GPU
            or "the numpy backend cannot reduce over them; use backend='cupy'" in two.stderr)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8"])
def test_gpt_example_learns_characters_and_samples_text(tmp_path, dtype):
    out = run([os.path.join(ROOT, "examples", "gpt.py"), "--steps", "120", "--sample", "40", "--backend", "numpy",
               "--dtype", dtype], cwd=tmp_path)
    first, last = (float(out.split(words)[1].split()[0]) for words in ("): loss ", "at the first, "))
    uniform = float(out.split("a uniform guess: ")[1].split(")")[0])
    assert first > 0.95 * uniform and last < 0.75 * uniform, out
    held_out = float(out.split("held-out loss ")[1].split()[0])
    assert held_out < 0.8 * uniform, out
    sampled = out.split("sampled, after a held-out prompt:\n")[1]
    assert len(sampled.rstrip("\n")) >= 64 + 40 - 1, out


def test_gpt_example_resumed_from_its_checkpoint_ends_with_the_weights_of_one_run(tmp_path):
    from cortado import checkpoint

    script = [os.path.join(ROOT, "examples", "gpt.py"), "--sample", "0", "--backend", "numpy", "--layers", "1"]
    run([*script, "--steps", "16", "--checkpoint", "whole.safetensors"], cwd=tmp_path)
    run([*script, "--steps", "8", "--checkpoint", "half.safetensors"], cwd=tmp_path)
    out = run([*script, "--steps", "8", "--checkpoint", "half.safetensors", "--resume", "--plot", "loss.png"],
              cwd=tmp_path)
    whole, meta = checkpoint.read(str(tmp_path / "whole.safetensors"))
    resumed, resumed_meta = checkpoint.read(str(tmp_path / "half.safetensors"))
    assert meta == resumed_meta == {"steps": "16"} and list(whole) == list(resumed)
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)
    assert "drew the loss curve" not in out or (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
