"""The torch peer, torch.ao's dynamic int8: quantized in the process that times it, because a dynamically quantized
torch model lives only in memory (export_peers records its size on each engine, the benchmark's workers time it).

torch is imported only when a function is called: the DAG's planning imports pipeline.export.peers, which imports
this module.
"""

from __future__ import annotations

TORCH_DYNAMIC_INT8 = "int8-dynamic"  # the precision of the torch peer's benchmark entries


def torch_engines() -> list[str]:
    """The quantized engines this torch build can run (x86, fbgemm, onednn, qnnpack, ...)."""
    import torch

    return [engine for engine in torch.backends.quantized.supported_engines if engine != "none"]


def torch_dynamic_int8(model, engine: str, inplace: bool = False):
    """`model` (a copy unless inplace) with every Linear layer dynamically quantized to qint8, its weights packed
    for `engine`."""
    import torch

    torch.backends.quantized.engine = engine  # the weights are packed for the engine set when quantizing
    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=inplace)
