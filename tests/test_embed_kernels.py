"""The encoder's native CPU kernels (engine/embed/csrc/) against torch's own ops.

They run where a C compiler and AVX2 + FMA are present (else the encoder keeps its torch path,
tested by forcing it below); vectors must stay within the embedding oracle's 1e-5 cosine
distance, so the kernels are held to float32 rounding against float64 references.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from jobrunner.config import ModelConfig
from jobrunner.engine.embed import native
from jobrunner.engine.embed.encoder import PackedBert
from jobrunner.engine.loader import load_model

needs_kernels = pytest.mark.skipif(not native.usable(), reason="no C compiler or no AVX2+FMA")
LENS = [1, 2, 3, 7, 8, 9, 16, 31, 64, 100, 257]  # tails of every width, a run of one length


def reference_attention(qkv, bias, lens, nh, hd):  # SDPA, one sequence at a time
    out, row = [], 0
    for n in lens:
        x = (qkv[row : row + n] + bias).view(n, 3, nh, hd).permute(1, 2, 0, 3)
        out.append(F.scaled_dot_product_attention(x[0], x[1], x[2]).transpose(0, 1))
        row += n
    return torch.cat(out).reshape(sum(lens), nh * hd)


@needs_kernels
@pytest.mark.parametrize("nh,hd", [(12, 32), (6, 64), (2, 24)])
def test_varlen_attention_equals_sdpa_on_each_sequence_alone(nh, hd):
    torch.manual_seed(0)
    lens = sorted(LENS + [9, 9])
    qkv = torch.randn(sum(lens), 3 * nh * hd) * 2
    bias = torch.randn(3 * nh * hd)
    offsets = torch.tensor([0, *lens]).cumsum(0)
    got = native.varlen_attention(qkv, bias, offsets, nh, hd)
    want = reference_attention(qkv.double(), bias.double(), lens, nh, hd)
    torch_f32 = reference_attention(qkv, bias, lens, nh, hd).float()  # torch's own rounding
    assert got is not None and got.shape == want.shape
    bar = (torch_f32.double() - want).abs().max()
    assert (got.double() - want).abs().max() <= 2 * bar


@needs_kernels
def test_varlen_attention_refuses_a_head_dim_it_does_not_vectorise():
    qkv, bias = torch.randn(5, 3 * 2 * 12), torch.zeros(3 * 2 * 12)
    assert native.varlen_attention(qkv, bias, torch.tensor([0, 5]), 2, 12) is None


@needs_kernels
def test_bias_gelu_equals_torch_exact_gelu():
    torch.manual_seed(0)
    x = torch.randn(37, 1536) * 4
    x[0, :8] = torch.tensor([-30.0, -9.0, -0.0, 0.0, 1e-6, 3.0, 9.0, 30.0])
    bias = torch.randn(1536)
    want = F.gelu((x + bias).double())
    assert native.bias_gelu_(x, bias)
    assert (x.double() - want).abs().max() < 1e-5


@needs_kernels
def test_residual_layer_norm_equals_torch_layer_norm_in_place():
    torch.manual_seed(0)
    y, h = torch.randn(29, 384) * 3, torch.randn(29, 384)
    bias = torch.randn(384)
    norm = torch.nn.LayerNorm(384, eps=1e-12)
    torch.nn.init.normal_(norm.weight), torch.nn.init.normal_(norm.bias)
    with torch.no_grad():
        want = F.layer_norm(
            (y + bias + h).double(), (384,), norm.weight.double(), norm.bias.double(), 1e-12
        )
        assert native.residual_layer_norm_(y, bias, h, norm)
    assert (h.double() - want).abs().max() < 1e-5


@pytest.fixture(scope="module")
def minilm():
    return load_model(ModelConfig(source="all-minilm-l6-v2", dtype="float32"))


@needs_kernels
def test_packed_bert_native_layers_equal_its_torch_path(minilm):
    """Long and short sequences in one batch (up to the model's 256 positions)."""
    rng = torch.Generator().manual_seed(0)
    lens = [2, 3, 17, 17, 40, 128, 256]
    seqs = [[101, *torch.randint(1000, 30000, (n - 2,), generator=rng).tolist(), 102] for n in lens]
    seqs.insert(0, [101])
    bert = PackedBert(minilm.model)
    assert bert.native
    fast = bert.embed(seqs, "mean")
    bert.native = False
    slow = bert.embed(seqs, "mean")
    assert (1 - F.cosine_similarity(fast.double(), slow.double())).max() < 1e-6
