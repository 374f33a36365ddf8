"""The GMS option sets the shipped models' own options were chosen from (gk.choose_options' ``candidates``).

They are the variants that took the first three places on either testbed of the quality study's validation
split, the official preset, and the variant that leads with exact heads (per pixel, a mixture on the last step).
"""
from __future__ import annotations

from gms_kernels.solvers import get_solver

# the library's own list, which gk.choose_options ranks for a model by default
SHIPPED_MODEL_CANDIDATES = get_solver("gms").candidates
