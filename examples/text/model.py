"""A text model for raysrv's string inputs: each text as a 64-dimensional unit vector.

Its words and pairs of adjacent words are hashed into 64 signed buckets and the vector scaled to
length one (scikit-learn's ``HashingVectorizer``): texts that share words point the same way,
and the model needs no training data, so nothing is downloaded. Served with ``runtime: python``
and ``input: {dtype: string}``; ``examples/text/config.yaml`` serves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DIMENSIONS = 64


class HashedEmbedding:
    """``{"embedding": [64 floats], "words": n}`` for each text of a batch."""

    def __init__(self, dimensions: int = DIMENSIONS) -> None:
        from sklearn.feature_extraction.text import HashingVectorizer

        self._vectorizer = HashingVectorizer(
            n_features=dimensions, ngram_range=(1, 2), alternate_sign=True, norm="l2"
        )

    def predict_batch(self, inputs: Sequence[str]) -> list[dict[str, Any]]:
        vectors = self._vectorizer.transform(list(inputs)).toarray()
        return [
            {"embedding": vector.tolist(), "words": len(text.split())}
            for vector, text in zip(vectors, inputs, strict=True)
        ]
