"""The `sharegpu` command, a module per noun:

- tenant: `run`, `create`, `get`, `delete`, `resize`: one tenant at a time
- node: `devices`, `tenants`, `status`, `top`: what the node holds
- events: `events`: what the agent noticed and decided
- ops: `doctor`, `support-bundle`: looking after the node
- agent: `agent`, `upgrade`: the node agent and its shim
- cdi: `cdi generate`, `hook create|poststop`: containers
- simgpu: `simgpu env|rootfs|reset`, `demo`: the simulated GPU
- simulate: `simulate`: placement replayed on a pod trace
- render: the one `-o/--output table|wide|json|yaml` and all printing of data

Every deliberate error (sharegpu.errors) is printed as one line, ``sharegpu: error: ...``, with
exit status 2 for bad input, 127 for a command that does not exist and 1 for anything
else; a traceback only with SHAREGPU_DEBUG=1.
JSON and YAML output is stable for scripts and carries ``"version": 1``.
"""

from __future__ import annotations

import os
import sys

import typer

from sharegpu import __version__
from sharegpu.cli import agent, cdi, events, node, ops, simgpu, simulate, tenant
from sharegpu.errors import SharegpuError

app = typer.Typer(
    name="sharegpu",
    help="Share one NVIDIA GPU between many containers: memory caps and compute shares per tenant.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
# The nouns' commands, in the order `sharegpu --help` lists them (groups after commands).
for part in (tenant, node, events, ops, agent, simgpu, simulate, cdi):
    app.registered_commands += part.app.registered_commands
    app.registered_groups += part.app.registered_groups


@app.command(help="Print the version.")
def version() -> None:
    print(f"sharegpu {__version__}")


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except SharegpuError as err:
        if os.environ.get("SHAREGPU_DEBUG"):
            raise
        print(f"sharegpu: error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as err:  # usage errors: bad flag, missing option, no such command
        ctx = getattr(err, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        message = err.format_message() if hasattr(err, "format_message") else str(err)
        print(f"sharegpu: error: {message}{hint}", file=sys.stderr)
        sys.exit(getattr(err, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)
