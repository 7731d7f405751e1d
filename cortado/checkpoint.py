"""Checkpoints: a program's state (parameters, optimizer moments, step counts) to and from safetensors files.

    ct.save(step, "run.safetensors")          # every state variable, by name
    ct.load(step, "run.safetensors")          # into a program of the same state: it continues bit for bit
    ct.load_state_dict(step, torch_model.state_dict())   # a PyTorch model's weights, by name
    ct.state_dict(step, model)                           # and back: {name: array}, as PyTorch names them

The file format is safetensors' (an 8-byte header length, a JSON header naming each tensor's dtype, shape and byte
range, then the bytes), written and read here with NumPy, so the files open with ``safetensors`` and
``safetensors.torch`` too, bfloat16 included.
"""

import json
import math
import os
import struct
from collections.abc import Mapping

import numpy as np

from .errors import FeedError
from .exprgraph.dtypes import BFLOAT16, as_dtype, is_float

_CODES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "float16": "F16",
          "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32", "float64": "F64", "int64": "I64",
          "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
_DTYPES = {code: name for name, code in _CODES.items()}
ALIGNMENT = 8  # the header is padded with spaces to a multiple of this, as safetensors pads it


def write(path, arrays, metadata=None):
    """Write ``arrays`` (``{name: array}``, NumPy or CuPy) to a safetensors file at ``path``, with string
    ``metadata``; atomically (a partial file never has the name)."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, array in arrays.items():
        host = np.array(_host(array), order="C", copy=None)  # 0-d stays 0-d (ascontiguousarray makes it 1-d)
        if host.dtype.name not in _CODES:
            raise FeedError(f"a checkpoint stores {', '.join(_CODES)}; {name!r} is {host.dtype}")
        data = host.astype(host.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _CODES[host.dtype.name], "shape": list(host.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % ALIGNMENT)
    if os.path.isdir(path):
        raise FeedError(f"{path} is a directory; a checkpoint is a file (run.safetensors)")
    temporary = f"{path}.{os.getpid()}.partial"
    try:
        with open(temporary, "wb") as file:
            file.write(struct.pack("<Q", len(text)))
            file.write(text)
            for chunk in chunks:
                file.write(chunk)
        os.replace(temporary, path)
    finally:  # a write that failed leaves no partial file behind
        if os.path.exists(temporary):
            os.remove(temporary)


def read(path):
    """``(arrays, metadata)`` of the safetensors file at ``path``: ``{name: NumPy array}`` in the file's order."""
    with open(path, "rb") as file:
        raw = file.read()
    if len(raw) < 8:
        raise FeedError(f"{path} is not a safetensors file: {len(raw)} bytes")
    (size,) = struct.unpack("<Q", raw[:8])
    try:
        header = json.loads(raw[8:8 + size])
    except ValueError as error:
        raise FeedError(f"{path} is not a safetensors file: its header does not parse ({error})") from None
    if not isinstance(header, dict):
        raise FeedError(f"{path} is not a safetensors file: its header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {}) or {}
    body = memoryview(raw)[8 + size:]
    malformed = [name for name, entry in header.items() if not _well_formed(entry)]
    if malformed:
        raise FeedError(f"{path}: the header's entries for {malformed} lack a dtype, shape or two data offsets")
    arrays, covered = {}, 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        code = entry.get("dtype")
        if code not in _DTYPES or (code in ("BF16", "F8_E4M3", "F8_E5M2") and BFLOAT16 is None):  # ml_dtypes' own
            raise FeedError(f"{path}: {name!r} is stored as {code}, which cortado does not read")
        begin, end = entry["data_offsets"]
        dtype = as_dtype(_DTYPES[code]).newbyteorder("<")
        shape = tuple(entry["shape"])
        if begin != covered or end - begin != math.prod(shape) * dtype.itemsize or end > len(body):
            raise FeedError(f"{path}: {name!r}'s bytes {begin}..{end} do not hold a {code} array of shape {shape} "
                            f"after the {covered} bytes before it")
        covered = end
        arrays[name] = np.frombuffer(body[begin:end], dtype).reshape(shape).astype(dtype.newbyteorder("="))
    if covered != len(body):
        raise FeedError(f"{path}: {len(body) - covered} bytes after the last tensor belong to none")
    return {name: arrays[name] for name in header}, metadata


def _well_formed(entry):
    """Whether a header's entry names a dtype, a shape of sizes and two byte offsets."""
    def naturals(values):
        return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in values)

    return (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and naturals(entry.get("shape"))
            and naturals(entry.get("data_offsets")) and len(entry["data_offsets"]) == 2)


def _program(program, what):
    """``program``, where it is a compiled program: what has a state to save or load."""
    from .program import Program

    if not isinstance(program, Program):
        raise FeedError(f"{what} takes a compiled program (what ct.compile returns), not {type(program).__name__}")
    return program


def save(program, path, metadata=None):
    """Write ``program``'s state (every state variable, by name) to the safetensors file ``path``."""
    _program(program, "ct.save")
    write(path, {name: program.state[name] for name in program.state}, metadata)


def load(program, path):
    """Read the safetensors file ``path`` into ``program``'s state: every state variable must be in the file with
    its shape and dtype (as ``save`` wrote it), and the file must hold nothing else."""
    _program(program, "ct.load")
    arrays, _ = read(path)
    missing = sorted(set(program.state) - set(arrays))
    extra = sorted(set(arrays) - set(program.state))
    if missing or extra:
        hint = "" if missing else (" (a training step's checkpoint for a program of fewer state variables, an "
                                   "inference program: ct.load_state_dict(program, cortado.checkpoint.read(path)[0], "
                                   "strict=False) sets the names both have)")
        raise FeedError(f"{path} does not match the program's state: " + "; ".join(
            part for part in (f"missing {missing}" if missing else "", f"not in the program {extra}" if extra else "")
            if part) + hint)
    for name, array in arrays.items():
        _assign(program, name, array, path, same_dtype=True)


def load_state_dict(program, state_dict, strict=True, model=None):
    """Set ``program``'s state from ``state_dict`` (``{name: array}``: a PyTorch ``state_dict()``, NumPy or CuPy
    arrays), by name: each value must have its variable's shape; it is converted to the variable's dtype. With
    ``strict``, every name in the dict must be a state variable of the program, and, given the ``model``
    (a ``cortado.nn`` module), every parameter and buffer of the model must be in the dict, as PyTorch's
    ``load_state_dict`` checks, but buffers PyTorch's layers do not have (``Buffer.ours``: a dropout's random
    stream, a float8 layer's amax histories), which keep their values; otherwise only the names both have are set.
    A value its variable's dtype cannot hold (an int out of range, a NaN or a fraction for an int, a finite float
    beyond a narrower float's range) is refused, not wrapped or rounded to infinity. Returns the names set."""
    _program(program, "ct.load_state_dict")
    if not isinstance(state_dict, Mapping) or not all(isinstance(name, str) for name in state_dict):
        raise FeedError(f"a state_dict maps names to arrays (model.state_dict()), not {type(state_dict).__name__}"
                        + ("" if isinstance(state_dict, Mapping) else " (dict(pairs) makes one of pairs)"))
    names = [name for name in state_dict if name in program.state]
    if strict:
        extra = sorted(set(state_dict) - set(program.state))
        missing = sorted(set(_pytorchs_names(model)) - set(state_dict)) if model is not None else []
        if extra or missing:
            raise FeedError("state_dict " + "; ".join(part for part in (
                f"names {extra}, which the program's state does not have" if extra else "",
                f"lacks {missing}, of the model" if missing else "") if part)
                + " (strict=False sets the names both have)")
    if state_dict and not names:  # strict=False matched nothing: a prefix (DataParallel's "module."), another model
        raise FeedError(f"state_dict: none of its names ({', '.join(sorted(state_dict)[:3])}, ...) is a state variable "
                        f"of the program ({', '.join(sorted(program.state)[:3])}, ...); nothing was set")
    for name in names:
        _assign(program, name, _numpy(state_dict[name]), "the state_dict", same_dtype=False)
    return names


def state_dict(program, model):
    """The ``model``'s parameters and buffers as ``program`` holds them, ``{name: NumPy array}`` by the names PyTorch
    gives them (those of its layers that PyTorch's have: not ``Buffer.ours``), the inverse of
    ``load_state_dict(program, ..., model=model)``: ``torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in
    ct.state_dict(step, model).items()})`` (PyTorch converts each to its tensor's dtype as it copies it)."""
    _program(program, "ct.state_dict")
    names = _pytorchs_names(model)
    missing = [name for name in names if name not in program.state]
    if missing:
        raise FeedError(f"ct.state_dict: the program's state has no {missing[:3]}{' ...' if len(missing) > 3 else ''} "
                        f"of the model; was the program compiled with model.initial_values()?")
    return {name: _host(program.state[name]).copy() for name in names}


def _pytorchs_names(model):
    """The names of ``model``'s parameters and of its buffers that PyTorch's layers have too (not ``Buffer.ours``)."""
    return list(model.parameters()) + [name for name, b in model.named_buffers() if not b.ours]


def _assign(program, name, array, source, same_dtype):
    current = program.state[name]
    if tuple(array.shape) != tuple(current.shape):
        raise FeedError(f"{source}: {name!r} has shape {tuple(array.shape)}; the program's is {tuple(current.shape)}")
    if same_dtype and array.dtype != current.dtype:
        raise FeedError(f"{source}: {name!r} is {array.dtype}; the program's is {current.dtype}")
    program.state[name] = _converted(array, current.dtype, f"{source}: {name!r}")


def _converted(array, dtype, what):
    """``array`` as ``dtype``, where every value survives: an int in range (of either sign), a float of an int's whole
    value, a finite float still finite and an infinite one still infinite in a narrower float (rounding aside)."""
    if array.dtype == dtype:
        return array
    if array.dtype.kind == "c":
        raise FeedError(f"{what} is complex ({array.dtype}); the program's is {dtype}")
    with np.errstate(all="ignore"):
        converted = array.astype(dtype)
        if is_float(dtype):
            wide, narrow = np.asarray(array).astype(np.float64), converted.astype(np.float64)
            lost = (np.isfinite(wide) & ~np.isfinite(narrow)) | (np.isinf(wide) & ~np.isinf(narrow))
        elif dtype.kind in "iu" and array.dtype.kind in "iub":
            info = np.iinfo(dtype)
            lost = (array < info.min) | (array > info.max)
        else:
            lost = converted.astype(array.dtype) != array
    if np.any(lost):
        where = tuple(int(i) for i in np.argwhere(lost)[0])
        raise FeedError(f"{what} holds {np.asarray(array)[where].item()!r} at {where}, which {dtype} cannot hold")
    return converted


def _host(array):
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else np.asarray(array)


def _numpy(value):
    """A NumPy array of ``value``: a torch tensor (bfloat16 by its bits), a CuPy or NumPy array."""
    if hasattr(value, "detach"):  # torch, without importing it
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":  # NumPy has no bfloat16 of torch's: read its bits
            import torch

            return tensor.view(torch.int16).numpy().view(BFLOAT16)
        return tensor.numpy()
    return _host(value)
