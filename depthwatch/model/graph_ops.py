"""Whether an ONNX file's graph is quantized already, read from its nodes without loading the model.

A model that comes quantized (QDQ pairs around its convolutions, QLinear or
Integer operators, int8 weights) runs in int8 whatever depthwatch asks of the
runtime: "fp32" there means "the graph as it is", and saying fp32 to a user
would be untrue. The answer is read the way `graph_inputs` reads the input's
shape: the protobuf's fields walked, every weight's bytes skipped, so it costs
a few reads of a file of any size and no import of the `onnx` package.
"""

from __future__ import annotations

from pathlib import Path

from depthwatch.model.graph_inputs import fields, graph_fields

# Field numbers from onnx.proto.
_GRAPH_NODE, _GRAPH_INITIALIZER = 1, 5
_NODE_OP_TYPE = 4
_TENSOR_DATA_TYPE = 2
#: TensorProto data types that only a quantized graph holds as weights: INT8, UINT4, INT4.
_QUANTIZED_TYPES = {3, 21, 22}
#: Operators that carry quantized values, beyond the QLinear* and *Integer families.
_QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QGemm", "QAttention", "MatMulNBits"}


def quantized_op(op_type: str) -> bool:
    """Whether operator `op_type` works on quantized values (QDQ, QLinear*, *Integer and the like)."""
    return op_type in _QUANTIZED_OPS or op_type.startswith("QLinear") or op_type.endswith("Integer")


def quantized(path: Path) -> bool:
    """Whether the graph in `path` is quantized: a quantized operator, or a weight of an integer type under 16 bits.

    Raises OSError, ValueError or EOFError for a file that cannot be read as a model.
    """
    with path.open("rb") as f:
        for field, item_len, at in graph_fields(f):
            if field == _GRAPH_NODE:
                for inner, value, where in fields(f, at + item_len):
                    if inner == _NODE_OP_TYPE and quantized_op(f.read(value).decode("utf-8", "replace")):
                        return True
            elif field == _GRAPH_INITIALIZER:
                for inner, value, where in fields(f, at + item_len):
                    if inner == _TENSOR_DATA_TYPE and value in _QUANTIZED_TYPES:
                        return True
    return False
