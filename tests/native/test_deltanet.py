"""native/deltanet.c against the torch reference of strata.models.deltanet: the short causal
convolution with its state and the gated delta rule (grouped and tiled value heads), for a decode
token and a multi-token prefill, carried across calls; sizes checked by C."""
from __future__ import annotations

import pytest
import torch

from strata import native
from strata.errors import NativeError
from strata.models.deltanet import DeltaNetWeights, GatedDeltaNet

HK, HV, DK, DV, K = 2, 4, 16, 8, 4
C = 2 * HK * DK + HV * DV


def _net(tiled: bool) -> GatedDeltaNet:
    g = torch.Generator().manual_seed(0)
    w = DeltaNetWeights(wqkv=None, wgate=None, wba=None, conv=torch.randn(C, K, generator=g) * 0.5,
                        dt=torch.zeros(HV), a=-torch.ones(HV), norm=torch.ones(DV), wout=None)
    return GatedDeltaNet(w, HK, HV, DK, DV, 1e-6, 0, tiled=tiled)


def _inputs(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, C, generator=g), -torch.rand(n, HV, generator=g) * 0.3,
            torch.sigmoid(torch.randn(n, HV, generator=g)))


@pytest.mark.parametrize("tiled", [False, True])
def test_prefill_then_decode_equal_torch(tiled):
    """A 7-token prefill then three decode tokens: outputs and both states equal the torch path."""
    net = _net(tiled)
    conv_t, ssm_t = torch.zeros(1, K - 1, C), torch.zeros(1, HV, DK, DV)
    conv_n, ssm_n = torch.zeros(K - 1, C), torch.zeros(HV, DK, DV)
    for step, n in enumerate((7, 1, 1, 1)):
        x, g, beta = _inputs(n, step)
        want = net.recur(net.convolve(x, conv_t, 0), g, beta, ssm_t, 0)
        mixed = native.deltanet_conv(x, net.w.conv, conv_n, torch.empty(n, C))
        got = native.deltanet_recur(mixed, g, beta, ssm_n, torch.empty(n, HV, DV), HK, tiled)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(conv_n, conv_t[0], rtol=0, atol=0)
        torch.testing.assert_close(ssm_n, ssm_t[0], rtol=1e-5, atol=1e-6)
    assert ssm_n.abs().sum() > 0


def test_the_head_order_changes_the_result():
    x, g, beta = _inputs(3, 5)
    mixed = native.deltanet_conv(x, _net(False).w.conv, torch.zeros(K - 1, C), torch.empty(3, C))
    a, b = (native.deltanet_recur(mixed, g, beta, torch.zeros(HV, DK, DV), torch.empty(3, HV, DV), HK, t)
            for t in (False, True))
    assert (a - b).abs().max() > 1e-3


def test_sizes_are_checked():
    x, g, beta = _inputs(4, 1)
    w = _net(False).w.conv
    with pytest.raises(NativeError):  # a state one row short of K-1
        native.deltanet_conv(x, w, torch.zeros(K - 2, C), torch.empty(4, C))
    with pytest.raises(NativeError):  # an output shorter than the tokens
        native.deltanet_conv(x, w, torch.zeros(K - 1, C), torch.empty(3, C))
    with pytest.raises(NativeError):  # value heads not a multiple of key heads
        native.deltanet_recur(x, g, beta, torch.zeros(HV, DK, DV), torch.empty(4, HV, DV), 3, False)
    with pytest.raises(NativeError):  # g and beta of 3 tokens for 4
        native.deltanet_recur(x, g[:3].contiguous(), beta[:3].contiguous(), torch.zeros(HV, DK, DV),
                              torch.empty(4, HV, DV), HK, False)
    with pytest.raises(ValueError, match="contiguous float32"):
        native.deltanet_conv(x.double(), w, torch.zeros(K - 1, C), torch.empty(4, C))


def test_gates_norm_gate_and_attention_gate_equal_torch():
    """The elementwise parts both decode paths share (deltanet.c): beta and g, the gated RMSNorm
    and gated attention's output gate, against torch's formulas (softplus linear above 20)."""
    g = torch.Generator().manual_seed(3)
    b, a = torch.randn(3, HV, generator=g) * 4, torch.randn(3, HV, generator=g) * 4
    a[0, 0] = 30.0  # above softplus's threshold
    dt, A = torch.randn(HV, generator=g), -torch.rand(HV, generator=g)
    beta, gg = native.deltanet_gates(b, a, dt, A, torch.empty(3, HV), torch.empty(3, HV))
    torch.testing.assert_close(beta, torch.sigmoid(b), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(gg, torch.nn.functional.softplus(a + dt) * A, rtol=1e-6, atol=1e-7)
    o, zrows, norm = torch.randn(3, HV, DV, generator=g), torch.randn(3, HV * DV + 5, generator=g), torch.randn(DV, generator=g)
    z = zrows[:, 2:2 + HV * DV]  # a row-strided view, as the stacked product's z
    got = native.deltanet_norm_gate(o, z, norm, 1e-6, torch.empty(3, HV * DV))
    want = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * norm * torch.nn.functional.silu(z.reshape(3, HV, DV))
    torch.testing.assert_close(got, want.flatten(1), rtol=1e-5, atol=1e-6)
    x, gate = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    torch.testing.assert_close(native.attn_gate(x.clone(), gate), x * torch.sigmoid(gate), rtol=1e-6, atol=1e-7)


def test_gate_sizes_are_checked():
    with pytest.raises(ValueError, match="differ"):
        native.deltanet_gates(torch.zeros(2, HV), torch.zeros(2, HV), torch.zeros(HV - 1), torch.zeros(HV),
                              torch.empty(2, HV), torch.empty(2, HV))
    with pytest.raises(NativeError):  # an output shorter than the tokens
        native.deltanet_gates(torch.zeros(2, HV), torch.zeros(2, HV), torch.zeros(HV), torch.zeros(HV),
                              torch.empty(1, HV), torch.empty(1, HV))
    with pytest.raises(NativeError):  # z rows narrower than the heads
        native.deltanet_norm_gate(torch.zeros(2, HV, DV), torch.zeros(2, HV * DV - 1), torch.ones(DV), 1e-6,
                                  torch.empty(2, HV * DV))
    with pytest.raises(NativeError):  # a norm shorter than a head
        native.deltanet_norm_gate(torch.zeros(2, HV, DV), torch.zeros(2, HV * DV), torch.ones(DV - 1), 1e-6,
                                  torch.empty(2, HV * DV))
