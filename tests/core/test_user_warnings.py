import warnings

import pytest

from gms_kernels.core.user_warnings import warn_user


def _define_in(module_name: str, source: str, **names):
    """A function whose frames belong to ``module_name`` (as if it were defined in that package)."""
    namespace = {"__name__": module_name, **names}
    exec(compile(source, f"<{module_name}>", "exec"), namespace)
    return namespace


LIBRARY = _define_in("gms_kernels._probe", """
def nested(depth, category):
    if depth == 0:
        return warn_user("probe", category)
    return nested(depth - 1, category)
""", warn_user=warn_user)

FRAMEWORK = _define_in("diffusers.configuration_utils", """
def call(function, *args):
    return function(*args)
""")


@pytest.mark.parametrize("depth", [0, 1, 5])
def test_a_warning_points_at_the_first_line_outside_the_library_however_deep(depth):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LIBRARY["nested"](depth, RuntimeWarning)
    assert len(caught) == 1 and caught[0].category is RuntimeWarning and str(caught[0].message) == "probe"
    assert caught[0].filename == __file__


def test_frameworks_between_the_user_and_the_library_are_passed_over():
    """diffusers' decorators and from_config call the library on the user's behalf: the user's line is further out."""
    with pytest.warns(UserWarning, match="^probe$") as caught:
        FRAMEWORK["call"](LIBRARY["nested"], 2, UserWarning)
    assert caught[0].filename == __file__


def test_a_direct_call_points_at_its_own_line():
    with pytest.warns(UserWarning) as caught:
        warn_user("direct")
    assert caught[0].filename == __file__
