"""A small synchronous client of the agent's API over its Unix socket, for the CLI.

``AgentClient.connect(runtime_dir)`` returns None when no agent answers quickly, so callers fall
back to working on the runtime directory directly. An error answer becomes the exception class
the agent raised (sharegpu.errors), with the agent's one-line message: a command fails the same
way, with the same exit status, through the agent or without it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from sharegpu.agent.events import Event
from sharegpu.agent.models import ERROR_CODES, EventList, GpuList, GpuView, Health, TenantList, TenantView
from sharegpu.errors import (
    AgentError,
    SharegpuError,
    SpecError,
)

SOCKET_NAME = "agent.sock"
NO_AGENT_ENV = "SHAREGPU_NO_AGENT"  # set to 1: never talk to an agent (direct mode)

# The server's codes back to its classes ("error", the catch-all, stays an AgentError here).
_ERRORS: dict[str, type[SharegpuError]] = {
    code: cls for cls, _status, code in ERROR_CODES if cls is not SharegpuError
} | {"bad_json": SpecError}


def socket_path(runtime_dir: Path) -> Path:
    return runtime_dir / SOCKET_NAME


class AgentClient:
    """The agent's API as methods; models in, models out."""

    def __init__(self, sock: Path, *, timeout: float = 60.0) -> None:
        self.sock = sock
        self._http = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sock)),
            base_url="http://agent",
            timeout=httpx.Timeout(timeout, connect=2.0),
        )

    @classmethod
    def connect(cls, runtime_dir: Path, *, timeout: float = 1.0) -> AgentClient | None:
        """A client of the agent of `runtime_dir`, or None when none answers within `timeout`."""
        if os.environ.get(NO_AGENT_ENV, "") not in ("", "0"):
            return None
        sock = socket_path(runtime_dir)
        if not sock.exists() or not _accepts(sock, timeout):
            return None  # no agent, or a socket file left by one that died
        client = cls(sock)
        try:
            response = client._http.get("/v1/health", timeout=timeout)
        except httpx.HTTPError:
            client.close()
            return None
        if response.status_code != 200:
            client.close()
            return None
        return client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as err:
            raise AgentError(f"the agent on {self.sock} did not answer {method} {path} in time") from err
        except httpx.HTTPError as err:
            raise AgentError(f"cannot reach the agent on {self.sock}: {err}") from err
        if response.is_success:
            return response
        try:
            body = response.json()["error"]
            code, message = str(body["code"]), str(body["message"])
        except (ValueError, KeyError, TypeError):
            # Not one of our error bodies (a route that does not exist, a redirect): say what
            # was asked, never the HTTP framework's leftovers alone.
            code = "error"
            message = f"the agent has no answer for {method} {path} (HTTP {response.status_code})"
        raise _ERRORS.get(code, AgentError)(message)

    # -- routes ----------------------------------------------------------------------------------

    def health(self) -> Health:
        return Health.model_validate(self._request("GET", "/v1/health").json())

    def list_tenants(self) -> list[TenantView]:
        return TenantList.model_validate(self._request("GET", "/v1/tenants").json()).items

    def get_tenant(self, tenant_id: str) -> TenantView:
        return TenantView.model_validate(self._request("GET", f"/v1/tenants/{_quote(tenant_id)}").json())

    def create_tenant(self, request: dict[str, Any]) -> TenantView:
        """POST /v1/tenants with the fields of `TenantCreate` (validated by the agent)."""
        return TenantView.model_validate(self._request("POST", "/v1/tenants", json=request).json())

    def resize_tenant(self, tenant_id: str, changes: dict[str, Any]) -> TenantView:
        """PATCH /v1/tenants/{id} with the fields of `TenantResize` that change."""
        response = self._request("PATCH", f"/v1/tenants/{_quote(tenant_id)}", json=changes)
        return TenantView.model_validate(response.json())

    def delete_tenant(self, tenant_id: str, *, incarnation: int | None = None, force: bool = False) -> None:
        params = {"force": str(force).lower()}
        if incarnation is not None:
            params["incarnation"] = str(incarnation)
        self._request("DELETE", f"/v1/tenants/{_quote(tenant_id)}", params=params)

    def list_gpus(self) -> list[GpuView]:
        return GpuList.model_validate(self._request("GET", "/v1/gpus").json()).items

    def events(
        self,
        *,
        since: int | None = None,
        kind: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        wait: float = 0.0,
    ) -> tuple[list[Event], int]:
        """Events (oldest first) and the id to pass as `since` next time."""
        params: dict[str, str | int | float] = {"limit": limit}
        if since is not None:
            params["since"] = since
            params["wait"] = wait
        if kind:
            params["kind"] = kind
        if tenant:
            params["tenant"] = tenant
        timeout = httpx.Timeout(wait + 30.0, connect=2.0)
        body = EventList.model_validate(
            self._request("GET", "/v1/events", params=params, timeout=timeout).json()
        )
        return body.items, body.last_id


def _accepts(sock: Path, timeout: float) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(str(sock))
        except OSError:
            return False
    return True


def _quote(tenant_id: str) -> str:
    return quote(tenant_id, safe="")
