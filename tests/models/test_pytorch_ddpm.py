"""pytorch-ddpm's CIFAR10 UNet (gms_kernels/models/pytorch_ddpm.py): its sinusoid table, initialisation,
time input and the configuration read from a state dict when entries are missing."""

import pytest
import torch

import gms_kernels.models as gm
from conftest import tiny_ddpm_state


def test_pytorch_ddpm_refuses_an_attention_level_past_the_last():
    with pytest.raises(ValueError, match=r"attn levels \[2\] are out of range for ch_mult=\(1, 2\) \(levels 0..1\)"):
        gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(2,), num_res_blocks=1)


def test_pytorch_ddpm_sinusoid_table_is_frozen():
    """pytorch-ddpm's TimeEmbedding holds its sinusoid table in a frozen nn.Embedding (freeze=True): training
    the UNet never changes it."""
    net = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1)
    table = net.time_embedding.timembedding[0].weight
    assert not table.requires_grad
    assert all(p.requires_grad for n, p in net.named_parameters() if n != "time_embedding.timembedding.0.weight")


def test_pytorch_ddpm_initialisation_is_glorot_with_near_zero_branch_ends():
    """pytorch-ddpm's init: Glorot-uniform weights, zero biases; the convs closing a residual branch, the
    attention projection and the output conv get gain 1e-5 (the network starts near zero)."""
    torch.manual_seed(0)
    net = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1)

    def bound(w, gain):  # xavier_uniform_: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out))
        field = w[0][0].numel()
        return gain * (6.0 / (w.shape[1] * field + w.shape[0] * field)) ** 0.5

    tail = net.tail[-1].weight
    assert tail.abs().max() <= bound(tail, 1e-5) and tail.abs().max() > 0.5 * bound(tail, 1e-5)
    head = net.head.weight
    assert head.abs().max() <= bound(head, 1.0) and head.abs().max() > 0.5 * bound(head, 1.0)
    assert all((m.bias == 0).all() for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))


def test_pytorch_ddpm_takes_integral_float_times_and_refuses_fractional_ones():
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    net = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    with torch.no_grad():
        assert torch.equal(net(x, torch.tensor([3.0, 4.0])), net(x, torch.tensor([3, 4])))
        with pytest.raises(ValueError, match="got fractional values"):
            net(x, torch.tensor([3.5, 4.0]))


def test_a_pytorch_ddpm_unet_built_under_a_default_device_has_its_time_table_there():
    """The frozen sinusoid table is made on the CPU, then moved to the ambient default device with the rest."""
    with torch.device("meta"):
        net = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1)
    assert net.time_embedding.timembedding[0].weight.device.type == "meta"
    assert {p.device.type for p in net.parameters()} == {"meta"}


def test_pytorch_ddpm_width_is_read_from_the_time_embedding_when_every_other_width_entry_is_gone(tmp_path):
    """infer_config's last source of ch is the time embedding's width (4 ch): a file without the sinusoid
    table, the first time-embedding linear and the head conv is still compared with its own architecture;
    without that entry too, the architecture is unreadable and the loader says so (no TypeError)."""
    sd = tiny_ddpm_state()
    gone = ["time_embedding.timembedding.0.weight", "time_embedding.timembedding.1.weight", "head.weight", "head.bias"]
    part = {k: v for k, v in sd.items() if k not in gone}
    assert gm.PytorchDDPMUNet.infer_config(part)["ch"] == 32
    torch.save(part, tmp_path / "part.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "part.pt")
    msg = str(err.value)
    assert "missing keys (4)" in msg and "resembles PytorchDDPMUNet(" in msg and "ch=32" in msg
    del part["time_embedding.timembedding.3.weight"]
    assert gm.PytorchDDPMUNet.infer_config(part) is None
    torch.save(part, tmp_path / "less.pt")
    with pytest.raises(ValueError, match="do not look like a pytorch-ddpm PytorchDDPMUNet state dict"):
        gm.load(tmp_path / "less.pt", kind="pytorch-ddpm")


@pytest.mark.parametrize("gone", [("head.weight", "tail.2.bias"), ("tail.2.weight", "tail.2.bias")])
def test_pytorch_ddpm_input_channels_are_read_from_whichever_conv_is_left(tmp_path, gone):
    """in_channels: from head.weight (axis 1), else tail.2.weight, else tail.2.bias; with any one of them left,
    the file is still compared with its own architecture."""
    sd = tiny_ddpm_state()
    part = {k: v for k, v in sd.items() if k not in gone}
    assert gm.PytorchDDPMUNet.infer_config(part)["in_channels"] == 3
    torch.save(part, tmp_path / "part.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "part.pt")
    msg = str(err.value)
    assert "missing keys (2)" in msg and "resembles PytorchDDPMUNet(" in msg and "in_channels=3" in msg


def test_pytorch_ddpm_block_width_is_read_from_its_second_norm_when_the_other_entries_are_gone(tmp_path):
    """A down block's width: from block1.2.weight, block1.2.bias, temb_proj.1.weight, block2.3.weight, else
    block2.0.weight (the second GroupNorm): a file without the first four still gets its architecture."""
    sd = tiny_ddpm_state()
    gone = [f"downblocks.0.{k}" for k in ("block1.2.weight", "block1.2.bias", "temb_proj.1.weight", "block2.3.weight")]
    part = {k: v for k, v in sd.items() if k not in gone}
    assert gm.PytorchDDPMUNet.infer_config(part) == gm.PytorchDDPMUNet.infer_config(sd)
    torch.save(part, tmp_path / "part.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "part.pt")
    assert "missing keys (4)" in str(err.value) and "resembles PytorchDDPMUNet(" in str(err.value)


def test_pytorch_ddpm_width_is_read_from_the_sinusoid_table_when_the_time_layers_and_head_are_gone(tmp_path):
    """ch from the sinusoid table (time_embedding.timembedding.0.weight, [T, ch]) alone: without the time MLP's
    weights and the input conv the file is still compared with its own architecture."""
    sd = tiny_ddpm_state()
    gone = ("time_embedding.timembedding.1.weight", "time_embedding.timembedding.3.weight", "head.weight", "head.bias")
    part = {k: v for k, v in sd.items() if k not in gone}
    assert gm.PytorchDDPMUNet.infer_config(part)["ch"] == 32
    torch.save(part, tmp_path / "part.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "part.pt")
    assert "missing keys (4)" in str(err.value) and "resembles PytorchDDPMUNet(" in str(err.value)


def tiny_ddpm():
    torch.manual_seed(0)
    return gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()


def test_pytorch_ddpm_infer_config_falls_back_to_the_time_embedding_width_for_ch(tmp_path):
    """With the sinusoid table, the first time-embedding linear and the input conv all gone, ch is read as a
    quarter of the time-embedding width (an int), so the damaged file is still compared with its own
    architecture and its missing keys named."""
    net = gm.PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1, 2, 2), attn=(1,), num_res_blocks=2)
    state = net.state_dict()
    removed = ["time_embedding.timembedding.0.weight", "time_embedding.timembedding.1.weight", "head.weight",
               "head.bias"]
    for key in removed:
        del state[key]
    found = gm.PytorchDDPMUNet.infer_config(state)
    assert found == {"ch": 32, "in_channels": 3, "ch_mult": [1, 2, 2], "attn": [1], "num_res_blocks": 2}
    assert type(found["ch"]) is int and all(type(m) is int for m in found["ch_mult"])
    torch.save(state, tmp_path / "partial.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "partial.pt")
    text = str(err.value)
    assert "missing keys (4)" in text and all(k in text for k in removed)
    assert "PytorchDDPMUNet(ch=32, in_channels=3, ch_mult=[1, 2, 2]" in text


def test_pytorch_ddpm_block_width_is_read_from_its_second_conv_when_the_norms_and_time_projection_are_gone():
    """A down block's width comes from block2.3.weight (the second conv) when block1.2.weight/bias,
    temb_proj.1.weight and block2.0.weight (the second GroupNorm) are all missing."""
    sd = tiny_ddpm().state_dict()
    gone = [f"downblocks.0.{k}" for k in ("block1.2.weight", "block1.2.bias", "temb_proj.1.weight", "block2.0.weight")]
    part = {k: v for k, v in sd.items() if k not in gone}
    config = gm.PytorchDDPMUNet.infer_config(part)
    assert config is not None and config == gm.PytorchDDPMUNet.infer_config(sd)
