"""A large tensor-core product whose rows are not 16-byte aligned (a vocabulary of 63 in bfloat16) copies such
operands to padded rows and writes its product so before packing it (``layout.gemm_copies``,
``layout.gemm_padded_result``, ``targets.copies.Copy``): cuBLASLt would run it on kernels of one element a load. What
the planner decides, on the CPU; ``test_gpu_padded_rows.py`` runs it."""

import numpy as np
import pytest

import cortado as ct
from cortado.backends.cupy import layout
from cortado.backends.cupy.codegen import contiguous_strides
from cortado.backends.cupy.lowering.gemm_op import gemm
from cortado.backends.cupy.targets import copies


def _strides(*values):
    return {v: contiguous_strides(v.shape) for v in values}


def _head(vocab, rows=8192, width=768, dtype="bfloat16"):
    x, w = ct.var("x", (rows, width), dtype), ct.var("w", (vocab, width), dtype)
    return x, w, gemm(x, w, transpose_b=True)


def test_a_products_rows_of_63_bfloat16_are_written_padded_to_64():
    x, w, logits = _head(63)
    assert layout.gemm_padded_result(logits) == (64, 1)
    assert layout.gemm_copies(logits, _strides(x, w, logits)) == ()  # both read with rows of 768


def test_operands_with_rows_of_63_are_copied_to_padded_rows_whichever_way_they_are_read():
    x, w, logits = _head(63)
    dlogits = ct.var("dlogits", logits.shape, "bfloat16")
    for g in (gemm(dlogits, x, transpose_a=True), gemm(dlogits, w)):  # the weight's gradient, the input's
        assert layout.gemm_copies(g, _strides(dlogits, x, w)) == ((dlogits, (64, 1)),)
        assert layout.gemm_padded_result(g) is None  # rows of 768


def test_batches_of_padded_rows_lie_a_padded_matrix_apart():
    a, b = ct.var("a", (4, 2048, 63), "float16"), ct.var("b", (63, 512), "float16")
    g = gemm(a, b)
    assert layout.gemm_copies(g, _strides(a, b)) == ((a, (2048 * 64, 64, 1)),)  # b's rows of 512 read as they are
    x, w = ct.var("x", (4, 4096, 256), "float16"), ct.var("w", (256, 63), "float16")
    assert layout.gemm_padded_result(gemm(x, w)) == (4096 * 64, 64, 1)


@pytest.mark.parametrize("case", ["aligned", "small", "float32", "adds c", "gelu argument"])
def test_products_that_gain_nothing_are_not_padded(case):
    x, w, logits = _head(64 if case == "aligned" else 63, rows=512 if case == "small" else 8192,
                         dtype="float32" if case == "float32" else "bfloat16")
    if case == "adds c":
        logits = gemm(x, w, transpose_b=True, beta=1.0, c=ct.var("c", logits.shape, "bfloat16"))
    if case == "gelu argument":
        logits = gemm(x, w, transpose_b=True, epilogue="gelu_aux")
    assert layout.gemm_padded_result(logits) is None
    if case in ("aligned", "small", "float32"):
        dlogits = ct.var("dlogits", logits.shape, x.dtype)
        assert layout.gemm_copies(gemm(dlogits, x, transpose_a=True), _strides(dlogits, x)) == ()


def test_a_copy_to_padded_rows_writes_and_takes_the_padded_bytes(monkeypatch):
    monkeypatch.setattr(copies, "prepare", lambda source: None)
    padded = copies.Copy((8192, 63), np.dtype("float16"), (63, 1), (64, 1))
    assert padded.pads_rows and padded.nbytes == 8192 * 64 * 2 and padded.source_bytes == 8192 * 63 * 2
    assert f"i < {8192 * 64};" in padded.kernel.text  # every element of the padded rows, the padding too
    packed = copies.Copy((8192, 63), np.dtype("float16"), (64, 1))
    assert not packed.pads_rows and packed.nbytes == 8192 * 63 * 2 and packed.source_bytes == (8191 * 64 + 63) * 2
    a = ct.var("a", (8192, 63), "float16")
    staged, reads, top = copies.staged([(a, (64, 1))], {a: (63, 1)}, 256)
    assert top == 8192 * 64 * 2 and staged[0][2].pads_rows and reads[a] == (64, 1)


def test_padded_rows_are_told_apart_from_permuted_and_packed_strides():
    assert copies.padded_rows((8, 63), (64, 1)) and copies.padded_rows((2, 8, 63), (512, 64, 1))
    assert not copies.padded_rows((8, 63), (63, 1)) and not copies.padded_rows((8, 63), (1, 8))
    assert not copies.padded_rows((2, 8, 63), (504, 64, 1))  # batches not a padded matrix apart
    assert layout.stored_elements((2, 8, 63), (512, 64, 1)) == 512 + 7 * 64 + 63
    assert layout.stored_elements((0, 63), (64, 1)) == 0
