"""`gms-kernels reproduce` / gk.reproduce.reproduce end to end on tiny fixtures: the
embedded digits network saved as a checkpoint, a small random feature extractor in Inception's place,
statistics computed here; resume; one-line CLI errors."""
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

import gms_kernels as gk
from gms_kernels.integrations import distributed
from gms_kernels.cli import main
from gms_kernels.models.embedded import default_model
from gms_kernels.eval.inception import inception_features
from gms_kernels.eval.metrics import frechet_distance, gaussian_stats, load_stats
from gms_kernels.eval.reproduce import dataset_stats, reproduce

SHAPE = (1, 8, 8)
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.*:DeprecationWarning")  # (the CLI reads TorchScript)


class TinyExtractor(nn.Module):
    """Inception's interface (uint8 images [N, 3, H, W] -> features [N, d]) with random weights."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float() / 255.0
        return 20 * self.fc(torch.tanh(self.conv(x)).mean(dim=(2, 3)))  # (FIDs of a few units)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    ckpt = root / "digits_net.pt"
    default_model().save(ckpt)  # a MomentNet file, as gk.models.load reads it
    extractor = TinyExtractor().eval()
    scripted = root / "extractor.ts"
    torch.jit.save(torch.jit.script(extractor), scripted)
    stats = dataset_stats(gk.data.digits("all")[0][:300], root / "digits_stats.npz", feature_extractor=extractor)
    return {"ckpt": ckpt, "stats": stats, "extractor": extractor, "scripted": scripted, "root": root}


def run(fixtures, out, **kw):
    args = dict(inception_weights=None, feature_extractor=fixtures["extractor"], steps=(2, 3),
                solvers=("ddpm", "gms"), num_samples=6, shape=SHAPE, shard_size=4, batch_size=4, progress=False,
                gms_options={"fit_iters": 5})
    return reproduce([fixtures["ckpt"]], fixtures["stats"], out, **{**args, **kw})


def shard_times(out):
    return {p: p.stat().st_mtime_ns for p in sorted(out.rglob("shard_*.pt"))}


def test_reproduce_end_to_end_table_fids_and_hashes(fixtures, tmp_path):
    res = run(fixtures, tmp_path)
    assert set(res.fids) == {("digits_net.pt", s, k) for s in ("ddpm", "gms") for k in (2, 3)}
    assert all(len(v) == 1 and v[0] > 0 for v in res.fids.values())
    # each FID is the Fréchet distance of its run's samples' features to the statistics
    run_dir = tmp_path / "digits_net.pt" / "seed0" / "gms" / "K3"
    images = distributed.load_shards(run_dir)
    assert images.shape == (6, *SHAPE) and len(list(run_dir.glob("shard_*.pt"))) == 2
    feats = inception_features(images, fixtures["extractor"], (-1.0, 1.0))
    want = frechet_distance(*gaussian_stats(feats), *load_stats(fixtures["stats"]))
    assert res.fids[("digits_net.pt", "gms", 3)] == [pytest.approx(want, rel=1e-12)]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["options"]["solver"] == "gms" and manifest["options"]["fit"] == "adan"
    assert manifest["options"]["fit_iters"] == 5 and manifest["options"]["steps"] == 3
    # the table: rows solvers, columns K, the lowest FID per column in bold, the checkpoint's sha256
    table = (tmp_path / "fid_table.md").read_text()
    assert table.strip() == res.table and res.path == tmp_path / "fid_table.md"
    assert "| # timesteps K | 2 | 3 |" in table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| ") and "K |" not in line}
    assert set(rows) == {"DDPM, β̃_t", "GMS"}
    ddpm3, gms3 = res.fids[("digits_net.pt", "ddpm", 3)][0], res.fids[("digits_net.pt", "gms", 3)][0]
    assert f"{gms3:.2f}" in rows["GMS"] and f"{ddpm3:.2f}" in rows["DDPM, β̃_t"]
    assert f"**{min(ddpm3, gms3):.2f}**" in table
    digest = hashlib.sha256(fixtures["ckpt"].read_bytes()).hexdigest()
    assert f"`{fixtures['ckpt']}`: `{digest}`" in table and "One seed (0)" in table and "6 samples" in table


def test_rerun_resumes_without_resampling(fixtures, tmp_path):
    first = run(fixtures, tmp_path)
    before = shard_times(tmp_path)
    fids_written = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("fid.json")}
    again = run(fixtures, tmp_path)
    assert shard_times(tmp_path) == before and again.fids == first.fids  # nothing resampled
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("fid.json")} == fids_written  # nor measured again
    victim = tmp_path / "digits_net.pt" / "seed0" / "ddpm" / "K2" / "shard_000001.pt"
    victim.unlink()  # as if the job was killed while writing it
    fid_json = victim.parent / "fid.json"
    stale = fid_json.stat().st_mtime_ns
    third = run(fixtures, tmp_path)
    after = shard_times(tmp_path)
    assert {p for p in after if after[p] != before.get(p)} == {victim}  # only the missing shard is drawn again
    assert fid_json.stat().st_mtime_ns != stale  # its run's FID is measured again (on the new shard)
    assert third.fids == first.fids  # (the same samples: sample i depends on (seed, i) alone)


def test_several_seeds_give_mean_and_interval(fixtures, tmp_path):
    res = run(fixtures, tmp_path, steps=(2,), solvers=("ddpm",), seeds=(0, 1, 2))
    values = res.fids[("digits_net.pt", "ddpm", 2)]
    assert len(values) == 3 and len(set(values)) == 3
    assert re.search(r"\| DDPM, β̃_t \| [0-9.]+ ± [0-9.]+ \|", res.table) and "over 3 seeds [0, 1, 2]" in res.table


def test_cli_reproduce_end_to_end(fixtures, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["reproduce", "--model", str(fixtures["ckpt"]), "--stats", str(fixtures["stats"]), "--feature-extractor",
            str(fixtures["scripted"]), "--steps", "2", "--solvers", "ddpm", "sn-ddpm", "--num-samples", "5",
            "--shape", "1", "8", "8", "--shard-size", "3", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    table = (out / "fid_table.md").read_text()
    assert "Command: `gms-kernels reproduce --model " in table and "SN-DDPM" in table
    assert "wrote " in capsys.readouterr().out
    api = run(fixtures, tmp_path / "api", steps=(2,), solvers=("ddpm", "sn-ddpm"), num_samples=5, shard_size=3)
    cli_values = [float(v) for v in re.findall(r"^\| [^|]+ \| \**([0-9.]+)\**", table, re.M)[1:]]  # (row 0: K)
    assert cli_values == [round(api.fids[("digits_net.pt", s, 2)][0], 2) for s in ("ddpm", "sn-ddpm")]


@pytest.mark.parametrize("change, message", [
    (lambda f, t: ["--stats", str(t / "missing.npz")], "missing.npz: no such file"),
    (lambda f, t: ["--model", str(t / "nope.pt")], "nope.pt: no such file or directory"),
    (lambda f, t: ["--stats", str(f["ckpt"])], "not a pytorch-fid statistics file|cannot|pickle|zip"),
    (lambda f, t: ["--inception", str(t / "inception.pth")], "not both"),
    (lambda f, t: ["--steps", "0"], "positive integers"),
    (lambda f, t: ["--load-option", "oops"], "KEY=VALUE"),
])
def test_cli_reproduce_errors_in_one_line(fixtures, tmp_path, capsys, change, message):
    base = {"--model": [str(fixtures["ckpt"])], "--stats": [str(fixtures["stats"])],
            "--feature-extractor": [str(fixtures["scripted"])], "--steps": ["2"], "--num-samples": ["4"],
            "--shape": ["1", "8", "8"], "--out": [str(tmp_path / "out")]}
    extra = change(fixtures, tmp_path)
    argv = ["reproduce", "--quiet"]
    for key, values in base.items():
        if key not in extra:
            argv += [key, *values]
    argv += extra
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("gms-kernels reproduce: error:")
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_feature_size_must_match_the_statistics(fixtures, tmp_path):
    gk.metrics.save_stats(tmp_path / "wide.npz", torch.zeros(7), torch.eye(7))
    with pytest.raises(ValueError, match="statistics of 7-d features, but the feature extractor gives 5"):
        reproduce([fixtures["ckpt"]], tmp_path / "wide.npz", tmp_path / "out", feature_extractor=fixtures["extractor"],
                  steps=(2,), solvers=("ddpm",), num_samples=4, shape=SHAPE, progress=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="exactly one of inception_weights"):
        reproduce([fixtures["ckpt"]], fixtures["stats"], tmp_path / "out", steps=(2,), num_samples=4, shape=SHAPE)


def test_torchrun_two_processes_give_the_one_process_table(fixtures, tmp_path):
    """Under torchrun the shards and the FIDs are split over the ranks; rank 0 writes the same table."""
    out = tmp_path / "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "gms_kernels",
           "reproduce", "--model", str(fixtures["ckpt"]), "--stats", str(fixtures["stats"]), "--feature-extractor",
           str(fixtures["scripted"]), "--steps", "2", "3", "--solvers", "ddpm", "gms", "--num-samples", "6",
           "--shape", "1", "8", "8", "--shard-size", "4", "--batch-size", "4", "--fit-iters", "5", "--out", str(out),
           "--quiet"]
    subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), check=True, timeout=300, capture_output=True)
    table = (out / "fid_table.md").read_text()
    assert "2 process(es)" in table and "Command: `torchrun ... -m gms_kernels reproduce --model" in table
    one = run(fixtures, tmp_path / "one")
    rows = lambda text: [line for line in text.splitlines() if line.startswith("| ")]  # noqa: E731
    assert rows(table) == rows(one.table)


def test_reproduce_reads_an_inception_weights_file(fixtures, tmp_path):
    """The --inception route: the FID InceptionV3 from a local weights file (random weights here, in the
    pytorch-fid file's layout), 2048-d features, statistics made with the same file."""
    from gms_kernels.eval.inception import random_state_dict

    weights = tmp_path / "pt_inception-random.pth"
    torch.save(random_state_dict(0), weights)
    stats = dataset_stats(gk.data.digits("all")[0][:4], tmp_path / "stats.npz", inception_weights=weights)
    assert load_stats(stats)[0].shape == (2048,)
    res = reproduce([fixtures["ckpt"]], stats, tmp_path / "out", inception_weights=weights, steps=(2,),
                    solvers=("ddpm",), num_samples=2, shape=SHAPE, progress=False)
    record = json.loads((tmp_path / "out" / "digits_net.pt" / "seed0" / "ddpm" / "K2" / "fid.json").read_text())
    assert record["extractor"] == "inception:" + hashlib.sha256(weights.read_bytes()).hexdigest()
    assert res.fids[("digits_net.pt", "ddpm", 2)] == [record["fid"]] and record["fid"] > 0


def test_reproduce_refuses_analytic_dpm_before_sampling(fixtures, tmp_path):
    """Its Gamma table needs each network's training data, which the protocol does not take: refused up front with
    the way to run it, not after the other rows have sampled."""
    with pytest.raises(ValueError, match=r"analytic-dpm needs a Gamma table per network.*--gamma TABLE.pt"):
        run(fixtures, tmp_path / "api", steps=(2,), solvers=("ddpm", "analytic-dpm"), num_samples=5)
    assert not (tmp_path / "api").exists()


def test_every_row_of_the_fid_table_is_named_in_one_style():
    """The paper's rows keep their names (DDPM, β̃_t ...); every other solver is named in capitals, never in
    lower case beside them."""
    from gms_kernels.eval.reproduce import report
    from gms_kernels.solvers import SOLVERS

    solvers = list(SOLVERS)
    fids = {("net", s, 10): [1.0, 2.0] for s in solvers}
    table = report(fids, ["net"], solvers, [10], hashes={}, stats=("s.npz", "0" * 64), extractor="x" * 40,
                   num_samples=10, seeds=[0, 1], trajectory="even", gms_options=None, command=None)
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    names = rows[1:]  # (after the header row)
    assert "DDPM, β̃_t" in names and "DDIM" in names and "SEEDS-1" in names and "Analytic-DPM" in names
    assert not [n for n in names if n[0].islower()], names


def test_a_missing_resolution_names_the_command_line_option_too(tmp_path, capsys):
    """A DDIM-repository checkpoint records no image size: the error says resolution= and the CLI's
    --load-option resolution=N, since reproduce and sample are mostly run from the command line."""
    from gms_kernels.models import DDIMModel

    net = DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(), resolution=8)
    torch.save(net.state_dict(), tmp_path / "ddim.ckpt")
    with pytest.raises(ValueError, match=r"pass resolution= .*CLI: --load-option resolution=N"):
        gk.models.load(tmp_path / "ddim.ckpt", kind="ddim")


def test_each_progress_bar_names_the_cell_it_fills(fixtures, tmp_path, monkeypatch):
    """A reproduce run fills many (checkpoint, seed, solver, K) cells: each cell's progress bar says which."""
    import gms_kernels.integrations.distributed as dist_module

    labels = []
    real = dist_module.progress_bar
    monkeypatch.setattr(dist_module, "progress_bar", lambda items, enabled, desc: labels.append(desc) or
                        real(items, False, desc=desc))
    run(fixtures, tmp_path / "out", steps=(2,), solvers=("ddpm",), progress=True)
    assert labels == ["digits_net.pt seed 0 DDPM, β̃_t K=2 (rank 0)"]
