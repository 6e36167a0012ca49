"""The zoo model behind LitServe, tuned as its documentation offers: server-side batches of
at most ``--max-batch``, each cut ``--wait-ms`` after its first request, one inference
worker, ZeroMQ between the HTTP server and it (``fast_queue``, LitServe's advice past 100
requests a second), and a request timeout of the SLO (LitServe answers 504 past it).

Runs in its own environment, with LitServe, onnxruntime and numpy installed (:mod:`bench.peers`
makes it): ``python litserve_app.py --model PATH --port PORT``. ``POST /predict`` takes
``{"input": [64 floats]}`` and answers ``{"output": [...]}``.
"""

from __future__ import annotations

import argparse

import litserve as ls
import numpy as np
import onnxruntime as ort


class Zoo(ls.LitAPI):
    def __init__(self, path: str, **batching: float) -> None:
        super().__init__(**batching)
        self._path = path

    def setup(self, device: str) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            self._path, options, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name

    def decode_request(self, request: dict) -> np.ndarray:
        return np.asarray(request["input"], dtype=np.float32)

    def batch(self, inputs: list[np.ndarray]) -> np.ndarray:
        return np.stack(inputs)

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self._session.run(None, {self._input: x})[0]

    def unbatch(self, output: np.ndarray) -> list[np.ndarray]:
        return list(output)

    def encode_response(self, output: np.ndarray) -> dict:
        return {"output": output.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--wait-ms", type=float, default=5.0)
    parser.add_argument("--slo-ms", type=float, default=200.0)
    args = parser.parse_args()
    api = Zoo(args.model, max_batch_size=args.max_batch, batch_timeout=args.wait_ms / 1000.0)
    server = ls.LitServer(
        api, accelerator="cpu", workers_per_device=1, timeout=args.slo_ms / 1000.0, fast_queue=True
    )
    server.run(
        port=args.port,
        host="127.0.0.1",
        num_api_servers=1,
        log_level="warning",
        generate_client_file=False,
    )


if __name__ == "__main__":
    main()
