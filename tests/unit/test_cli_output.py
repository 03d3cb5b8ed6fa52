"""The CLI's one output option, read from the command tree itself (no processes): every command
that prints data takes `-o/--output table|wide|json|yaml`, and no command brings back a private
flag (`--json`, `-o table|json`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import pytest
import typer
import yaml
from typer.models import OptionInfo

from sharegpu.cli import app, main
from sharegpu.cli.render import Format, emit

FORMATS = ["table", "wide", "json", "yaml"]

# The commands that print no data: they run something, write a file, or print one line.
NO_DATA = {
    "run",  # runs the command
    "delete",  # "deleted NAME"
    "top",  # a live screen (`tenants`/`devices` print the same data)
    "agent",  # the daemon (`--print-config` prints its settings with their sources)
    "upgrade",
    "demo",
    "version",
    "simgpu env",  # shell exports
    "simgpu rootfs",
    "simgpu reset",
    "hook create",  # run by the container runtime
    "hook poststop",
    "support-bundle",  # writes a tar.gz: its --output is that file
    "cdi generate",  # writes the CDI spec: its --output is that file, or - for stdout
}
# Where `--output` names a file, not a format.
OUTPUT_IS_A_PATH = {"support-bundle", "cdi generate"}


def _commands(group: typer.Typer, prefix: str = "") -> Iterator[tuple[str, Callable[..., Any]]]:
    for command in group.registered_commands:
        assert command.callback is not None
        yield f"{prefix}{command.name or command.callback.__name__.replace('_', '-')}", command.callback
    for sub in group.registered_groups:
        assert sub.typer_instance is not None
        yield from _commands(sub.typer_instance, f"{prefix}{sub.name} ")


COMMANDS = dict(_commands(app))


def _flags(info: OptionInfo) -> set[str]:
    """An option's flags (in `Annotated`, typer takes the first from the place of the default)."""
    first = [info.default] if isinstance(info.default, str) and info.default.startswith("-") else []
    return {*first, *(info.param_decls or ())}


def _option(callback: Callable[..., Any], flag: str) -> tuple[Any, OptionInfo] | None:
    """The type and the typer option of `callback`'s parameter named `flag` on the command line."""
    for hint in get_type_hints(callback, include_extras=True).values():
        if get_origin(hint) is Annotated:
            base, *extras = get_args(hint)
            for info in extras:
                if isinstance(info, OptionInfo) and flag in _flags(info):
                    return base, info
    return None


def test_the_lists_name_real_commands() -> None:
    assert COMMANDS.keys() >= NO_DATA
    assert {"devices", "tenants", "status", "get", "create", "resize", "events", "doctor", "simulate"} <= (
        COMMANDS.keys() - NO_DATA
    )


@pytest.mark.parametrize("name", sorted(COMMANDS.keys() - NO_DATA))
def test_a_command_that_prints_data_takes_the_one_output_option(name: str) -> None:
    option = _option(COMMANDS[name], "-o")
    assert option is not None, f"`sharegpu {name}` prints data but has no -o"
    kind, info = option
    assert kind is Format, f"`sharegpu {name} -o` is not the one Format"
    assert _flags(info) == {"-o", "--output"}
    assert [f.value for f in Format] == FORMATS


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_private_output_flags(name: str) -> None:
    callback = COMMANDS[name]
    assert _option(callback, "--json") is None, f"`sharegpu {name} --json`: use -o json"
    option = _option(callback, "--output") or _option(callback, "-o")
    if option is not None:
        path = name in OUTPUT_IS_A_PATH
        assert (option[0] is not Format) == path, f"`sharegpu {name} -o`: table|wide|json|yaml"


def test_a_bad_format_is_refused_with_the_choices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["sharegpu", "get", "web", "-o", "xml"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("sharegpu: error: ")
    assert "'xml' is not one of 'table', 'wide', 'json', 'yaml'" in line


def test_documents_and_tables(capsys: pytest.CaptureFixture[str]) -> None:
    items = [{"name": "web", "bytes": 1}]
    shown: list[bool] = []

    def human(wide: bool) -> str:
        shown.append(wide)
        return "web: 1 byte"

    emit(Format.json, "TenantList", items, human)
    assert json.loads(capsys.readouterr().out) == {"version": 1, "kind": "TenantList", "items": items}
    emit(Format.json, "TenantList", items, human, stream=True)
    assert capsys.readouterr().out.count("\n") == 1
    emit(Format.yaml, "TenantList", items, human)
    out = capsys.readouterr().out
    assert out.startswith("---\n")
    assert yaml.safe_load(out) == {"version": 1, "kind": "TenantList", "items": items}
    assert shown == []
    emit(Format.table, "TenantList", items, human)
    emit(Format.wide, "TenantList", items, human)
    assert capsys.readouterr().out == "web: 1 byte\nweb: 1 byte\n"
    assert shown == [False, True]


def test_a_rate_is_over_the_time_between_the_two_readings_of_the_counters() -> None:
    """`sharegpu tenants` takes two readings a second apart; the first one imports the views'
    modules before it reads the counters, so the time between the readings' starts was up to
    0.3 s more than between the counters' reads on a loaded VM, and every rate came out 23% low.
    The rate is over the counters' own instants when the views carry them."""
    from sharegpu.agent.models import DeviceView, TenantView
    from sharegpu.ops.output import rates_between

    def view(held: float, at: float | None) -> TenantView:
        device = DeviceView.model_construct(
            uuid="GPU-0", policy="share", held_seconds=held, wait_seconds=0.0, throttled_seconds=0.0
        )
        return TenantView.model_construct(id="a", incarnation=7, devices=[device], counters_monotonic=at)

    exact = rates_between([view(1.0, 100.0)], [view(1.3, 101.0)], 1.3)
    assert exact[("a", "GPU-0")].gpu_time == pytest.approx(0.3)
    unknown = rates_between([view(1.0, None)], [view(1.3, None)], 1.3)  # an older agent's views
    assert unknown[("a", "GPU-0")].gpu_time == pytest.approx(0.3 / 1.3)
