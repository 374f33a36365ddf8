"""The command line checks every argument before it works or writes: a mistake is one line on stderr,
exit status 2 and no output, and the corrected command then runs in the same --out."""
import json

import numpy as np
import pytest
import torch

import gms_kernels as gk
from gms_kernels.cli import build_parser, main
from gms_kernels.integrations.distributed import load_shards, sample_shards
from gms_kernels.models import PytorchDDPMUNet


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny eps network for 1-channel data (pytorch-ddpm layout), training data, Gamma tables for all 1000
    steps and for 5, and an image."""
    root = tmp_path_factory.mktemp("inputs")
    torch.manual_seed(0)
    net = PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=0.0, in_channels=1)
    state = net.state_dict()
    torch.save({"ema_model": state, "net_model": state}, root / "eps.pt")
    torch.save(gk.data.digits("all")[0][:16], root / "data.pt")
    torch.save(torch.full((1000,), 0.3, dtype=torch.float64), root / "gamma.pt")
    torch.save(torch.full((5,), 0.3, dtype=torch.float64), root / "short.pt")
    np.save(root / "image.npy", np.zeros((8, 8), dtype=np.uint8))
    return root


def _refused(argv, capsys, *, names: str | None = None) -> str:
    """Run the command, expect a one-line user error (exit status 2) that names ``names``; returns the line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("gms-kernels ") and "Traceback" not in err, err
    if names is not None:
        assert names in err, err
    return err


# -- --shape without --model --------------------------------------------------------------------
def test_sample_without_a_model_refuses_a_shape_the_embedded_model_cannot_take(tmp_path, capsys):
    out = tmp_path / "o"
    _refused(["sample", "--shape", "3", "32", "32", "--num-samples", "2", "--steps", "2", "--out", str(out),
              "--quiet"], capsys, names="--shape")
    assert not out.exists()
    assert main(["sample", "--shape", "1", "8", "8", "--num-samples", "2", "--steps", "2", "--out", str(out),
                 "--quiet"]) == 0  # (the embedded model's own shape is accepted)
    assert load_shards(out).shape == (2, 1, 8, 8)


# -- counts -------------------------------------------------------------------------------------
@pytest.mark.parametrize("command, flag, values", [
    ("train-backbone", "--steps", ["-1"]),
    ("train-backbone", "--steps", ["0"]),
    ("train-backbone", "--batch-size", ["0"]),
    ("train-backbone", "--T", ["0"]),
    ("train-backbone", "--ch", ["0"]),
    ("train-backbone", "--num-res-blocks", ["0"]),
    ("train-backbone", "--ch-mult", ["1", "0"]),
    ("train-heads", "--steps", ["-1"]),
    ("train-heads", "--batch-size", ["-8"]),
])
def test_training_refuses_non_positive_counts(command, flag, values, files, tmp_path, capsys):
    out = tmp_path / "net.pt"
    argv = [command, "--data", str(files / "data.pt"), "--steps", "1", "--batch-size", "4", "--out", str(out),
            "--quiet", flag, *values]
    if command == "train-heads":
        argv += ["--model", str(files / "eps.pt")]
    else:
        argv += ["--ch-mult", "1", "--attn", "--num-res-blocks", "1"] if flag not in ("--ch-mult", "--num-res-blocks") \
            else ["--attn"]
    _refused(argv, capsys, names=flag + " ")
    assert not out.exists()


@pytest.mark.parametrize("argv, flag", [
    (["digits", "--samples", "0", "--seeds", "2", "--steps", "2"], "--samples"),
    (["digits", "--samples", "4", "--seeds", "0", "--steps", "2"], "--seeds"),
    (["digits", "--samples", "4", "--seeds", "2", "--steps", "0"], "--steps"),
    (["oracle", "--samples", "0", "--steps", "2", "--datasets", "8gauss"], "--samples"),
    (["oracle", "--samples", "10", "--steps", "2", "0", "--datasets", "8gauss"], "--steps"),
    (["digits", "--samples", "4", "--seeds", "2", "--steps", "2", "--seed", "-1"], "--seed"),
    (["sample", "--num-samples", "2", "--steps", "2", "--seed", "-1"], "--seed"),
])
def test_zero_counts_and_negative_seeds_are_one_line_naming_the_flag(argv, flag, tmp_path, capsys):
    out = tmp_path / "o"
    _refused(argv + ["--out", str(out), "--quiet"], capsys, names=flag + " ")
    assert not out.exists()


# -- output paths -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, flag, under", [
    (["sample", "--num-samples", "2", "--steps", "2"], "--out", False),
    (["sample", "--num-samples", "2", "--steps", "2"], "--out", True),
    (["sample", "--num-samples", "2", "--steps", "2", "--npz", "{plain}/s.npz"], "--npz", False),
    (["digits", "--samples", "4", "--seeds", "2", "--steps", "2"], "--out", False),
    (["oracle", "--samples", "10", "--steps", "2", "--datasets", "8gauss"], "--out", True),
    (["train-backbone", "--data", "{data}", "--steps", "1", "--batch-size", "4", "--ch-mult", "1", "--attn",
      "--num-res-blocks", "1"], "--out", True),
    (["train-backbone", "--data", "{data}", "--steps", "1", "--batch-size", "4", "--ch-mult", "1", "--attn",
      "--num-res-blocks", "1", "--checkpoint", "{plain}/ck.pt"], "--checkpoint", False),
    (["train-heads", "--data", "{data}", "--steps", "1", "--batch-size", "4", "--model", "{eps}"], "--out", True),
    (["sdedit", "--model", "{eps}", "--input", "{image}", "--solver", "ddpm", "--steps", "2"], "--out", False),
    (["choose-options", "--samples", "4", "--seeds", "1", "--steps", "2"], "--out", True),
    (["reproduce", "--model", "{eps}", "--stats", "stats.npz", "--steps", "2", "--num-samples", "2"], "--out", False),
])
def test_an_output_path_on_or_under_a_file_is_refused_before_any_work(argv, flag, under, files, tmp_path, capsys):
    """--out naming an existing file where a folder is written (or any output path below a file) is one line
    naming the flag, refused before the run starts (training would otherwise fail only at the end)."""
    plain = tmp_path / "plain"
    plain.write_text("keep me\n")
    names = {"plain": plain, "data": files / "data.pt", "eps": files / "eps.pt", "image": files / "image.npy"}
    argv = [a.format(**names) for a in argv]
    if flag == "--out":
        argv += ["--out", str(plain / "net.pt" if under else plain)]
    else:
        argv += ["--out", str(tmp_path / "o")]
    _refused(argv + ["--quiet"], capsys, names=flag + " ")
    assert plain.read_text() == "keep me\n" and sorted(p.name for p in tmp_path.iterdir()) == ["plain"]


def test_a_training_output_that_is_a_folder_is_refused(files, tmp_path, capsys):
    _refused(["train-backbone", "--data", str(files / "data.pt"), "--steps", "1", "--batch-size", "4",
              "--ch-mult", "1", "--attn", "--num-res-blocks", "1", "--out", str(tmp_path), "--quiet"], capsys,
             names="--out ")
    assert list(tmp_path.iterdir()) == []


# -- a mistyped run does not block the corrected one --------------------------------------------
@pytest.mark.parametrize("mistake, fix", [
    ([], ["--solver", "ddpm"]),  # (gms needs three heads, the network gives one)
    (["--solver", "ddpm", "--seed", "-1"], ["--solver", "ddpm", "--seed", "1"]),
    (["--solver", "ddpm", "--shape", "3", "8", "8"], ["--solver", "ddpm"]),  # (a 1-channel network)
    (["--solver", "analytic-dpm", "--option", "gamma=[0.5]"], ["--solver", "analytic-dpm", "--gamma", "{gamma}"]),
    (["--solver", "analytic-dpm", "--gamma", "{short}"], ["--solver", "analytic-dpm", "--gamma", "{gamma}"]),
])
def test_a_mistyped_sample_command_writes_nothing_and_the_corrected_one_runs(mistake, fix, files, tmp_path, capsys):
    out = tmp_path / "d2"
    base = ["sample", "--model", str(files / "eps.pt"), "--shape", "1", "8", "8", "--num-samples", "4", "--steps", "2",
            "--shard-size", "2", "--out", str(out), "--quiet"]
    names = {"gamma": files / "gamma.pt", "short": files / "short.pt"}
    _refused(base + [a.format(**names) for a in mistake], capsys)
    assert not out.exists()
    assert main(base + [a.format(**names) for a in fix]) == 0
    assert load_shards(out).shape == (4, 1, 8, 8)


def test_a_manifest_without_shards_is_replaced_by_a_run_with_other_settings(tmp_path):
    """What a run killed before its first shard leaves (a manifest, perhaps a temporary file) binds nobody."""
    from gms_kernels.models.embedded import default_model

    model = default_model()
    sample_shards(model, tmp_path, 2, (1, 8, 8), steps=2, progress=False)
    (tmp_path / "shard_000000.pt").rename(tmp_path / "shard_000000.pt.tmp0")
    sample_shards(model, tmp_path, 2, (1, 8, 8), steps=3, progress=False)
    assert json.loads((tmp_path / "manifest.json").read_text())["options"]["steps"] == 3
    assert sorted(p.name for p in tmp_path.glob("shard_*")) == ["shard_000000.pt"]
    with pytest.raises(ValueError, match="shards of another run"):  # (once a shard exists it is kept)
        sample_shards(model, tmp_path, 2, (1, 8, 8), steps=2, progress=False)


# -- help -----------------------------------------------------------------------------------------
def test_help_states_each_default_once():
    parser = build_parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        entries, current = [], []
        for line in sub.format_help().splitlines():
            if line.startswith("  -"):  # an option's entry starts here; its help continues indented
                entries.append(current := [line])
            elif current and line.startswith("   "):
                current.append(line)
            else:
                current = []
        assert entries, name
        for entry in entries:
            text = " ".join(part.strip() for part in entry)
            assert text.count("default") <= 1, f"{name}: {text}"
        assert "(default: None)" not in sub.format_help(), name


def test_a_per_step_skew_scale_with_json_string_keys_runs_from_the_command_line(tmp_path, capsys):
    """--option skew_scale={"999": f, ...}: JSON keys are strings, read as the time indices they spell; the
    samples equal gk.sample's with int keys (the embedded model, K = 2: t = 999, 499, 0)."""
    factors = {"999": 0.5, "499": 0.25, "0": 1.0}
    main(["sample", "--num-samples", "2", "--steps", "2", "--option", "skew_scale=" + json.dumps(factors),
          "--out", str(tmp_path / "o"), "--quiet"])
    got = load_shards(tmp_path / "o")
    want = gk.sample(shape=(2, 1, 8, 8), steps=2, generator=0, progress=False,
                     skew_scale={int(t): f for t, f in factors.items()})
    assert torch.equal(got, want)
    _refused(["sample", "--num-samples", "2", "--steps", "2", "--option", 'skew_scale={"a": 0.5}',
              "--out", str(tmp_path / "p")], capsys, names="skew_scale")


def test_sample_reads_the_shape_from_a_diffusers_unets_config(tmp_path, capsys):
    """--model DIR of a diffusers UNet2DModel needs no --shape: the config's in_channels and sample_size give it;
    a network that records no size still asks for --shape, in one line."""
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, block_out_channels=(32, 32), layers_per_block=1,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       norm_num_groups=8)
    unet.save_pretrained(tmp_path / "unet")
    main(["sample", "--model", str(tmp_path / "unet"), "--solver", "ddpm", "--num-samples", "2", "--steps", "2",
          "--out", str(tmp_path / "o"), "--quiet"])
    assert load_shards(tmp_path / "o").shape == (2, 1, 8, 8)
    _refused(["sample", "--model", str(files_eps(tmp_path)), "--solver", "ddpm", "--out", str(tmp_path / "p")],
             capsys, names="--shape C H W is required")
    assert not (tmp_path / "p").exists()


def files_eps(root):
    """A pytorch-ddpm eps network (it records no image size)."""
    net = PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=0.0, in_channels=1)
    torch.save({"ema_model": net.state_dict(), "net_model": net.state_dict()}, root / "eps.pt")
    return root / "eps.pt"
