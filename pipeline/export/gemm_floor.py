"""The GEMM floor: an ONNX graph of only an int8 graph's MatMulInteger nodes, with its weights and shapes.

Timed like the model (rule benchmark), model latency / floor says how close the model runs to this machine's int8
matrix-multiply speed.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from pipeline.errors import PipelineError


class GemmFloorError(PipelineError, ValueError):
    """An int8 graph with no stored-weight MatMulInteger to build a floor from."""


ACTIVATION_ZERO_POINT = 128  # what dynamic quantization gives uint8 activations of data centred on 0


def gemm_floor_graph(int8_model_path: Path, sequence_length: int, out_path: Path) -> int:
    """An ONNX graph of only the model's MatMulInteger nodes with its own weights, fed batch-1 activations of
    `sequence_length` tokens; returns how many there are."""
    model = onnx.load(str(int8_model_path))
    initializers = {init.name: init for init in model.graph.initializer}
    nodes, inputs, outputs, used = [], {}, [], {}
    for node in model.graph.node:
        if node.op_type != "MatMulInteger" or node.input[1] not in initializers:
            continue
        weight = initializers[node.input[1]]
        in_features = weight.dims[0]
        activation = f"activation_{in_features}"
        if activation not in inputs:
            inputs[activation] = helper.make_tensor_value_info(activation, TensorProto.UINT8, [1, sequence_length,
                                                                                               in_features])
        for name in node.input[1:]:
            if name and name in initializers:
                used[name] = initializers[name]
        output = f"product_{len(nodes)}"
        nodes.append(helper.make_node("MatMulInteger", [activation, node.input[1], "activation_zero_point",
                                                        node.input[3] if len(node.input) > 3 else ""], [output]))
        outputs.append(helper.make_tensor_value_info(output, TensorProto.INT32, None))
    if not nodes:
        raise GemmFloorError(f"{int8_model_path}: no MatMulInteger node with a stored weight, no GEMM floor to build")
    zero_point = helper.make_tensor("activation_zero_point", TensorProto.UINT8, [], [ACTIVATION_ZERO_POINT])
    graph = helper.make_graph(nodes, "gemm_floor", list(inputs.values()), outputs,
                              initializer=list(used.values()) + [zero_point])
    floor = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    floor.ir_version = model.ir_version
    onnx.save(floor, str(out_path))
    return len(nodes)
