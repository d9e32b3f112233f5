"""pipeline/measurement/torch_peer.py: the torch peer's engines, less those built for another CPU architecture."""

import platform

import pytest
import torch

from pipeline.measurement import torch_peer

X86_LISTING = ["qnnpack", "onednn", "x86", "fbgemm"]  # what torch's x86 builds list, less "none"


@pytest.mark.parametrize("machine", ["x86_64", "AMD64"])
def test_on_an_x86_cpu_arms_engine_is_left_out_with_why(machine):
    left_out = torch_peer.engines_left_out(machine, X86_LISTING)
    assert list(left_out) == ["qnnpack"] and "ARM" in left_out["qnnpack"] and "SSE2" in left_out["qnnpack"]


def test_on_an_arm_cpu_every_listed_engine_is_searched():
    assert torch_peer.engines_left_out("aarch64", ["qnnpack", "onednn"]) == {}
    assert torch_peer.engines_left_out("arm64", ["qnnpack"]) == {}


def test_an_engine_is_never_left_out_when_it_is_the_only_one():
    assert torch_peer.engines_left_out("x86_64", ["qnnpack"]) == {}


def test_the_engines_searched_here_are_torchs_less_those_left_out():
    listed = [engine for engine in torch.backends.quantized.supported_engines if engine != "none"]
    engines, left_out = torch_peer.torch_engines(), torch_peer.engines_left_out()
    assert engines and set(engines) | set(left_out) == set(listed) and not set(engines) & set(left_out)
    if platform.machine().lower() in torch_peer.X86_MACHINES and len(listed) > 1:
        assert "qnnpack" not in engines
    for engine in engines:  # each one this machine searches packs and runs a quantized Linear layer
        quantized = torch_peer.torch_dynamic_int8(torch.nn.Sequential(torch.nn.Linear(8, 4)), engine)
        assert isinstance(quantized[0], torch.ao.nn.quantized.dynamic.Linear)
        assert quantized(torch.ones(2, 8)).shape == (2, 4)
