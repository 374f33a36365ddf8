"""improved-diffusion's UNetModel (gms_kernels/models/iddpm.py): presets, defaults, time embedding,
resampling and the configuration read from a state dict."""

import pytest
import torch

import gms_kernels as gk
import gms_kernels.models as gm


def tiny_iddpm():
    torch.manual_seed(0)
    return gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
                        dropout=0.0, channel_mult=(1, 2), num_heads=2, use_scale_shift_norm=True).eval()


def test_iddpm_resampling_without_convolutions_is_nearest_and_average_pooling():
    from gms_kernels.models.iddpm import _Down, _Up

    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(1, 2, 4, 4)
    assert torch.equal(_Up(2, use_conv=False)(x), x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3))
    assert torch.equal(_Down(2, use_conv=False)(x), x.reshape(1, 2, 2, 2, 2, 2).mean(dim=(3, 5)))
    torch.manual_seed(0)
    net = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1, attention_resolutions=(2,),
                       channel_mult=(1, 2), num_heads=2, conv_resample=False).eval()
    with torch.no_grad():
        assert net(torch.randn(1, 3, 8, 8), torch.tensor([3.5])).shape == (1, 3, 8, 8)


@pytest.mark.parametrize("preset, attention, dropout, mult", [
    ("cifar10_cosine", [2, 4], 0.3, [1, 2, 2, 2]), ("imagenet64", [4, 8], 0.0, [1, 2, 3, 4])])
def test_improved_diffusion_presets_are_the_released_configs(preset, attention, dropout, mult):
    """improved-diffusion's released CIFAR10 / ImageNet-64 flags: 128 channels, 3 blocks, 4 heads (upsampling
    heads = num_heads, i.e. -1), scale-shift norm, learned sigma (6 outputs), the cosine schedule over 4000 steps."""
    with torch.device("meta"):
        net = getattr(gm.IDDPMUNet, preset)()
    assert net.config == {"in_channels": 3, "model_channels": 128, "out_channels": 6, "num_res_blocks": 3,
                          "attention_resolutions": attention, "dropout": dropout, "channel_mult": mult,
                          "conv_resample": True, "num_heads": 4, "num_heads_upsample": -1,
                          "use_scale_shift_norm": True}
    assert torch.equal(net.schedule.betas, gk.Schedule.cosine(4000).betas)


def test_iddpm_infer_config_gives_integer_channel_mults_and_refuses_uneven_levels():
    """channel_mult comes back as ints (1.0 == 1 would pass an equality test, not a config round trip),
    and a state dict whose levels hold different numbers of res blocks is not an IDDPMUNet of any config."""
    net = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=2, attention_resolutions=(),
                       dropout=0.0, channel_mult=(1, 2), num_heads=1, use_scale_shift_norm=False)
    sd = net.state_dict()
    cfg = gm.IDDPMUNet.infer_config(sd)
    assert cfg["channel_mult"] == [1, 2] and all(type(m) is int for m in cfg["channel_mult"])
    assert cfg["num_res_blocks"] == 2
    # input blocks: 0 conv, 1-2 level 0, 3 downsample, 4-5 level 1; without block 5 level 1 has one block
    uneven = {k: v for k, v in sd.items() if not k.startswith("input_blocks.5.")}
    assert gm.IDDPMUNet.infer_config(uneven) is None


def test_an_iddpm_unet_in_float64_casts_its_time_embedding():
    """The sinusoidal embedding (float32) is cast to the time MLP's dtype: a float64 network runs."""
    net = tiny_iddpm().double()
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert net(x, torch.tensor([5])).dtype == torch.float64


def test_iddpm_time_embedding_of_odd_width_is_padded_with_one_zero_column():
    """improved-diffusion's timestep_embedding for an odd width: cos and sin halves, then one zero column."""
    from gms_kernels.models.iddpm import timestep_embedding

    t = torch.tensor([0.0, 3.0])
    odd, even = timestep_embedding(t, 7), timestep_embedding(t, 6)
    assert odd.shape == (2, 7) and torch.equal(odd[:, :6], even) and torch.equal(odd[:, 6], torch.zeros(2))


def test_an_iddpm_unet_built_with_eps_only_returns_eps_alone():
    """IDDPMUNet(..., eps_only=True) with a learned sigma (out_channels = 2 C) returns the C eps channels."""
    torch.manual_seed(0)
    kw = dict(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
              channel_mult=(1, 2), num_heads=2)
    net = gm.IDDPMUNet(**kw, eps_only=True).eval()
    assert net.eps_only is True and gm.IDDPMUNet(**kw).eps_only is False
    with torch.no_grad():
        assert net(torch.randn(1, 3, 8, 8), torch.tensor([3])).shape == (1, 3, 8, 8)


def test_iddpm_infer_config_reads_the_input_channels_of_a_one_channel_model():
    """(the input conv's weight is [model_channels, in_channels, 3, 3]: for RGB its kernel size is 3 too)"""
    state = gm.IDDPMUNet(in_channels=1, model_channels=32, out_channels=2, num_res_blocks=1, attention_resolutions=(),
                         channel_mult=(1, 2), num_heads=1).state_dict()
    assert gm.IDDPMUNet.infer_config(state)["in_channels"] == 1


def test_iddpm_timestep_embedding_ignores_the_default_device_and_dtype(default_dtype):
    """Its frequencies are made on t's device and in float32 (improved-diffusion's th.arange(..., float32)),
    whatever torch's default device or dtype."""
    from gms_kernels.models.iddpm import timestep_embedding

    t = torch.tensor([0, 7, 999])
    expected = timestep_embedding(t, 9)
    assert expected.dtype == torch.float32
    with torch.device("meta"):
        got = timestep_embedding(t, 9)
    assert got.device.type == "cpu" and torch.equal(got, expected)
    with default_dtype(torch.float64):
        got = timestep_embedding(t, 9)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_iddpm_infer_config_reads_resampling_without_convolutions():
    """conv_resample is True only when every downsample holds a strided conv: a model built with average
    pooling must be read back as conv_resample=False (else its rebuilt network expects conv weights)."""
    for conv in (False, True):
        state = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                             attention_resolutions=(), channel_mult=(1, 2, 2), conv_resample=conv).state_dict()
        assert gm.IDDPMUNet.infer_config(state)["conv_resample"] is conv


def test_iddpm_unet_defaults_to_one_attention_head():
    """improved-diffusion's UNetModel defaults to num_heads=1 (and num_heads_upsample=-1: the same)."""
    from gms_kernels.models.iddpm import _Attention

    model = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                         attention_resolutions=(2,), channel_mult=(1, 2))
    heads = [m.num_heads for m in model.modules() if isinstance(m, _Attention)]
    assert model.num_heads == 1 and heads and all(h == 1 for h in heads)


def test_iddpm_unet_defaults_to_no_scale_shift_norm():
    """improved-diffusion's UNetModel defaults to use_scale_shift_norm=False: each res block's embedding
    projection gives out_ch values (a shift), not 2 * out_ch (scale and shift)."""
    from gms_kernels.models.iddpm import _ResBlock

    model = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                         attention_resolutions=(), channel_mult=(1, 2))
    blocks = [m for m in model.modules() if isinstance(m, _ResBlock)]
    assert model.use_scale_shift_norm is False and model.config["use_scale_shift_norm"] is False
    assert blocks and all(b.emb_layers[1].out_features == b.out_layers[-1].out_channels for b in blocks)


def test_iddpm_unet_decoder_attention_takes_num_heads_upsample():
    """num_heads_upsample (when not -1) sets the heads of the decoder's attention blocks only; the encoder and
    middle blocks keep num_heads. The weights are the same, the outputs are not."""
    from gms_kernels.models.iddpm import _Attention

    def unet(num_heads_upsample):
        torch.manual_seed(0)
        return gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                            attention_resolutions=(2,), channel_mult=(1, 2), num_heads=1,
                            num_heads_upsample=num_heads_upsample).eval()

    model, same_heads = unet(4), unet(-1)
    heads = lambda blocks: [m.num_heads for m in blocks.modules() if isinstance(m, _Attention)]
    assert heads(model.output_blocks) and set(heads(model.output_blocks)) == {4}
    assert set(heads(model.input_blocks)) == set(heads(model.middle_block)) == {1}
    assert set(heads(same_heads.output_blocks)) == {1}
    with torch.no_grad():  # (improved-diffusion zero-initialises each attention's output projection)
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    same_heads.load_state_dict(model.state_dict())
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([3, 40])
    with torch.no_grad():
        assert not torch.allclose(model(x, t), same_heads(x, t))
