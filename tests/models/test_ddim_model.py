"""The DDIM repository's Model (gms_kernels/models/ddim_model.py): defaults, time embedding, resampling,
the configuration read from a state dict and the errors of an impossible configuration."""

import numpy as np
import pytest
import torch

import gms_kernels.models as gm
from conftest import tiny_ddim


def tiny_iddpm():
    torch.manual_seed(0)
    return gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
                        dropout=0.0, channel_mult=(1, 2), num_heads=2, use_scale_shift_norm=True).eval()


def test_ddim_time_embedding_of_an_odd_width_ends_in_one_zero():
    """The DDPM/DDIM sinusoids: sin(t w_k), cos(t w_k), w_k = 10000^(-k/(half-1)); an odd width gets one
    zero column at the end."""
    from gms_kernels.models.ddim_model import timestep_embedding

    t = torch.tensor([0.0, 3.0, 250.0])
    emb = timestep_embedding(t, 7)
    half = 3
    w = [10000.0 ** (-k / (half - 1)) for k in range(half)]
    expected = [[np.sin(s * wk) for wk in w] + [np.cos(s * wk) for wk in w] + [0.0] for s in t.tolist()]
    assert emb.shape == (3, 7)
    np.testing.assert_allclose(emb.numpy(), np.array(expected), rtol=0, atol=2e-5)


def test_ddim_resampling_without_convolutions_is_nearest_and_average_pooling():
    from gms_kernels.models.ddim_model import Downsample, Upsample

    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(1, 2, 4, 4)
    up = x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
    assert torch.equal(Upsample(2, with_conv=False)(x), up)
    down = x.reshape(1, 2, 2, 2, 2, 2).mean(dim=(3, 5))
    assert torch.equal(Downsample(2, with_conv=False)(x), down)
    torch.manual_seed(0)
    model = gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(4,), resolution=8,
                         resamp_with_conv=False).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 8, 8), torch.tensor([5])).shape == (1, 3, 8, 8)


def test_ddim_model_takes_a_scalar_time_for_the_whole_batch():
    model = tiny_ddim(0)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(model(x, 5), model(x, torch.tensor([5, 5])))
        assert torch.equal(model(x, torch.tensor(5)), model(x, torch.tensor([5, 5])))


def test_the_ddim_time_embedding_is_made_where_t_is():
    from gms_kernels.models.ddim_model import timestep_embedding

    emb = timestep_embedding(torch.arange(4, device="meta"), 32)  # (meta: a device other than the CPU, no data)
    assert emb.device.type == "meta" and emb.shape == (4, 32)


def test_ddim_model_defaults_are_the_ddim_repositorys():
    """DDIMModel(ch, out_ch) alone: ch_mult (1, 2, 4, 8), two res blocks per level, attention at 16, no dropout,
    conv resampling, 3 input channels, 32 x 32 (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = gm.DDIMModel(ch=32, out_ch=3)
    assert model.config == {"ch": 32, "out_ch": 3, "ch_mult": [1, 2, 4, 8], "num_res_blocks": 2,
                            "attn_resolutions": [16], "dropout": 0.0, "resamp_with_conv": True, "in_channels": 3,
                            "resolution": 32}
    assert len(model.down[0].block) == 2 and len(model.up[0].block) == 3


def test_ddim_time_embedding_of_width_4_is_the_smallest_allowed():
    """Width 4 (two rates, 1 and 1e-4) is allowed and gives [sin t, sin t/1e4, cos t, cos t/1e4]; 3 is refused."""
    from gms_kernels.models.ddim_model import timestep_embedding

    t = torch.tensor([0.0, 3.0, 250.0])
    expected = torch.stack([t.sin(), (t * 1e-4).sin(), t.cos(), (t * 1e-4).cos()], dim=1)
    torch.testing.assert_close(timestep_embedding(t, 4), expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="at least 4"):
        timestep_embedding(t, 3)


@pytest.mark.parametrize("options", [{"ch_mult": ()}, {"num_res_blocks": 0}], ids=["no-levels", "no-blocks"])
def test_ddim_model_refuses_no_levels_or_no_blocks_each_alone(options):
    with pytest.raises(ValueError, match=r"ch_mult must be non-empty and num_res_blocks >= 1"):
        gm.DDIMModel(ch=32, out_ch=3, **{"ch_mult": (1, 2), "num_res_blocks": 1, "resolution": 8, **options})


def test_resolve_resolution_pairs_the_largest_attention_size_with_the_first_level():
    """Attention at encoder levels 1 and 2 of a 32 x 32 network works at 16 and 8: given (8, 16) in any order,
    the image size is 32."""
    from gms_kernels.models.ddim_model import resolve_resolution

    assert resolve_resolution([1, 2], None, [8, 16]) == {"resolution": 32, "attn_resolutions": [8, 16]}
    assert resolve_resolution([1, 2], None, [16, 8]) == {"resolution": 32, "attn_resolutions": [8, 16]}


def test_a_ddim_model_takes_an_int_timestep_whatever_the_default_device():
    """DDIMModel.forward(x, 17) makes the timestep tensor where x is, not on torch's default device."""
    model = tiny_ddim(0)
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(x, 17)
        with torch.device("meta"):
            got = model(x, 17)
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_the_ddim_time_embedding_is_float32_whatever_the_default_dtype(default_dtype):
    """The DDIM Model's frequencies are float32 (as the DDIM repository's), also under a float64 default dtype:
    the same embedding, in float32."""
    from gms_kernels.models.ddim_model import timestep_embedding

    t = torch.tensor([0, 7, 999])
    expected = timestep_embedding(t, 10)
    with default_dtype(torch.float64):
        got = timestep_embedding(t, 10)
    assert expected.dtype == got.dtype == torch.float32 and torch.equal(got, expected)


def _convs_to(net, dtype):
    for m in net.modules():
        if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)):
            m.to(dtype)
    return net


def test_networks_with_low_precision_convolutions_and_float32_time_layers_run():
    """improved-diffusion's convert_to_fp16 casts the convolutions alone; the time embedding's linear layers stay
    float32, so each residual block casts its projected embedding to the feature's dtype. An IDDPMUNet and a
    DDIMModel so converted (bfloat16 here) run and return bfloat16."""
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    t = torch.tensor([3, 4])
    iddpm = _convs_to(tiny_iddpm(), torch.bfloat16)
    torch.manual_seed(0)
    ddim = _convs_to(gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(4,),
                                  resolution=8).eval(), torch.bfloat16)
    with torch.no_grad():
        assert iddpm(x, t).dtype == torch.bfloat16
        out = ddim(x, t)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3, 8, 8) and torch.isfinite(out.float()).all()


def test_a_ddim_level_downsamples_its_last_block_output():
    """With two res blocks per level the skip list holds three entries before the downsample: it must take
    the last one (the level's output), as the DDIM repository's Model does."""
    torch.manual_seed(0)
    model = gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=2, attn_resolutions=(), resolution=8).eval()
    seen = {}
    model.down[0].block[-1].register_forward_hook(lambda m, args, out: seen.setdefault("last_block", out))
    model.down[0].downsample.register_forward_pre_hook(lambda m, args: seen.setdefault("downsampled", args[0]))
    with torch.no_grad():
        model(torch.randn(2, 3, 8, 8), torch.tensor([5, 17]))
    assert seen["downsampled"] is seen["last_block"]


def test_a_bfloat16_ddim_model_embeds_time_in_its_own_dtype():
    torch.manual_seed(0)
    model = gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(), resolution=8)
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 8, 8, dtype=torch.bfloat16), torch.tensor([9]))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 3, 8, 8)


def test_ddim_infer_config_reads_resampling_without_convolutions():
    """resamp_with_conv is read from the first downsample's conv: a two-level model built without it
    (average-pool down, nearest up) must be rebuilt the same way, else its state dict does not fit."""
    from gms_kernels.models.ddim_model import DDIMModel

    for conv in (False, True):
        state = DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(),
                          resamp_with_conv=conv, resolution=8).state_dict()
        assert DDIMModel.infer_config(state)["resamp_with_conv"] is conv
    one_level = DDIMModel(ch=32, out_ch=3, ch_mult=(1,), num_res_blocks=1, attn_resolutions=(), resolution=8)
    assert DDIMModel.infer_config(one_level.state_dict())["resamp_with_conv"] is True  # (nothing to resample)


def test_ddim_model_refuses_a_resolution_it_cannot_halve_once_per_level():
    """Three levels halve twice: 6 is even but not divisible by 4."""
    with pytest.raises(ValueError, match="resolution 6 cannot be halved 2 times"):
        gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2, 2), num_res_blocks=1, attn_resolutions=(), resolution=6)
    gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2, 2), num_res_blocks=1, attn_resolutions=(), resolution=12)


def test_ddim_model_refuses_a_base_width_that_is_not_a_multiple_of_32():
    """ch itself is a width (conv_in's output, the first block's GroupNorm), even when no level keeps it."""
    with pytest.raises(ValueError, match=r"must be a multiple of 32 \(GroupNorm\(32\)\); got \[48, 96\]"):
        gm.DDIMModel(ch=48, out_ch=3, ch_mult=(2,), num_res_blocks=1, attn_resolutions=(), resolution=8)


def test_a_ddim_model_built_directly_has_the_ddpm_linear_schedule():
    """Without a schedule set, DDIMModel.schedule is DDPM's linear one (T=1000, betas 1e-4 to 0.02), as the
    DDIM repository's CIFAR-10 and CelebA models were trained with."""
    import gms_kernels as gk

    model = gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(), resolution=8)
    assert isinstance(model.schedule, gk.Schedule) and model.schedule.T == 1000
    assert torch.equal(model.schedule.betas, gk.Schedule.linear(1000, 1e-4, 0.02).betas)
