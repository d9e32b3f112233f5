"""OpenVINO checks the tests run in a spawned process (pipeline.spawn), as the stages run OpenVINO. They live in a
module of their own that imports nothing heavy at its top: a spawned process imports the module of the function it
runs, and a test module's imports (torch, transformers, the stages) took about 4 CPU-seconds each time."""

from __future__ import annotations

from pathlib import Path


def openvino_precision(path: Path) -> str:
    """What the default precision hint resolves to for the OpenVINO model at `path`."""
    from pipeline.runtime.openvino_session import OpenVinoSession

    return OpenVinoSession(path, 1).precision


def openvino_model_with_negated_logits(onnx_path: Path, xml_path: Path) -> None:
    """The fp32 graph at `onnx_path` with both outputs negated, saved as an OpenVINO model at `xml_path` (replacing
    it): it loads and answers, but not as the model does."""
    import onnx
    import openvino

    model = onnx.load(str(onnx_path))
    for output in model.graph.output:
        for node in model.graph.node:
            node.output[:] = [f"{name}_raw" if name == output.name else name for name in node.output]
        model.graph.node.append(onnx.helper.make_node("Neg", [f"{output.name}_raw"], [output.name]))
    negated = xml_path.parent / "negated.onnx"
    onnx.save(model, str(negated))
    openvino.save_model(openvino.convert_model(negated), xml_path, compress_to_fp16=False)
    negated.unlink()


def openvino_against_onnxruntime(openvino_path: Path, onnx_path: Path) -> dict:
    """Per precision of pipeline.export.peers.OPENVINO_PRECISIONS: what the hint resolved to and the largest logit
    difference from onnxruntime on the ONNX graph; and OpenVINO's profile at f32."""
    import numpy as np

    from pipeline.export import peers
    from pipeline.measurement.latency import onnx_session, synthetic_feed
    from pipeline.runtime.openvino_session import OpenVinoSession

    fp32, found = onnx_session(onnx_path, 1), {}
    for precision in peers.OPENVINO_PRECISIONS:
        try:
            session = OpenVinoSession(openvino_path, 1, precision)
        except RuntimeError as error:  # the CPU plugin refuses the model at this precision on this machine
            found[precision] = {"refused": [line for line in str(error).splitlines() if line.strip()][-1]}
            continue
        feed = synthetic_feed(session, 48, 200)
        pairs = list(zip(fp32.run(None, feed), session.run(None, feed)))
        found[precision] = {"resolved": session.precision, "shapes_equal": all(a.shape == b.shape for a, b in pairs),
                            "error": max(float(np.abs(a - b).max()) for a, b in pairs),
                            "scale": max(float(np.abs(a).max()) for a, _ in pairs)}
    found["profile"] = peers.openvino_profile(openvino_path, "f32", 48, 200, runs=2)
    return found
