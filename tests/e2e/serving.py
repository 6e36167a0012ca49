"""A `serve run` (or `raysrv run`) of a config file in a subprocess of its own, for the e2e
tests: started from the repository's root without the fast path's variables of this process,
waited on until healthy, stopped as Ctrl-C stops it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx

from raysrv.cli import FAST_PATH
from tests.conftest import haproxy_ports

__all__ = ["answers", "environment", "finished", "ray_node", "served", "stop"]

ROOT = Path(__file__).parents[2]
STOP_S = 180  # the longest a `serve run` is given to shut down its Ray
NODE_S = 120  # the longest a `ray start` node is given to come up


def environment() -> dict[str, str]:
    """This process's environment without an address or the fast path's variables, and with
    HAProxy's ports of this test session."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", *FAST_PATH)}
    return env | haproxy_ports()


def finished(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    """The exit status and output (stdout and stderr together) of ``argv``, a command that
    should end by itself within ``timeout_s``; whatever it left running is cleared."""
    proc = subprocess.Popen(
        list(argv), cwd=ROOT, env=environment(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out.decode(errors="replace")


@contextlib.contextmanager
def served(argv: Sequence[str], port: int) -> Iterator[str]:
    """The URL of ``argv`` (a `serve run` of a file whose HTTP port is ``port``) once it
    answers ``/healthz``; its output goes to ``serve.log`` beside the file (its last
    argument)."""
    log_path = Path(argv[-1]).parent / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(argv), cwd=ROOT, env=environment(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, proc, log_path)
            yield url
        finally:
            stop(proc)


def _wait_healthy(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 240
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"serve run exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
            )
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"no healthy server after {timeout_s} s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for `serve run` (it shuts down the Ray it started, HAProxy included: about 30 s
    here when idle), then clear its process group: killed sooner, Ray leaves its HAProxy
    running."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@contextlib.contextmanager
def ray_node(
    argv: Sequence[str], log_path: Path, ready: Callable[[], bool], gcs_port: int
) -> Iterator[None]:
    """A `ray start --block` node of a cluster of its own (``argv``), with the fast path's
    variables and Ray's token presented; up once ``ready()``, stopped as Ctrl-C stops it,
    then taken out of the file where Ray notes the machine's running cluster (`ray stop`
    would): left there, a later `serve run` would try to join the dead head."""
    env = environment() | FAST_PATH | {"RAY_AUTH_MODE": "token"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(argv), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + NODE_S
            while not ready():
                if proc.poll() is not None or time.monotonic() > deadline:
                    said = log_path.read_text()[-4000:]
                    raise RuntimeError(f"ray start did not come up:\n{said}")
                time.sleep(1)
            yield
        finally:
            stop(proc)
            noted = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
            with contextlib.suppress(FileNotFoundError):
                if noted.read_text().strip().endswith(f":{gcs_port}"):
                    noted.unlink()


def answers(url: str) -> bool:
    """Whether anything answers at ``url`` (Ray's dashboard asks for its token: a 401 is
    up)."""
    try:
        httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return False
    return True
