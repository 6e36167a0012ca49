"""The zoo model behind BentoML, tuned as its documentation offers: adaptive batching of at
most ``PEER_MAX_BATCH`` rows that keeps each request's latency under ``PEER_SLO_MS`` (BentoML
refuses what its batcher expects to miss it, 503), and a bound of ``PEER_CONCURRENCY``
requests in the service at once (503 beyond it), one worker process.

Runs in its own environment, with BentoML, onnxruntime and numpy installed (:mod:`bench.peers`
makes it): ``PEER_MODEL=PATH bentoml serve bentoml_app:Zoo --port PORT`` from this folder.
``POST /predict`` takes ``{"input": [[64 floats]]}`` (a batch of one row) and answers the
output rows.
"""

from __future__ import annotations

import os

import bentoml
import numpy as np
import onnxruntime as ort

SLO_MS = int(os.environ.get("PEER_SLO_MS", "200"))


@bentoml.service(
    workers=1,
    traffic={"timeout": 30, "max_concurrency": int(os.environ.get("PEER_CONCURRENCY", "64"))},
    logging={"access": {"enabled": False}},  # as the other systems run
)
class Zoo:
    def __init__(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            os.environ["PEER_MODEL"], options, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name

    @bentoml.api(
        batchable=True,
        max_batch_size=int(os.environ.get("PEER_MAX_BATCH", "16")),
        max_latency_ms=SLO_MS,
    )
    def predict(self, input: np.ndarray) -> np.ndarray:
        return self._session.run(None, {self._input: input.astype(np.float32)})[0]
