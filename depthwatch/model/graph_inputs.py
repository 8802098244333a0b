"""The image input's declared shape, read from the ONNX file without loading the model.

CoreML, told to take only nodes whose input shapes are static, takes nothing
from a graph whose batch dimension is symbolic ("batch_size"), though
depthwatch always feeds a batch of one. onnxruntime can pin a symbolic
dimension (`add_free_dimension_override_by_name`), but only by name, and the
names are needed before the session exists. Loading the model once more just
to read them would cost as much memory as the model; instead this walks the
protobuf's fields and seeks past everything but the graph's inputs (weights
included), so it reads a few kilobytes of a file of any size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

# Field numbers from onnx.proto.
_MODEL_GRAPH = 7
_GRAPH_INPUT = 11
_VALUE_NAME, _VALUE_TYPE = 1, 2
_TYPE_TENSOR = 1
_TENSOR_SHAPE = 2
_SHAPE_DIM = 1
_DIM_VALUE, _DIM_PARAM = 1, 2



def varint(f: BinaryIO) -> int:
    result = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            raise EOFError("the file ends inside a field")
        result |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return result
        shift += 7


def fields(f: BinaryIO, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, value or length, start) for each field up to `end`; length-delimited
    fields are skipped after the caller has had its look at them."""
    while f.tell() < end:
        key = varint(f)
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, varint(f), f.tell()
        elif wire == 1:
            f.seek(8, 1)
        elif wire == 5:
            f.seek(4, 1)
        elif wire == 2:
            length = varint(f)
            start = f.tell()
            yield number, length, start
            f.seek(start + length)
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _dims(f: BinaryIO, end: int) -> list[int | str | None]:
    dims: list[int | str | None] = []
    for number, length, start in fields(f, end):
        if number != _SHAPE_DIM:
            continue
        dim: int | str | None = None
        for field, value, at in fields(f, start + length):
            if field == _DIM_VALUE:
                dim = value
            elif field == _DIM_PARAM:
                dim = f.read(value).decode("utf-8", "replace")
        dims.append(dim)
    return dims


def _input(f: BinaryIO, end: int) -> tuple[str, list[int | str | None]] | None:
    name, dims = "", None
    for number, length, start in fields(f, end):
        if number == _VALUE_NAME:
            name = f.read(length).decode("utf-8", "replace")
        elif number == _VALUE_TYPE:
            for field, size, at in fields(f, start + length):
                if field != _TYPE_TENSOR:
                    continue
                for inner, shape_len, shape_at in fields(f, at + size):
                    if inner == _TENSOR_SHAPE:
                        dims = _dims(f, shape_at + shape_len)
    return (name, dims) if dims is not None else None


def graph_fields(f: BinaryIO) -> Iterator[tuple[int, int, int]]:
    """Each field of the model's graph in the open model file `f`, as `fields` gives them."""
    f.seek(0, 2)
    size = f.tell()
    f.seek(0)
    for number, length, start in fields(f, size):
        if number == _MODEL_GRAPH:
            yield from fields(f, start + length)


def declared_inputs(path: Path) -> list[tuple[str, list[int | str | None]]]:
    """Each graph input's name and dims (int, symbolic name, or None when neither)."""
    found = []
    with path.open("rb") as f:
        for field, value_len, at in graph_fields(f):
            if field == _GRAPH_INPUT:
                entry = _input(f, at + value_len)
                if entry is not None:
                    found.append(entry)
    return found


def fixed_dims(path: Path, square_side: int | None) -> dict[str, int]:
    """Symbolic dimensions of the image input to pin: the batch to 1, and height and width
    to `square_side` when depthwatch feeds one square size (None: they follow the frame).

    Empty when the file cannot be read this way; the session then keeps its dynamic shapes.
    """
    try:
        inputs = declared_inputs(path)
    except (OSError, ValueError, EOFError):
        return {}
    for _, dims in inputs:
        if len(dims) != 4:
            continue
        if dims[1] == 3:
            spatial = dims[2:]
        elif dims[3] == 3:
            spatial = dims[1:3]
        else:
            continue
        pins: dict[str, int] = {}
        if isinstance(dims[0], str) and dims[0]:
            pins[dims[0]] = 1
        if square_side:
            for dim in spatial:
                if isinstance(dim, str) and dim:
                    pins[dim] = square_side
        return pins
    return {}
