"""What a shard actor is sent and answers with: an array as bytes, read back as the same array
(dtype, shape and every element), however it was laid out in memory."""

from __future__ import annotations

import numpy as np
import pytest

from raysrv._partitioned import from_bytes, to_bytes

RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    "x",
    [
        RNG.standard_normal((1, 3, 32, 32)).astype(np.float32),
        RNG.integers(-(2**40), 2**40, size=7),
        np.float64(3.5),
        np.zeros((0, 4), np.uint8),
        np.array([[True, False, True]]),
    ],
    ids=["float32 image", "int64", "0-d", "empty", "bool"],
)
def test_an_array_comes_back_from_its_bytes_as_it_was(x: np.ndarray) -> None:
    back = from_bytes(to_bytes(x))
    assert back.dtype == x.dtype
    assert back.shape == np.shape(x)
    np.testing.assert_array_equal(back, x)


def test_a_strided_view_travels_as_its_elements_in_order() -> None:
    x = np.arange(48, dtype=np.float32).reshape(2, 4, 6)[:, 1:3, ::2]
    assert not x.flags.c_contiguous
    np.testing.assert_array_equal(from_bytes(to_bytes(x)), x)


def test_the_bytes_are_a_short_header_and_the_elements() -> None:
    x = np.ones((2, 5), np.float32)
    assert len(to_bytes(x)) == 8 + 8 * (1 + x.ndim) + x.nbytes
    assert not from_bytes(to_bytes(x)).flags.writeable  # read in place, not copied
