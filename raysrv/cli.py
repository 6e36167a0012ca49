"""The ``raysrv`` command line.

* ``raysrv validate config.yaml [...] [--no-sources]``: check config files without starting
  Ray: their schema, and that every model file exists and every import path imports (from
  the working directory, as under ``serve run``); ``--no-sources`` skips the latter.
* ``raysrv plan config.yaml``: print the plan of each partitioned model (its stages, predicted
  latency and cost) from a profile of this machine, without starting Ray (a leader on Ray also
  times calls to its shard actors and may choose otherwise; profiles vary a little from run to
  run); deploys nothing.
* ``raysrv run config.yaml [serve run options]``: check the file, then ``serve run`` it with Ray
  Serve's fast path switched on: HAProxy as the HTTP ingress in front of replicas that serve
  HTTP themselves, gRPC for handle calls between replicas, user code on each replica's main
  thread, and HAProxy checked every 2 s rather than 10 s, so that Serve restarts a dead one
  sooner (:data:`FAST_PATH`). Serve reads these settings once, as its controller starts, so a
  config file cannot carry them. A variable already set in the environment wins;
  ``--serve-proxy`` keeps Serve's Python proxy instead. The figures behind the choice:
  ``bench/RESULTS.md``, "The fast path". Serve builds an application wherever its controller
  runs and does not tell the builder which file it came from, so ``raysrv run`` serves a copy
  of the file (in a temporary directory) whose raysrv applications name the file's directory
  as their ``root``: relative model paths are read from beside the file. It says once when
  each app is running; an app that fails to deploy (a model that cannot load, say) ends the
  run with exit status 1 after one line that says why, where plain ``serve run`` would keep
  running.
* ``raysrv dashboard``: print raysrv's Grafana dashboard (:mod:`raysrv.dashboard`) as JSON;
  ``raysrv dashboard push --url URL --token TOKEN``: create or replace it on a Grafana server.
* ``raysrv deploy config.yaml [serve deploy options]``: check the file, then ``serve deploy``
  it to a running Ray cluster (one started by ``ray start --head`` with :data:`FAST_PATH` in
  its environment, for a server that outlives the shell), its relative model paths read from
  beside the file as for ``raysrv run``, and with Ray's token where this machine keeps one
  (``RAY_AUTH_MODE=token``). Deploying again with only the ingress's ``user_config``
  changed applies the live knobs without a restart. ``raysrv run`` refuses to start where
  something already answers on the file's HTTP address: HAProxy would share the port with
  it, and answers would come from either server.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["FAST_PATH", "main", "rooted", "serve_environment"]

FAST_PATH = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # Serve restarts HTTP's front after three failed checks of it: 2 s apart, not 10 s
    "RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S": "2",
}


def _validate(files: Sequence[str], sources: bool = True) -> int:
    from raysrv.validate import validate_file

    if sources and os.getcwd() not in sys.path:  # import paths import as under `serve run`
        sys.path.insert(0, os.getcwd())  # (whose --app-dir is the working directory)
    failed = 0
    for name in files:
        problems = validate_file(name, sources)
        if problems:
            failed += 1
            print(f"{name}: {len(problems)} problem(s)")
            for problem in problems:
                print(f"  {problem}")
        else:
            print(f"{name}: ok")
    return 1 if failed else 0


def _plan(config: str) -> int:
    from raysrv.app import prepare_spec
    from raysrv.config import RaysrvSpec
    from raysrv.partitioning.planner import plan
    from raysrv.validate import BUILDER

    if _validate([config]):
        return 1
    path = Path(config).resolve()
    doc = yaml.safe_load(path.read_text())
    apps = (
        doc.get("applications")
        if "applications" in doc
        else [{"import_path": BUILDER, "args": doc}]
    )
    found = 0
    for app in apps:
        if app.get("import_path") != BUILDER:
            continue
        given = RaysrvSpec.model_validate(app.get("args") or {})
        spec = prepare_spec(given, Path(given.root) if given.root else path.parent)
        for model in spec.models:
            part = model.partition
            if part is None:
                continue
            found += 1
            try:
                chosen = plan(
                    model.source, part.workers, part.memory_limit_mb, part.objective, part.slo_ms
                )
            except ValueError as exc:
                print(f"{model.name}: {exc}")
                return 1
            within = f", slo_ms {part.slo_ms:g}" if part.slo_ms is not None else ""
            print(
                f"{model.name}: objective {part.objective}{within}, {part.workers} workers, "
                f"{part.memory_limit_mb:g} MiB a shard"
            )
            print("  " + chosen.describe().replace("\n", "\n  "))
            largest = chosen.largest_shard_bytes / 2**20
            print(
                f"  predicted cost {chosen.cost_s * 1e3:.2f} ms of busy time a query; "
                f"{len(chosen.worker_shards())} shard workers; largest shard {largest:.2f} MiB"
            )
    if not found:
        print(f"{config}: no model declares partition")
    return 0


def _dashboard(action: str | None, url: str | None, token: str | None, folder: str | None) -> int:
    from raysrv import dashboard

    if action is None:
        print(json.dumps(dashboard.dashboard(), indent=2))
        return 0
    if not url or not token:
        print("raysrv dashboard push: give --url and --token (or GRAFANA_TOKEN)")
        return 2
    answer = dashboard.push(url, token, folder)
    print(f"raysrv dashboard: {answer.get('status', 'pushed')} at {url}{answer.get('url', '')}")
    return 0


def serve_environment(base: Mapping[str, str], serve_proxy: bool) -> dict[str, str]:
    """``base`` with :data:`FAST_PATH` added, unless ``serve_proxy``; ``base``'s values win."""
    return dict(base) if serve_proxy else {**FAST_PATH, **base}


def rooted(doc: dict[str, Any], root: Path) -> dict[str, Any]:
    """The Serve config ``doc`` with ``root`` given to each raysrv application that names none,
    so that its relative model paths are read from ``root`` wherever Serve builds it."""
    from raysrv.validate import BUILDER

    out = copy.deepcopy(doc)
    for app in out.get("applications") or []:
        if app.get("import_path") == BUILDER:
            app["args"] = {"root": str(root), **(app.get("args") or {})}
    return out


def _rooted_copy(config: str) -> tuple[Path, dict[str, Any]]:
    """A copy of the file ``config`` (in a temporary directory, kept for Serve) whose raysrv
    applications read relative model paths from beside the file, and what it holds."""
    path = Path(config).resolve()
    doc = rooted(yaml.safe_load(path.read_text()), path.parent)
    served = Path(tempfile.mkdtemp(prefix="raysrv-")) / path.name
    served.write_text(yaml.safe_dump(doc, sort_keys=False))
    return served, doc


def _serve(args: Sequence[str]) -> int:
    """Serve's own command line, run in this process: its exit status."""
    from ray.serve.scripts import cli

    try:
        cli.main(args=list(args), prog_name="serve")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else 0 if code is None else 1
    return 0


def _run(config: str, serve_proxy: bool, rest: Sequence[str]) -> int:
    os.environ.update(serve_environment(os.environ, serve_proxy))  # before Ray is imported
    if _validate([config]):
        return 1
    served, doc = _rooted_copy(config)
    taken = _answering(doc.get("http_options") or {})
    if taken is not None:
        print(
            f"raysrv run: something already answers on {taken} (another raysrv or Serve?). "
            "A second one would share the port with it, and answers would come from either. "
            f"Stop it first, or change the one running with `raysrv deploy {config}`."
        )
        return 1
    apps = [app["name"] for app in doc.get("applications") or [] if app.get("name")]
    failed, done = threading.Event(), threading.Event()
    threading.Thread(target=_watch, args=(apps, failed, done), daemon=True).start()
    try:
        code = _serve(["run", str(served), *rest])
    finally:
        done.set()
    return 1 if failed.is_set() else code


def _answering(http_options: Mapping[str, Any]) -> str | None:
    """``host:port`` of the config's HTTP address (Serve's defaults where it gives none) if
    something accepts connections there now, else None."""
    host = str(http_options.get("host") or "127.0.0.1")
    port = int(http_options.get("port") or 8000)
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    try:
        with socket.create_connection((reach, port), timeout=1.0):
            return f"{host}:{port}"
    except OSError:
        return None


def _deploy(config: str, rest: Sequence[str]) -> int:
    """``serve deploy`` of the file to a running Ray cluster, checked and rooted as for
    ``raysrv run``, presenting the cluster's token where Ray keeps one on this machine."""
    if "RAY_AUTH_MODE" not in os.environ and _token_here():  # read as Ray is imported
        os.environ["RAY_AUTH_MODE"] = "token"
    if _validate([config]):
        return 1
    served, _ = _rooted_copy(config)
    return _serve(["deploy", str(served), *rest])


def _token_here() -> bool:
    """Whether Ray's token for clusters started on this machine is at hand: in
    ``RAY_AUTH_TOKEN``, at ``RAY_AUTH_TOKEN_PATH``, or in ``~/.ray/auth_token``."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token"
    return Path(path).expanduser().is_file()


def _watch(
    apps: Sequence[str], failed: threading.Event, done: threading.Event, period_s: float = 1.0
) -> None:
    """Until ``done``, say once when each of ``apps`` runs; when one fails to deploy, say why
    in one line and stop the run (Serve's own ``serve run`` would keep running with it
    failed)."""
    import ray
    from ray import serve

    running: set[str] = set()
    while not done.wait(period_s):
        if not ray.is_initialized():
            continue
        try:
            status = serve.status().applications
        except Exception:  # Serve not started yet, or shutting down
            continue
        for name in apps:
            app = status.get(name)
            if app is None:
                continue
            if app.status == "RUNNING" and name not in running:
                running.add(name)
                print(f"raysrv run: app {name!r} is running", flush=True)
            elif app.status == "DEPLOY_FAILED":
                messages = [app.message, *(d.message for d in app.deployments.values())]
                print(f"raysrv run: app {name!r} failed: {failure_line(messages)}", flush=True)
                failed.set()
                os.kill(os.getpid(), signal.SIGINT)  # serve run's own way out: Ctrl-C
                return


def failure_line(messages: Sequence[str]) -> str:
    """The cause of a failed deploy in one line, from Serve's status messages (which hold
    tracebacks): the line of raysrv's own start error if there is one, else the last line
    of the last message that has any."""
    from raysrv._deployments import STARTING

    lines = [line.strip() for text in messages for line in (text or "").splitlines()]
    lines = [line for line in lines if line]
    ours = [line for line in lines if STARTING in line]
    if ours:
        return ours[-1][ours[-1].index(STARTING) :]
    return lines[-1] if lines else "no reason given"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raysrv", description="raysrv model serving tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("validate", help="Check config files without starting Ray.")
    check.add_argument("files", nargs="+", help="Serve config or raysrv spec YAML files.")
    check.add_argument(
        "--no-sources",
        dest="sources",
        action="store_false",
        help="do not look for model files or import model code (a config written for another "
        "machine)",
    )
    plans = commands.add_parser(
        "plan", help="Print each partitioned model's plan, predicted latency and cost."
    )
    plans.add_argument("config", help="Serve config or raysrv spec YAML file.")
    run = commands.add_parser(
        "run",
        help="Check a Serve config file, then `serve run` it behind Serve's HAProxy ingress.",
        description="Any option after the file goes to `serve run` as it is.",
    )
    run.add_argument("config", help="Serve config YAML file.")
    run.add_argument(
        "--serve-proxy",
        action="store_true",
        help="keep Serve's Python proxy and threading (what plain `serve run` does)",
    )
    deploy = commands.add_parser(
        "deploy",
        help="Check a Serve config file, then `serve deploy` it to a running Ray cluster.",
        description="Any option after the file goes to `serve deploy` as it is (--address).",
    )
    deploy.add_argument("config", help="Serve config YAML file.")
    board = commands.add_parser(
        "dashboard",
        help="Print raysrv's Grafana dashboard as JSON, or push it to a Grafana server.",
    )
    board.add_argument("action", nargs="?", choices=["push"], help="push it to --url")
    board.add_argument("--url", help="the Grafana server, e.g. http://localhost:3000")
    board.add_argument(
        "--token",
        default=os.environ.get("GRAFANA_TOKEN"),
        help="a Grafana service account token (default: $GRAFANA_TOKEN)",
    )
    board.add_argument("--folder-uid", help="the Grafana folder to put it in")
    args, rest = parser.parse_known_args(argv)
    if args.command == "run":
        return _run(args.config, args.serve_proxy, rest)
    if args.command == "deploy":
        return _deploy(args.config, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "validate":
        return _validate(args.files, args.sources)
    if args.command == "plan":
        return _plan(args.config)
    if args.command == "dashboard":
        return _dashboard(args.action, args.url, args.token, args.folder_uid)
    parser.error(f"unknown command {args.command}")  # pragma: no cover - argparse exits first
    return 2


if __name__ == "__main__":
    sys.exit(main())
