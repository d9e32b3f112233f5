"""The float16 arithmetic of the CoreML gate's PyTorch-side proxy (pipeline/export/coreml.py: Float16Products): every
product accumulates in float32 and rounds its result to float16, as torch's CPU float16 kernels do, and every other op
runs in float16 as it would without it."""

import pytest
import torch
import torch.nn.functional as F

from pipeline.export.coreml import Float16Products


def operands(*shapes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=generator) * 0.5).half() for shape in shapes]


def additive_mask(batch, keys):
    mask = torch.zeros(batch, 1, 1, keys)
    mask[..., keys * 3 // 4:] = -1.0e4  # the padding of coreml.MASKED_SCORE
    return mask.half()


PRODUCTS = {
    "linear": (F.linear, lambda: operands((64, 96, 64), (256, 64), (256,))),
    "linear without bias": (F.linear, lambda: operands((64, 96, 64), (256, 64))),
    "1x1 convolution": (F.conv2d, lambda: operands((8, 64, 1, 96), (256, 64, 1, 1), (256,))),
    "depthwise convolution": (lambda x, w, b: F.conv2d(x, w, b, groups=64),
                              lambda: operands((8, 64, 1, 96), (64, 1, 1, 1), (64,))),
    "einsum": (lambda q, k: torch.einsum("bchq,bkhc->bkhq", q, k), lambda: operands((8, 16, 1, 96), (8, 96, 1, 16))),
    "matmul": (torch.matmul, lambda: operands((8, 4, 96, 16), (8, 4, 16, 96))),
    "@": (lambda a, b: a @ b, lambda: operands((8, 4, 96, 16), (8, 4, 16, 96))),
    "bmm": (torch.bmm, lambda: operands((32, 96, 16), (32, 16, 96))),
    "attention": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                  lambda: operands((8, 4, 96, 16), (8, 4, 96, 16), (8, 4, 96, 16)) + [additive_mask(8, 96)]),
}


@pytest.mark.parametrize("name", PRODUCTS)
def test_a_product_accumulates_in_float32_and_rounds_to_float16(name):
    product, make_operands = PRODUCTS[name]
    inputs = make_operands()
    with torch.no_grad(), Float16Products():
        found = product(*inputs)
    with torch.no_grad():
        in_float32 = product(*[value.float() for value in inputs]).half()
        native = product(*inputs)  # torch's own float16 kernel
    assert found.dtype == torch.float16
    assert torch.equal(found, in_float32)
    # torch's own float16 kernels sum in float32 too, in another order: a few float16 steps apart at most
    scale = native.float().abs().max()
    assert (found.float() - native.float()).abs().max() <= scale * 2 ** -8


def test_other_ops_run_in_float16_as_without_it():
    x, = operands((8, 96, 64))
    steps = [lambda t: t.softmax(dim=-1), lambda t: F.gelu(t), lambda t: F.layer_norm(t, (64,)), lambda t: t + t * 3,
             lambda t: t.mean(dim=1)]
    for step in steps:
        with Float16Products():
            found = step(x)
        expected = step(x)
        assert found.dtype == torch.float16 and torch.equal(found, expected)


def test_float32_products_are_left_as_they_are():
    x, w = [value.float() for value in operands((64, 96, 64), (256, 64))]
    with Float16Products():
        found = F.linear(x, w)
    assert found.dtype == torch.float32 and torch.equal(found, F.linear(x, w))
