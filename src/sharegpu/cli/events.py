"""`sharegpu events`: what the agent noticed and decided, once or followed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from sharegpu.cli.render import Format, OutputOpt, emit, is_document, stream

if TYPE_CHECKING:
    from sharegpu.agent.events import Event

app = typer.Typer()


@app.command(
    help="List what the agent noticed and decided: tenants created, resized, recovered and reaped, "
    "audit findings, QoS decisions. Needs a running agent.\n\n"
    "Example: sharegpu events --kind audit --limit 20"
)
def events(  # noqa: PLR0917 (typer maps parameters to options)
    output: OutputOpt = Format.table,
    kind: Annotated[
        str | None, typer.Option("--kind", help="A kind (tenant.resized) or a family (tenant, audit).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many (the latest).")] = 50,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's events.")] = None,
    since: Annotated[int | None, typer.Option("--since", help="Only events after this id.")] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep printing new events (json: a line each, yaml: a document each)."
        ),
    ] = False,
) -> None:
    from sharegpu.agent.client import socket_path
    from sharegpu.doors import agent_client, tenant_service
    from sharegpu.errors import AgentError
    from sharegpu.tenant import runtime_dir

    if not 1 <= limit <= 10_000:
        raise typer.BadParameter(f"{limit} is not between 1 and 10000", param_hint="--limit")
    with tenant_service() as service:
        client = agent_client(service)
        if client is None:
            raise AgentError(
                f"no agent answers on {socket_path(runtime_dir())}: events are kept by the agent "
                "(start it with `sharegpu agent`)"
            )
        items, last = client.events(since=since, kind=kind, tenant=tenant, limit=limit)
        _show(items, output, follow)
        while follow:
            items, last = client.events(since=last, kind=kind, tenant=tenant, limit=1000, wait=25)
            _show(items, output, follow)


def _show(items: list[Event], output: Format, follow: bool) -> None:
    """The events as one EventList, or followed: each as it comes."""
    if follow and is_document(output):
        for e in items:
            stream(output, e.model_dump(mode="json"))
        return
    emit(output, "EventList", [e.model_dump(mode="json") for e in items], lambda wide: _lines(items))


def _lines(items: list[Event]) -> str | None:
    import time

    lines = []
    for e in items:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time))
        who = f" [{e.tenant}]" if e.tenant else ""
        level = "" if e.severity == "info" else f" {e.severity.upper()}"
        lines.append(f"{e.id:>6} {when} {e.kind}{level}{who} {e.message}")
    return "\n".join(lines) or None
