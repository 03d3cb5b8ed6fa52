"""The agent's HTTP/JSON API (FastAPI), served on a Unix socket; OpenAPI at /openapi.json.

Every error is ``{"error": {"code": "...", "message": "one line"}}``; each of our exception
classes has one status and code (models.ERROR_CODES), which the client maps back to the same class.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, get_args

from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sharegpu import __version__
from sharegpu.agent.events import EventKind
from sharegpu.agent.models import (
    ERROR_CODES,
    ErrorBody,
    EventList,
    GpuList,
    Health,
    LoopHealth,
    TenantCreate,
    TenantList,
    TenantResize,
    TenantView,
    VersionInfo,
)
from sharegpu.agent.service import AgentService, validation_message
from sharegpu.errors import (
    SharegpuError,
    SpecError,
)
from sharegpu.regions import abi

log = logging.getLogger("sharegpu.agent")

API_VERSION = "v1"

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (400, "The body is not valid JSON"),
        (404, "No such tenant"),
        (409, "Refused by admission, or in conflict with the tenant's state"),
        (422, "Invalid input (size, share, policy, GPU, ...)"),
        (503, "GPU discovery (NVML) failed"),
    )
}

_KINDS: tuple[str, ...] = get_args(EventKind)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"code": code, "message": message}})


def error_of(err: SharegpuError) -> tuple[int, str]:
    for cls, status, code in ERROR_CODES:
        if isinstance(err, cls):
            return status, code
    return 500, "error"


def _check_kind(kind: str | None) -> None:
    if kind is None:
        return
    prefix = kind.rstrip(".")
    if not any(k == prefix or k.startswith(prefix + ".") for k in _KINDS):
        families = sorted({k.split(".")[0] for k in _KINDS})
        raise SpecError(
            f"unknown event kind {kind!r}: use a kind like tenant.created or a family ({', '.join(families)})"
        )


def build_app(service: AgentService) -> FastAPI:
    app = FastAPI(
        title="sharegpu agent",
        version=__version__,
        description="The node agent of sharegpu: tenants (vGPUs), GPUs and events of one node. "
        "Served on a Unix socket (<runtime-dir>/agent.sock). See docs/agent.md.",
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(SharegpuError)
    async def _ours(_request: Request, err: SharegpuError) -> JSONResponse:
        status, code = error_of(err)
        if status >= 500:
            log.error("%s: %s", code, err)
        return error_response(status, code, str(err))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        errors = list(err.errors())
        if errors and errors[0].get("type") == "json_invalid":
            return error_response(400, "bad_json", validation_message(errors))
        return error_response(422, "invalid_request", validation_message(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, f"http_{err.status_code}")
        return error_response(err.status_code, code, str(err.detail))

    @app.middleware("http")
    async def _guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        # A bug must still answer with one clear line, and never take the agent down.
        try:
            return await call_next(request)
        except Exception as err:
            log.exception("internal error on %s %s", request.method, request.url.path)
            return error_response(500, "internal", f"internal error: {type(err).__name__}: {err}")

    @app.get("/v1/health", tags=["agent"])
    async def health() -> Health:
        return Health(
            status="ok",
            version=__version__,
            pid=os.getpid(),
            uptime_seconds=round(time.time() - service.started, 3),
            runtime_dir=str(service.root),
            allow_overcommit=service.allow_overcommit,
            enforce=service.enforce,
            tenants=service.tenant_count(),
            gpus=len(service.known_gpus or []),
            loops={
                name: LoopHealth(
                    interval_s=s.interval_s,
                    ticks=s.ticks,
                    errors=s.errors,
                    last_tick=s.last_tick,
                    last_error=s.last_error,
                    cpu_seconds=None if s.cpu_seconds is None else round(s.cpu_seconds, 6),
                )
                for name, s in service.loops.items()
            },
        )

    @app.get("/v1/version", tags=["agent"])
    async def version() -> VersionInfo:
        return VersionInfo(version=__version__, api=API_VERSION, abi=f"{abi.ABI_MAJOR}.{abi.ABI_MINOR}")

    @app.get("/v1/tenants", tags=["tenants"], responses=_ERROR_RESPONSES)
    async def list_tenants() -> TenantList:
        return TenantList(items=await service.list_tenants())

    @app.post("/v1/tenants", status_code=201, tags=["tenants"], responses=_ERROR_RESPONSES)
    async def create_tenant(body: TenantCreate, response: Response) -> TenantView:
        view = await service.create(body)
        response.headers["Location"] = f"/v1/tenants/{view.id}"
        return view

    @app.get("/v1/tenants/{tenant_id}", tags=["tenants"], responses=_ERROR_RESPONSES)
    async def get_tenant(tenant_id: str) -> TenantView:
        return await service.get_tenant(tenant_id)

    @app.patch("/v1/tenants/{tenant_id}", tags=["tenants"], responses=_ERROR_RESPONSES)
    async def resize_tenant(tenant_id: str, body: TenantResize) -> TenantView:
        return await service.resize(tenant_id, body)

    @app.delete("/v1/tenants/{tenant_id}", status_code=204, tags=["tenants"], responses=_ERROR_RESPONSES)
    async def delete_tenant(
        tenant_id: str,
        force: Annotated[bool, Query(description="Delete even with live processes")] = False,
        incarnation: Annotated[
            int | None,
            Query(
                ge=0, lt=2**64, description="Only this incarnation of the tenant (its view's `incarnation`)"
            ),
        ] = None,
    ) -> Response:
        await service.delete(tenant_id, incarnation=incarnation, force=force)
        return Response(status_code=204)

    @app.get("/v1/gpus", tags=["gpus"], responses=_ERROR_RESPONSES)
    async def list_gpus() -> GpuList:
        return GpuList(items=await service.list_gpus())

    @app.get("/v1/events", tags=["events"], responses=_ERROR_RESPONSES)
    async def list_events(
        since: Annotated[int | None, Query(ge=0, le=2**62, description="Only events after this id")] = None,
        kind: Annotated[
            str | None, Query(max_length=64, description="A kind (tenant.created) or a family (audit)")
        ] = None,
        tenant: Annotated[str | None, Query(max_length=64)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
        wait: Annotated[
            float, Query(ge=0, le=60, description="With since: wait up to this many seconds for new events")
        ] = 0.0,
    ) -> EventList:
        _check_kind(kind)
        items = await service.events(since=since, kind=kind, tenant=tenant, limit=limit, wait=wait)
        last = items[-1].id if items and items[-1].id is not None else (since or 0)
        return EventList(items=items, last_id=last)

    return app
