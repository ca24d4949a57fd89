"""A run on an existing Dask cluster (`--dask-address`): what must hold before the first stage starts.

The workers are other machines. They report their task runs to the flow's Prefect API, so that API must be
one they reach: Prefect hands its URL and auth string to every task it submits (the settings travel with the
task), and a server this run would start itself listens on 127.0.0.1, out of their reach; so a cluster run
without PREFECT_API_URL fails at once. They open the run directory and the files tasks read by absolute path
(every path is made absolute on the flow host at flow start), so each worker checks them on the shared mount
(tasks.runner.shared_paths).
"""
from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from tasks.ingest.source_fs import is_url

from flows.config import PipelineConfig

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ClusterSetupError(RuntimeError):
    """A multi-machine run is set up so that its workers could not do their part; nothing has run."""


def require_api_for_workers(dask_address: str | None, api_url: str | None) -> None:
    """With an external scheduler, a Prefect API named by the user, reachable from the scheduler's network."""
    if not dask_address:
        return
    url = api_url or os.environ.get("PREFECT_API_URL")
    if not url:
        raise ClusterSetupError(f"--dask-address {dask_address} needs a Prefect server every worker reaches: set PREFECT_API_URL "
                                "(and PREFECT_API_AUTH_STRING when it uses basic auth), as infra/README.md shows")
    api_host = urllib.parse.urlsplit(url).hostname or ""
    scheduler_host = urllib.parse.urlsplit(dask_address if "://" in dask_address else f"tcp://{dask_address}").hostname or ""
    if api_host in LOOPBACK and scheduler_host not in LOOPBACK:
        raise ClusterSetupError(f"PREFECT_API_URL {url} is this machine's loopback address, which the workers of {dask_address} "
                                "cannot reach: use the server's network address")


def worker_paths(config: PipelineConfig) -> list[tuple[str, str]]:
    """(what, absolute path) of every file or directory a task opens by path on a worker, besides the run directory."""
    paths = [(f"source {spec.name}", str(spec.root)) for spec in config.source_specs() if not is_url(spec.path)]
    for name in ("langid", "quality_model"):
        model_path = getattr(config, name).model_path
        if model_path:
            paths.append((f"{name}.model_path", model_path))
    base = Path(config.config_dir) if config.config_dir else Path.cwd()
    for spec in config.filters:
        plugin_dir = Path(spec.path) if spec.path else base
        module = spec.function.partition(":")[0].replace(".", "/")
        candidates = [plugin_dir / f"{module}.py", plugin_dir / module / "__init__.py"]
        found = next((c for c in candidates if c.exists()), None)
        if found is not None:  # a plugin installed as a package is found on sys.path, like any dependency
            paths.append((f"filter {spec.name} plugin", str(found)))
    return paths
