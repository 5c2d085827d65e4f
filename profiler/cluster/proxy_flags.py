"""The `ppd proxy` flags a cluster's launcher starts its proxy with, and their check before any
node starts (`ppd cluster up --with-proxy`): the proxy's configuration is built from the same
flags, by the proxy's own code (`proxy.config.preflight`), against a provisional cluster.json of the
planned nodes - so a misspelt policy or a missing table costs a second, not a start-up.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.cluster import procs
from profiler.cluster.plan import (
    CLUSTER_FILE,
    ClusterConfig,
    ClusterError,
    cluster_document,
    node_url,
    plan_nodes,
)

if TYPE_CHECKING:
    from proxy.config.settings import ProxyConfig


def proxy_arguments(cluster_file: Path, policy: str | None, port: int, host: str,
                    tokenizer: Path | None = None, extra_args: Sequence[str] = ()) -> list[str]:
    """`ppd proxy`'s arguments for a cluster (extra_args last: the user's flags win)."""
    argv = ["--cluster", str(cluster_file), "--host", host, "--port", str(port)]
    if policy is not None:
        argv += ["--policy", policy]
    if tokenizer is not None:
        argv += ["--tokenizer", str(tokenizer)]
    return argv + list(extra_args)


def check_proxy(config: ClusterConfig, policy: str | None, port: int,
                extra_args: Sequence[str] = ()) -> ProxyConfig:
    """The configuration of the proxy `start_proxy` would start in front of `config`'s nodes;
    ClusterError if it would refuse its flags or files, or its port is taken. Nothing is
    started."""
    from proxy.config.preflight import (
        check_proxy_args,  # the proxy's config code: only with a proxy
    )

    if not procs.port_free(config.host, port):
        raise ClusterError(f"proxy port {port} is in use; choose another --proxy-port "
                           "(no node was started)")
    with tempfile.TemporaryDirectory(prefix="ppd-proxy-check-") as tmp:
        planned = [(node.role, node_url(config, node), 0, Path(tmp) / f"{node.name}.log")
                   for node in plan_nodes(config)]
        cluster_file = Path(tmp) / CLUSTER_FILE
        cluster_file.write_text(json.dumps(
            cluster_document(config.model, config.layout, planned, config.connector)))
        try:
            return check_proxy_args(proxy_arguments(cluster_file, policy, port, config.host,
                                                    extra_args=extra_args))
        except ValueError as exc:  # ConfigError, TableError, a bad cost file
            raise ClusterError(f"the proxy would refuse this configuration: {exc} (no node "
                               "was started; --policy and --proxy-args are the proxy's flags, "
                               "`ppd proxy --help` lists them)") from None
