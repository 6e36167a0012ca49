"""Service-time profiles: S(batch size, resource) in seconds, fitted offline or from a table.

Two sources feed the batch-buffer latency model with ``S_k``, the service time of a batch of k
(the run times measured live are :class:`raysrv.batching.profile.RunTimes`, Clockwork's action
profiles, which read the same interpolation):

* :class:`ServiceProfile` follows BATCH (SC'20, §III-A, §VI-B): the
  profiler measures a few (batch size, memory) configurations and fits the rest by multivariable
  polynomial regression; the paper trains on under 3% of the grid and reports a held-out MAPE
  under 2%. Here ``resource`` stands in for Lambda's memory: a replica's threads, CPUs or memory
  in GB. :class:`TableProfile` is the dense counterpart, for sizes that were all measured.

Assumptions and caveats:

* Service times are deterministic enough that a mean (BATCH, whose measured CV is below 0.1) or a
  tail quantile (Clockwork) summarises them; both papers measured this on dedicated hardware.
* Features are the monomials ``b**i * (1/r)**j`` with ``i + j <= degree``: time grows roughly
  linearly in the batch size and falls roughly like 1/resource. Inputs are scaled to [0, 1]
  before the fit to keep the low degrees used here well conditioned.
* The fit weights each point by ``1/seconds`` (relative least squares) so that small and large
  service times count alike, as the MAPE criterion does.
* Polynomials extrapolate badly: predictions outside the fitted ``batch_range`` and
  ``resource_range`` are returned but not trusted; the ranges are recorded on the profile.
* :meth:`ServiceProfile.service_times` is what the latency model consumes. It must be positive
  and non-decreasing in k, so predictions are clipped to ``floor_s`` and replaced by their
  running maximum. The correction only ever raises a value: it errs on the slow, safe side.
* Table estimates interpolate between measured batch sizes (:func:`interpolate_batches`).

Complexity: a fit is one least-squares solve per candidate degree, O(n p^2) for n points and p
features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from raysrv.batching.profile import (
    DEFAULT_FLOOR_S,
    check_floor,
    interpolate_batches,
    monotone_service_times,
)

__all__ = [
    "DEFAULT_FLOOR_S",
    "ServiceProfile",
    "ServiceTimeModel",
    "TableProfile",
    "interpolate_batches",
    "monotone_service_times",
]

_AUTO_SLACK = 0.05
"""``degree="auto"`` takes the lowest degree whose LOO MAPE is within 5% of the best one."""

Array = NDArray[np.float64]


class ServiceTimeModel(Protocol):
    """Anything that gives the latency model its ``S_1 .. S_B`` (seconds, element k-1 = batch k)."""

    def service_times(self, max_batch: int, resource: float | None = None) -> Array: ...


# ----------------------------------------------------------------------------- validation


def _positive_array(name: str, values: ArrayLike) -> Array:
    arr = np.asarray(values, dtype=np.float64)
    bad = ~(np.isfinite(arr) & (arr > 0))
    if bad.any():
        i = int(np.argmax(bad.ravel()))
        raise ValueError(
            f"{name} must be positive and finite, got {float(arr.flat[i])!r} at index {i}"
        )
    return arr


def _positive_vector(name: str, values: ArrayLike) -> Array:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
    return _positive_array(name, arr)


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


# ----------------------------------------------------------------------------- regression


def _exponents(degree: int, two_d: bool) -> tuple[tuple[int, int], ...]:
    if not two_d:
        return tuple((i, 0) for i in range(degree + 1))
    return tuple((i, j) for i in range(degree + 1) for j in range(degree + 1 - i))


def _design(b: Array, u: Array, exps: Sequence[tuple[int, int]]) -> Array:
    return np.stack([b**i * u**j for i, j in exps], axis=-1)


@dataclass(frozen=True, slots=True)
class _Solve:
    coef: Array
    ape: Array  # in-sample absolute percentage errors
    loo_ape: Array  # leave-one-out absolute percentage errors (inf where undefined)


def _solve(X: Array, y: Array, relative: bool) -> _Solve | None:
    """Weighted least squares plus closed-form LOO residuals e_i / (1 - h_ii); None if singular."""
    w = 1.0 / y if relative else np.ones_like(y)
    Xw = X * w[:, None]
    U, s, Vt = np.linalg.svd(Xw, full_matrices=False)
    if s[-1] <= s[0] * X.shape[0] * np.finfo(np.float64).eps * 1e3:
        return None
    coef = Vt.T @ ((U.T @ (y * w)) / s)
    resid = y - X @ coef
    leverage = np.sum(U**2, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        loo = np.where(leverage < 1 - 1e-9, np.abs(resid) / (1 - leverage), np.inf)
    return _Solve(coef, np.abs(resid) / y, loo / y)


def _pick_degree(candidates: dict[int, _Solve]) -> int:
    """The lowest degree within ``_AUTO_SLACK`` of the best mean LOO error. A fit with a point it
    cannot leave out (leverage 1) is passed over; only when every fit has one (a point that
    alone pins them all, such as one far faster than the rest under relative weighting) are the
    degrees compared over the points every fit can leave out."""
    finite = {d: np.isfinite(s.loo_ape) for d, s in candidates.items()}
    whole = [d for d, ok in finite.items() if ok.all()]
    if whole:
        scores = {d: float(np.mean(candidates[d].loo_ape)) for d in whole}
    else:
        shared = np.logical_and.reduce(list(finite.values()))
        if not shared.any():
            n = len(next(iter(candidates.values())).ape)
            raise ValueError(f"degree='auto' needs more points than features, batch_sizes has {n}")
        scores = {d: float(np.mean(s.loo_ape[shared])) for d, s in candidates.items()}
    best = min(scores.values())
    return min(d for d, v in scores.items() if v <= best * (1 + _AUTO_SLACK) + 1e-12)


@dataclass(frozen=True, slots=True)
class ServiceProfile:
    """Fitted S(batch size, resource) in seconds; build it with :meth:`fit`.

    A profile fitted without resources (or where all were equal) is one-dimensional:
    ``resource_range`` is None or a single value, and predictions accept ``resource`` only if it
    is None or that value. ``fit_mape`` and ``fit_max_ape`` are the in-sample mean and largest
    absolute percentage errors, ``loo_mape`` the leave-one-out one (inf without spare points),
    all as fractions.
    """

    degree: int
    exponents: tuple[tuple[int, int], ...]
    coef: tuple[float, ...]
    batch_scale: float
    inv_resource_scale: float | None
    batch_range: tuple[float, float]
    resource_range: tuple[float, float] | None
    n_points: int
    fit_mape: float
    fit_max_ape: float
    loo_mape: float
    floor_s: float = DEFAULT_FLOOR_S

    @classmethod
    def fit(
        cls,
        batch_sizes: ArrayLike,
        resources: ArrayLike | None,
        seconds: ArrayLike,
        *,
        degree: int | Literal["auto"] = 2,
        max_degree: int = 3,
        relative: bool = True,
        floor_s: float = DEFAULT_FLOOR_S,
    ) -> ServiceProfile:
        """Fit by (relative) least squares; ``degree="auto"`` picks 1..max_degree by LOO MAPE."""
        b, r, y = _fit_inputs(batch_sizes, resources, seconds)
        check_floor(floor_s)
        degrees = _degrees(degree, max_degree)
        two_d = r is not None and bool(np.ptp(r) > 0)
        b_scale = float(b.max())
        u = 1.0 / r if r is not None else np.ones_like(b)
        u_scale = float(u.max()) if two_d else None
        solves = _solve_degrees(b / b_scale, u / (u_scale or 1.0), y, degrees, two_d, relative)
        chosen = _pick_degree(solves) if degree == "auto" else degrees[0]
        sol = solves[chosen]
        return cls(
            degree=chosen,
            exponents=_exponents(chosen, two_d),
            coef=tuple(float(c) for c in sol.coef),
            batch_scale=b_scale,
            inv_resource_scale=u_scale,
            batch_range=(float(b.min()), b_scale),
            resource_range=None if r is None else (float(r.min()), float(r.max())),
            n_points=int(b.size),
            fit_mape=float(np.mean(sol.ape)),
            fit_max_ape=float(np.max(sol.ape)),
            loo_mape=float(np.mean(sol.loo_ape)),
            floor_s=floor_s,
        )

    def predict(self, batch_size: ArrayLike, resource: ArrayLike | None = None) -> Array:
        """Predicted seconds broadcast over the inputs (0-d for scalars), clipped to ``floor_s``."""
        b = _positive_array("batch_size", batch_size)
        u = self._scaled_inverse_resource(resource)
        X = _design(b / self.batch_scale, u, self.exponents)
        return np.maximum(X @ np.asarray(self.coef), self.floor_s)

    def service_times(self, max_batch: int, resource: float | None = None) -> Array:
        """``S_1 .. S_max_batch`` at ``resource``: positive, non-decreasing (running maximum)."""
        _check_count("max_batch", max_batch)
        raw = self.predict(np.arange(1, int(max_batch) + 1), resource)
        return monotone_service_times(raw, self.floor_s)

    def mape(
        self, batch_sizes: ArrayLike, resources: ArrayLike | None, seconds: ArrayLike
    ) -> float:
        """Mean absolute percentage error (a fraction) of :meth:`predict` on held-out points."""
        y = _positive_vector("seconds", seconds)
        pred = self.predict(np.asarray(batch_sizes, dtype=np.float64), resources)
        return float(np.mean(np.abs(pred - y) / y))

    def _scaled_inverse_resource(self, resource: ArrayLike | None) -> Array:
        if self.inv_resource_scale is None:
            self._check_one_d_resource(resource)
            return np.ones(())
        if resource is None:
            raise ValueError(f"resource is required: the profile spans {self.resource_range}")
        return (1.0 / _positive_array("resource", resource)) / self.inv_resource_scale

    def _check_one_d_resource(self, resource: ArrayLike | None) -> None:
        if resource is None or self.resource_range is None:
            return
        if not np.allclose(resource, self.resource_range[0]):
            raise ValueError(
                f"resource={resource!r} differs from the single resource "
                f"{self.resource_range[0]} this profile was measured at"
            )


def _fit_inputs(
    batch_sizes: ArrayLike, resources: ArrayLike | None, seconds: ArrayLike
) -> tuple[Array, Array | None, Array]:
    """Checked (batch sizes, resources or None, seconds), all of one length."""
    b = _positive_vector("batch_sizes", batch_sizes)
    y = _positive_vector("seconds", seconds)
    r = None if resources is None else _positive_vector("resources", resources)
    for name, arr in (("seconds", y), ("resources", r)):
        if arr is not None and arr.size != b.size:
            raise ValueError(f"{name} has {arr.size} values but batch_sizes has {b.size}")
    return b, r, y


def _degrees(degree: int | str, max_degree: int) -> list[int]:
    if degree == "auto":
        _check_count("max_degree", max_degree)
        return list(range(1, max_degree + 1))
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ValueError(f"degree must be an integer >= 1 or 'auto', got {degree!r}")
    return [degree]


def _solve_degrees(
    b: Array, u: Array, y: Array, degrees: list[int], two_d: bool, relative: bool
) -> dict[int, _Solve]:
    """One solve per degree; a single degree must succeed, 'auto' skips the impossible ones."""
    out: dict[int, _Solve] = {}
    for d in degrees:
        exps = _exponents(d, two_d)
        if len(exps) > b.size:
            if len(degrees) == 1:
                raise ValueError(
                    f"degree={d} needs at least {len(exps)} points, batch_sizes has {b.size}"
                )
            continue
        sol = _solve(_design(b, u, exps), y, relative)
        if sol is None and len(degrees) == 1:
            raise ValueError(
                f"degree={d} is not identifiable from these points: add distinct batch sizes "
                "or resources, or lower the degree"
            )
        if sol is not None:
            out[d] = sol
    if not out:
        raise ValueError(f"no degree in {degrees} fits {b.size} points")
    return out


# ----------------------------------------------------------------------------- measured tables


@dataclass(frozen=True, slots=True)
class TableProfile:
    """Measured seconds per batch size at one resource, read by :func:`interpolate_batches`."""

    batch_sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    resource: float | None = None
    floor_s: float = DEFAULT_FLOOR_S

    def __post_init__(self) -> None:
        if len(self.batch_sizes) != len(self.seconds):
            raise ValueError(
                f"seconds has {len(self.seconds)} values but batch_sizes has "
                f"{len(self.batch_sizes)}"
            )
        sizes = _positive_vector("batch_sizes", self.batch_sizes)
        _positive_vector("seconds", self.seconds)
        if np.any(np.diff(sizes) <= 0):
            raise ValueError(f"batch_sizes must be strictly increasing, got {self.batch_sizes}")
        check_floor(self.floor_s)

    @classmethod
    def from_mapping(
        cls, seconds_by_batch: Mapping[int, float], resource: float | None = None
    ) -> TableProfile:
        """Build from ``{batch_size: seconds}`` in any order."""
        if not seconds_by_batch:
            raise ValueError("seconds_by_batch must not be empty")
        sizes = sorted(seconds_by_batch)
        return cls(tuple(sizes), tuple(float(seconds_by_batch[k]) for k in sizes), resource)

    def predict(self, batch_size: ArrayLike, resource: float | None = None) -> Array:
        """Measured seconds where measured, interpolated elsewhere (see the module docstring)."""
        if resource is not None and self.resource is not None and resource != self.resource:
            raise ValueError(f"resource={resource!r} differs from the table's {self.resource}")
        b = _positive_array("batch_size", batch_size)
        return interpolate_batches(self.batch_sizes, self.seconds, b)

    def service_times(self, max_batch: int, resource: float | None = None) -> Array:
        """``S_1 .. S_max_batch``: positive, non-decreasing (running maximum)."""
        _check_count("max_batch", max_batch)
        raw = self.predict(np.arange(1, int(max_batch) + 1), resource)
        return monotone_service_times(raw, self.floor_s)
