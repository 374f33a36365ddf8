"""The GMS option sets the shipped models' own options were chosen from (gk.choose_options' ``candidates``).

They are the variants that took the first three places on either testbed of the quality study's validation
split, the official preset, and the variant that leads with exact heads (per pixel, a mixture on the last step).
"""
from __future__ import annotations

from typing import Any

SHIPPED_MODEL_CANDIDATES: dict[str, dict[str, Any]] = {
    "closed, per image": {"fit": "closed", "select": "sample"},
    "closed, per pixel": {"fit": "closed", "select": "pixel"},
    "closed, per image, GMS on the last step": {"fit": "closed", "select": "sample", "gaussian_last_step": False},
    "closed, per image, skew threshold 0.05": {"fit": "closed", "select": "sample", "skew_threshold": 0.05},
    "closed, per pixel, GMS on the last step": {"fit": "closed", "select": "pixel", "gaussian_last_step": False},
    "adan-70, per pixel": {"fit": "adan", "select": "pixel", "fit_iters": 70},
    "official": {"preset": "official"},
}
