"""Export libraries: ONNX graphs, quantized graphs, CoreML packages, full-size architectures. The export stages
read their inputs, call these and write their outputs."""
