"""Every command's output, in one place: the `-o/--output` option and the printing of what a
command built, as a table (`table`, `wide` with more columns where there are more to show) or as
the one document of JSON and YAML, `{"version": 1, "kind": ..., "items": [...]}`
(sharegpu.ops.output), once or watched.

A command builds its items and how to show them to a person; it never picks a format itself.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console, RenderableType

# Piped output (scripts, CI logs) is not cut at 80 columns: tables keep whole UUIDs (the widest,
# `devices -o wide`, is about 240 columns). NO_COLOR (https://no-color.org): no styling at all,
# not even bold; no tty: rich adds none either.
console = Console(
    width=None if sys.stdout.isatty() else 320,
    color_system=None if os.environ.get("NO_COLOR") else "auto",
)


class Format(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


OutputOpt = Annotated[
    Format,
    typer.Option("--output", "-o", help="table, wide (more columns where there are more), json or yaml."),
]
WatchOpt = Annotated[
    bool, typer.Option("--watch", "-w", help="Refresh every --interval seconds until Ctrl-C.")
]
IntervalOpt = Annotated[float, typer.Option("--interval", help="Seconds between refreshes with --watch.")]

# What a person sees: given `wide`, a line of text (printed as is), a rich renderable, or None
# when it printed itself.
Human = Callable[[bool], "str | RenderableType | None"]


def is_document(output: Format) -> bool:
    return output in (Format.json, Format.yaml)


def emit(
    output: Format, kind: str, items: list[dict[str, Any]], human: Human, *, stream: bool = False
) -> None:
    """Print `items` as the document of `kind` (JSON indented, or one line each when `stream`;
    YAML one `---` document), or what `human` makes of them."""
    if is_document(output):
        from sharegpu.ops.output import document

        _print(document(kind, items), output, stream=stream)
        return
    shown = human(output is Format.wide)
    if isinstance(shown, str):
        print(shown, flush=True)
    elif shown is not None:
        console.print(shown)


def stream(output: Format, item: dict[str, Any]) -> None:
    """One item of a followed stream (json or yaml), as it comes: a line of JSON, or a YAML
    document."""
    _print(item, output, stream=True)


def _print(doc: dict[str, Any], output: Format, *, stream: bool) -> None:
    from sharegpu.ops.output import dump

    print(dump(doc, output.value, stream=stream), flush=True)


def show(frame: Callable[[], None], output: Format, watch: bool, interval: float, what: str) -> None:
    """Run `frame` once, or with `watch` every `interval` seconds until Ctrl-C; tables under a
    header naming `what` and the time."""
    from sharegpu.ops.output import watch as watch_frames

    if not watch:
        frame()
        return
    if interval <= 0:
        raise typer.BadParameter(f"{interval:g} is not a positive number of seconds", param_hint="--interval")
    watch_frames(frame, interval, console, header=None if is_document(output) else what)
