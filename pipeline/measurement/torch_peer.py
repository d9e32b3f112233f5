"""The torch peer, torch.ao's dynamic int8: quantized in the process that times it, because a dynamically quantized
torch model lives only in memory (export_peers records its size on each engine, the benchmark's workers time it).

torch is imported only when a function is called: the DAG's planning imports pipeline.export.peers, which imports
this module.
"""

from __future__ import annotations

import platform

TORCH_DYNAMIC_INT8 = "int8-dynamic"  # the precision of the torch peer's benchmark entries

X86_MACHINES = ("x86_64", "amd64", "x86", "i386", "i686")  # platform.machine() on an x86 CPU
# Engines built for another CPU architecture than this machine's, which torch nonetheless lists, and why none of them
# can be the fastest here. qnnpack (QNNPACK) is torch's engine for ARM phones: its x86 kernels go no further than
# SSE2, and in the engine search of every reference run on the AMD EPYC with AVX2 only it took 3.4 to 3.5 times as
# long as each x86 engine (919-961 ms against 264-303 ms, DistilBERT at 384 tokens, 1 thread). On an ARM machine it
# is the engine there is, and it is searched.
OTHER_ARCHITECTURE_ENGINES = {
    "qnnpack": "torch's ARM engine (QNNPACK): on an x86 CPU its kernels stop at SSE2, and each x86 engine torch "
               "lists (x86, fbgemm, onednn) ran over 3 times faster in the reference runs on an AMD EPYC with AVX2 "
               "only",
}


def listed_engines() -> list[str]:
    """The quantized engines this torch build lists (x86, fbgemm, onednn, qnnpack, ...)."""
    import torch

    return [engine for engine in torch.backends.quantized.supported_engines if engine != "none"]


def engines_left_out(machine: str | None = None, listed: list[str] | None = None) -> dict[str, str]:
    """Of the `listed` engines (listed_engines()), those not searched on this CPU architecture (`machine`:
    platform.machine()), with why: OTHER_ARCHITECTURE_ENGINES on an x86 CPU, none elsewhere, and none where no other
    engine would be left."""
    listed = listed_engines() if listed is None else listed
    if (machine or platform.machine()).lower() not in X86_MACHINES:
        return {}
    left_out = {engine: why for engine, why in OTHER_ARCHITECTURE_ENGINES.items() if engine in listed}
    return left_out if set(listed) - set(left_out) else {}


def torch_engines() -> list[str]:
    """The quantized engines the torch peer is sized and timed on: those this torch build lists, less the ones built
    for another CPU architecture (engines_left_out)."""
    listed = listed_engines()
    left_out = engines_left_out(listed=listed)
    return [engine for engine in listed if engine not in left_out]


def torch_dynamic_int8(model, engine: str, inplace: bool = False):
    """`model` (a copy unless inplace) with every Linear layer dynamically quantized to qint8, its weights packed
    for `engine`."""
    import torch

    torch.backends.quantized.engine = engine  # the weights are packed for the engine set when quantizing
    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=inplace)
