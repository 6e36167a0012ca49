"""The delay a plan on Ray is predicted with: the calls' fit, centred on their median."""

from __future__ import annotations

import numpy as np
import pytest

from raysrv._partitioned import typical_delay
from raysrv.analytics.forkjoin import fit_emg


def test_a_typical_delay_keeps_the_fits_spread_and_has_the_samples_median_as_its_mean() -> None:
    rng = np.random.default_rng(0)
    samples = 6e-4 + rng.normal(0, 2e-5, 2000) + rng.exponential(5e-5, 2000)
    samples[::50] += 0.02  # rare stalls of a shared machine
    fitted, typical = fit_emg(samples), typical_delay(samples)
    assert typical.mean == pytest.approx(np.median(samples))
    assert (typical.sigma, typical.tau) == (fitted.sigma, fitted.tau)
    assert fitted.mean > typical.mean + 3e-4  # the stalls move the fit's mean, not this one
    assert typical.expected_max(2) - typical.mean == pytest.approx(
        fitted.expected_max(2) - fitted.mean
    )  # a slowest of several is as far above it
