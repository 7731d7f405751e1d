"""A large tensor-core product whose operands or result hold rows that are not whole 16-byte vectors (a vocabulary
of 63 in bfloat16) is computed padded: its operands copied with zeros after them, its product written whole in its
workspace, then packed (``targets.gemm``'s ``gemm_padding``, ``gemm_copies`` and ``gemm_padded_result``,
``targets.copies.Copy``): cuBLASLt would run it on kernels of one element a load. Only the dimensions along rows are
padded, and only where the product's sums outweigh its copies. What the planner decides, on the CPU;
``test_gpu_padded_rows.py`` runs it."""

import numpy as np
import pytest

import cortado as ct
from cortado.backends.cupy.targets import gemm as gemm_target
from cortado.backends.cupy.codegen import contiguous_strides
from cortado.backends.cupy.lowering.gemm_op import gemm
from cortado.backends.cupy.targets import copies


def _strides(*values):
    return {v: contiguous_strides(v.shape) for v in values}


def _result(t, strides):
    """Where gemm ``t`` writes its product, padded as ``gemm_padding`` pads it."""
    return gemm_target.gemm_padded_result(t, gemm_target.gemm_padding(t, strides))


def _head(vocab, rows=8192, width=768, dtype="bfloat16"):
    x, w = ct.var("x", (rows, width), dtype), ct.var("w", (vocab, width), dtype)
    return x, w, gemm(x, w, transpose_b=True)


def test_a_head_over_a_vocabulary_of_63_is_a_product_of_64_columns_packed_after():
    x, w, logits = _head(63)
    assert gemm_target.gemm_padding(logits, _strides(x, w)) == (8192, 64, 768)
    assert gemm_target.gemm_copies(logits, _strides(x, w, logits)) == ((w, (768, 1), (64, 768)),)  # a row of zeros
    assert _result(logits, _strides(x, w)) == ((64, 1), (8192, 64))


def test_the_heads_gradients_pad_the_contracted_axis_or_the_rows_they_write():
    x, w, logits = _head(63)
    dlogits = ct.var("dlogits", logits.shape, "bfloat16")
    to_input = gemm(dlogits, w)  # (8192, 63) @ (63, 768): 63 products a sum, padded to 64 zeros and all
    assert gemm_target.gemm_padding(to_input, _strides(dlogits, w)) == (8192, 768, 64)
    assert gemm_target.gemm_copies(to_input, _strides(dlogits, w)) == ((dlogits, (64, 1), (8192, 64)),
                                                                  (w, (768, 1), (64, 768)))
    assert _result(to_input, _strides(dlogits, w)) is None  # its own rows of 768: written in place
    to_weight = gemm(dlogits, x, transpose_a=True)  # (63, 768) from 8192 rows: 64 rows written, 63 kept
    assert gemm_target.gemm_padding(to_weight, _strides(dlogits, x)) == (64, 768, 8192)
    assert gemm_target.gemm_copies(to_weight, _strides(dlogits, x)) == ((dlogits, (64, 1), (8192, 64)),)
    assert _result(to_weight, _strides(dlogits, x)) == ((768, 1), (64, 768))


def test_a_product_adding_c_reads_c_padded_as_it_writes_its_product():
    x, w, _ = _head(63)
    dlogits, c = ct.var("dlogits", (8192, 63), "bfloat16"), ct.var("c", (63, 768), "bfloat16")
    g = gemm(dlogits, x, transpose_a=True, beta=1.0, c=c)  # an embedding's gradient added to the head's
    assert gemm_target.gemm_copies(g, _strides(dlogits, x, c)) == ((dlogits, (64, 1), (8192, 64)), (c, (768, 1), (64, 768)))
    assert _result(g, _strides(dlogits, x, c)) == ((768, 1), (64, 768))


@pytest.mark.parametrize("case", ["aligned", "small", "float32", "bias", "gelu argument", "batched"])
def test_products_that_gain_nothing_or_read_vectors_of_their_length_are_not_padded(case):
    x, w, logits = _head(64 if case == "aligned" else 63, rows=512 if case == "small" else 8192,
                         dtype="float32" if case == "float32" else "bfloat16")
    if case == "bias":
        logits = gemm(x, w, transpose_b=True, epilogue="bias", bias=ct.var("b", (63,), "bfloat16"))
    if case == "gelu argument":
        logits = gemm(x, w, transpose_b=True, epilogue="gelu_aux")
    if case == "batched":
        logits = gemm(ct.var("xs", (4, 2048, 768), "bfloat16"), w, transpose_b=True)
    strides = _strides(*logits.args)
    assert gemm_target.gemm_padding(logits, strides) is None and _result(logits, strides) is None
    assert all(len(copy) == 2 for copy in gemm_target.gemm_copies(logits, strides))


def test_only_the_dimensions_some_operand_or_the_product_holds_along_its_rows_are_padded():
    x, dy = ct.var("x", (4092, 768), "bfloat16"), ct.var("dy", (4092, 3072), "bfloat16")
    w = ct.var("w", (768, 3072), "bfloat16")
    forward = gemm(x, w)  # 4092 rows of x and of the product: no row is short
    assert gemm_target.gemm_padding(forward, _strides(x, w)) is None
    weight_gradient = gemm(x, dy, transpose_a=True)  # 4092 products a sum, taken down the columns of both operands
    assert gemm_target.gemm_padding(weight_gradient, _strides(x, dy)) is None
    transposed = ct.var("xt", (768, 4092), "bfloat16")  # the same operand stored transposed holds 4092 along its rows
    padded = gemm(transposed, dy, transpose_a=False)
    assert gemm_target.gemm_padding(padded, _strides(transposed, dy)) == (768, 3072, 4096)
    assert _result(padded, _strides(transposed, dy)) is None  # its rows of 3072: in place
    as_read = {x: (1, 4092), dy: (3072, 1)}  # x read where it lies transposed: the rows cuBLASLt reads are of 4092
    assert gemm_target.gemm_padding(weight_gradient, as_read) == (768, 3072, 4096)


def test_a_product_of_few_sums_for_its_copies_bytes_is_not_padded():
    token, w = ct.var("token", (1, 4096), "bfloat16"), ct.var("w", (50257, 4096), "bfloat16")
    one = gemm(token, w, transpose_b=True)  # a head applied to one token: 206M multiply-adds, the 411 MB weight copied
    assert gemm_target.gemm_padding(one, _strides(token, w)) is None
    tokens = ct.var("tokens", (8192, 768), "bfloat16")
    head = gemm(tokens, ct.var("w2", (50257, 768), "bfloat16"), transpose_b=True)  # GPT-2's head on a batch
    assert gemm_target.gemm_padding(head, _strides(*head.args)) == (8192, 50264, 768)


def test_under_padding_an_operand_whose_rows_are_not_whole_vectors_apart_is_copied():
    x, w, logits = _head(50257)
    cropped = {x: (770, 1), w: (768, 1)}  # x a crop of rows of 770: 1540 bytes apart
    assert gemm_target.gemm_copies(logits, cropped) == ((x, (768, 1), (8192, 768)), (w, (768, 1), (50264, 768)))
    whole = ct.var("whole", (50264, 768), "bfloat16")
    unpadded = gemm(x, whole, transpose_b=True)
    assert gemm_target.gemm_copies(unpadded, {**cropped, whole: (768, 1)}) == ()  # cuBLASLt reads it where it lies


def test_a_padded_copy_writes_its_zeros_and_takes_the_padded_bytes(monkeypatch):
    monkeypatch.setattr(copies, "prepare", lambda source: None)
    padded = copies.Copy((8192, 63), np.dtype("float16"), (63, 1), (64, 1), (8192, 64))
    assert padded.pads and padded.nbytes == 8192 * 64 * 2
    assert f"i < {8192 * 64};" in padded.kernel.text  # every element of the padded block, the zeros too
    packed = copies.Copy((8192, 63), np.dtype("float16"), (64, 1))  # a padded product packed
    assert not packed.pads and packed.nbytes == 8192 * 63 * 2 and packed.kernel is not None
    a = ct.var("a", (63, 768), "float16")
    staged, reads, top = copies.staged([(a, (768, 1), (64, 768))], {a: (768, 1)}, 256)
    assert top == 64 * 768 * 2 and staged[0][2].pads and reads[a] == (768, 1)


def test_a_padded_products_workspace_holds_its_padded_copies_its_padded_product_and_the_librarys_own(monkeypatch):
    from cortado.compiler import Kernel
    from cortado.backends.cupy.targets import View
    from cortado.backends.cupy.targets.library import LibraryCall

    monkeypatch.setattr(copies, "prepare", lambda source: None)
    x, w, logits = _head(63)
    strides = {**_strides(x, w), logits: contiguous_strides(logits.shape)}
    view = View(strides, {}, lambda t: False, frozenset(), {"tf32": False, "deterministic": True})

    class Library:
        workspace_bytes = 4096

    call = LibraryCall(Kernel((logits,), (x, w)), view, gemm_target.gemm_copies(logits, strides), lambda reads: Library(),
                       None, written=(logits, *_result(logits, strides)))
    assert call.workspace_bytes == 64 * 768 * 2 + 8192 * 64 * 2 + 4096  # w's copy, the padded product, cuBLASLt's
    assert call.describe().endswith("operands copied padded with zeros to whole 16-byte vectors; "
                                    "product written padded, then packed")
