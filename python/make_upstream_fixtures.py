"""Write tests/data/upstream/*.pt from the shared upstream fixtures (run where ../shared exists).

The shared files (``fixtures/upstream/*.pt``: {config, state_dict, x, t, y}, y computed by the original
pytorch-ddpm / improved-diffusion code; ``fixtures/official_gms/iddpm``: the official GMS code's eps
network and its outputs) are 3-7 MB each. Their weights are ``torch.randn(shape, generator=g) * 0.05``
for every tensor in state-dict order, one CPU generator seeded as below; this script checks that
bit for bit and stores only the config, key names, shapes, seed, a SHA-256 of the weights and the
original x, t, y (about 100 KB in all). tests/models/test_upstream_fixtures.py rebuilds the weights.

    python python/make_upstream_fixtures.py [--shared ../shared/fixtures]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS / "models"))
from test_upstream_fixtures import weights_digest  # noqa: E402  (the hash the tests check, defined once)

OUT = TESTS / "data" / "upstream"
STD = 0.05
SOURCES = {  # name: (path under the shared fixtures, seed of the weights)
    "pytorch_ddpm_visible": ("upstream/pytorch_ddpm_visible.pt", 5),
    "iddpm_visible": ("upstream/iddpm_visible.pt", 6),
    "official_gms_iddpm_eps1": ("official_gms/iddpm/eps1.pt", 11),
}


def read_original(path: Path) -> tuple[dict, dict, torch.Tensor, torch.Tensor, torch.Tensor]:
    data = torch.load(path, map_location="cpu", weights_only=True)
    if "ema_model" in data:  # the official GMS save format, outputs beside it
        expected = torch.load(path.parent / "expected.pt", map_location="cpu", weights_only=True)
        config = json.loads((path.parent / "config.json").read_text())
        return data["ema_model"], config, expected["x"], expected["t"], expected["e1"]
    return data["state_dict"], data["config"], data["x"], data["t"], data["y"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "fixtures")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (relative, seed) in SOURCES.items():
        state, config, x, t, y = read_original(args.shared / relative)
        g = torch.Generator().manual_seed(seed)
        for key, value in state.items():
            if not torch.equal(value, torch.randn(value.shape, generator=g) * STD):
                raise SystemExit(f"{relative}: {key} is not the seed-{seed} draw; store the weights instead")
        record = {"source": f"fixtures/{relative}", "config": config, "keys": list(state),
                  "shapes": [list(v.shape) for v in state.values()], "seed": seed, "std": STD,
                  "sha256": weights_digest(state), "x": x, "t": t, "y": y}
        torch.save(record, OUT / f"{name}.pt")
        print(f"wrote {OUT / name}.pt ({len(state)} tensors rebuilt from seed {seed})")


if __name__ == "__main__":
    main()
