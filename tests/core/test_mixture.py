"""Drawing x_s from the fitted two-component mixture (gms_kernels.core.mixture): which component each element takes,
per sample or per element, and the draw itself, against values written out by hand."""
import pytest
import torch

from gms_kernels.core.fit import MixtureParams
from gms_kernels.core.mixture import SELECT_MODES, check_select, choose_first_component, sample_mixture


def test_one_uniform_per_sample_picks_one_component_for_all_its_elements():
    like = torch.zeros(3, 2, 2, 2)
    u = torch.tensor([0.1, 0.5, 0.33])
    first = choose_first_component(u, 1 / 3, like)
    assert first.shape == like.shape
    assert first[0].all() and not first[1].any() and first[2].all()  # (0.33 < 1/3)
    # u = w1 takes the second component: P(u < w1) = w1 exactly
    assert not choose_first_component(torch.tensor([0.25]), 0.25, torch.zeros(1, 2)).any()


def test_one_uniform_per_element_picks_per_element():
    u = torch.tensor([[0.1, 0.9], [0.5, 0.2]])
    assert choose_first_component(u, 0.4, torch.zeros(2, 2)).tolist() == [[True, False], [False, True]]
    # a 1-D batch of scalars: one uniform per sample is one per element
    assert choose_first_component(torch.tensor([0.1, 0.9]), 0.4, torch.zeros(2)).tolist() == [True, False]


def test_sample_mixture_takes_the_chosen_mean_plus_the_spread():
    p = MixtureParams(mu1=torch.tensor([[1.0, 2.0], [3.0, 4.0]]), mu2=torch.tensor([[-1.0, -2.0], [-3.0, -4.0]]),
                      s2=torch.tensor([[4.0, -1.0], [0.25, 0.0]]))
    z = torch.full((2, 2), 2.0)
    per_sample = sample_mixture(p, (0.3, 0.7), z, torch.tensor([0.2, 0.5]))  # (w1 = 0.3: 0.5 takes the second)
    assert per_sample.tolist() == [[5.0, 2.0], [-2.0, -4.0]]  # (a negative s2 draws no spread)
    per_pixel = sample_mixture(p, (0.3, 0.7), z, torch.tensor([[0.2, 0.5], [0.5, 0.2]]))
    assert per_pixel.tolist() == [[5.0, -2.0], [-2.0, 4.0]]


def test_select_modes():
    for mode in SELECT_MODES:
        assert check_select(mode) == mode
    with pytest.raises(ValueError, match="unknown select 'row'; valid: sample, pixel"):
        check_select("row")
