"""The reducer's control plane and metrics (docs/operations.md).

- reducer.control.service: the gRPC control plane (grpc.health.v1.Health + reduction_server.v1.Reducer);
- reducer.control.client: ControlClient, what `reduction-server status` and `drain` use;
- reducer.control.metrics: Prometheus metrics of a reducer; worker_metrics: of a Communicator;
- reducer.control.front, http, loop: the control port's accepting front (connection caps and
  timeouts before the grpc.aio server), the metrics port's bounded HTTP server, the shared event loop;
- reducer.control.lifecycle: a served reducer's life (Lifecycle: serving -> draining -> drained;
  serve_node: `reduction-server serve`, the data plane with the above beside it);
- reducer.control.rows, auth, limits: pure Python parts the above share.

Nothing here is imported by `import reducer`: a worker that never asks for metrics never loads
grpc or prometheus_client.
"""

from __future__ import annotations

import importlib
from typing import Any

_HINT = (
    "it comes with a plain `pip install reduction-server`; in another environment: "
    "pip install grpcio grpcio-health-checking prometheus_client"
)


def _require(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"the reducer control plane needs {package} ({exc}): {_HINT}") from exc


def import_grpc() -> Any:
    """grpc, with the health-checking package checked too (an actionable error if missing)."""
    grpc = _require("grpc", "grpcio")
    _require("grpc_health.v1.health", "grpcio-health-checking")
    return grpc


def import_prometheus() -> Any:
    return _require("prometheus_client", "prometheus_client")
