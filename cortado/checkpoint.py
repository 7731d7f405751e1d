"""Checkpoints: a program's state (parameters, optimizer moments, step counts) to and from safetensors files.

    ct.save(step, "run.safetensors")          # every state variable, by name
    ct.load(step, "run.safetensors")          # into a program of the same state: it continues bit for bit

The checks shared with ``torch_state`` (PyTorch's state_dicts) are here too: a value set into a program's state
keeps its variable's shape, and a conversion to its dtype loses no value.

The file format is safetensors' (an 8-byte header length, a JSON header naming each tensor's dtype, shape and byte
range, then the bytes), written and read here with NumPy, so the files open with ``safetensors`` and
``safetensors.torch`` too, bfloat16 included.
"""

import json
import math
import os
import struct
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
    if os.path.isdir(path):
        raise FeedError(f"{path} is a directory; a checkpoint is a file (run.safetensors)")
    folder = os.path.dirname(os.fspath(path))
    if folder and not os.path.isdir(folder):
        raise FeedError(f"{path}: there is no directory {folder} to write it in (os.makedirs({folder!r}) makes one)")
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, array in arrays.items():
        if name == "__metadata__":  # safetensors' own key: the file would read as one whose tensor is no tensor
            raise FeedError(f"{path}: a tensor cannot be named '__metadata__', the safetensors header's key for "
                            f"metadata; rename the variable")
        host = np.array(on_host(array), order="C", copy=None)  # 0-d stays 0-d (ascontiguousarray makes it 1-d)
        if host.dtype.name not in _CODES:
            raise FeedError(f"a checkpoint stores {', '.join(_CODES)}; {name!r} is {host.dtype}")
        data = host.astype(host.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _CODES[host.dtype.name], "shape": list(host.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % ALIGNMENT)
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
        if raw[:4] == b"PK\x03\x04" or raw[:1] == b"\x80":  # a zip archive or a pickle: what torch.save writes
            raise FeedError(f"{path} is not a safetensors file but a PyTorch (torch.save) file, it seems: read it "
                            f"with torch.load and give its state_dict to ct.load_state_dict (docs/training.md)") from None
        raise FeedError(f"{path} is not a safetensors file: its header does not parse ({error})") from None
    if not isinstance(header, dict):
        raise FeedError(f"{path} is not a safetensors file: its header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {}) or {}
    body = memoryview(raw)[8 + size:]
    malformed = [name for name, entry in header.items() if not _well_formed(entry)]
    if malformed:
        raise FeedError(f"{path}: the header's entries for {malformed} lack a dtype, shape or two data offsets")
    arrays, covered = {}, 0
    for name, entry in sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"])):  # empty ones first
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


def compiled_program(program, what):
    """``program``, where it is a compiled program: what has a state to save or load."""
    from .program import Program

    if not isinstance(program, Program):
        raise FeedError(f"{what} takes a compiled program (what ct.compile returns), not {type(program).__name__}")
    return program


def save(program, path, metadata=None):
    """Write ``program``'s state (every state variable, by name) to the safetensors file ``path``."""
    compiled_program(program, "ct.save")
    write(path, {name: program.state[name] for name in program.state}, metadata)


def load(program, path):
    """Read the safetensors file ``path`` into ``program``'s state: every state variable must be in the file with
    its shape and dtype (as ``save`` wrote it), and the file must hold nothing else."""
    compiled_program(program, "ct.load")
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
    checked = {name: checked_value(program, name, array, path, same_dtype=True) for name, array in arrays.items()}
    for name, array in checked.items():  # all checked first: a refused file changes nothing
        program.state[name] = array


def checked_value(program, name, array, source, same_dtype):
    """``array`` as the state variable ``name`` holds it (``source`` says where it came from, for the message): of
    its shape, and of its dtype (``same_dtype``) or converted to it without losing a value."""
    current = program.state[name]
    if tuple(array.shape) != tuple(current.shape):
        raise FeedError(f"{source}: {name!r} has shape {tuple(array.shape)}; the program's is {tuple(current.shape)}")
    if same_dtype and array.dtype != current.dtype:
        raise FeedError(f"{source}: {name!r} is {array.dtype}; the program's is {current.dtype}")
    return converted_losslessly(array, current.dtype, f"{source}: {name!r}")


def converted_losslessly(array, dtype, what):
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


def on_host(array):
    """A NumPy array of ``array``: a CuPy one copied from the device."""
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else np.asarray(array)
