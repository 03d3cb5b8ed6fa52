"""The docs' examples, checked: every `sharegpu ...` command the README and docs/ show parses
against the CLI as it is (a renamed command or option fails here, not in a reader's shell), the
README's quick tour runs verbatim on the simulated GPU, and every YAML and Python block is read
by what reads it in sharegpu (the agent's configuration, the pod request reader, the placement
API). The gpu-check report in docs/gpu-check.md is an outline with elisions (…), not a file."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

# typer vendors its own copy of click (typer._click): its errors are not click's.
from typer._click.exceptions import BadOptionUsage, ClickException, MissingParameter

from conftest import REPO, Sim

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

# An invocation: `sharegpu` (or a path ending in it) followed by a subcommand word.
INVOCATION = re.compile(r"(?:^|[\s\"'(`])(?:[\w./-]*/)?sharegpu\s+([a-z][\w-]*(?:[^\n`]*))")
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
SHELL = ("sh", "bash", "console", "shell")  # fenced blocks of commands; unlabelled ones are output
SPAN = re.compile(r"`([^`\n]*\bsharegpu\s+[a-z][^`\n]*)`")
# Written as a synopsis or a sketch, not a command line: [optional] parts, A|B choices, elisions,
# placeholders in capitals or angle brackets.
SKETCH = re.compile(r"\[[-a-z]|\.\.\.|…|<[a-z]|\b[A-Z]{3,}\b(?![=/])|\{")


def _command_lines(text: str) -> list[tuple[str, bool]]:
    """The command lines of a document, each with whether it is whole: the lines of fenced
    shell blocks (continuations joined) are; inline code spans often name a command with only
    the options the sentence is about, so their required arguments are not asked for."""
    found = []
    for language, block in FENCE.findall(text):
        if language.strip() in SHELL:
            found += [(line, True) for line in block.replace("\\\n", " ").splitlines()]
    found += [(span, False) for span in SPAN.findall(text)]
    return found


def _invocations(line: str) -> list[list[str]]:
    line = re.sub(r"\s#.*$", "", line)  # a comment
    found = []
    for match in INVOCATION.finditer(line):
        rest = re.split(r"\s(?:\||&&|;|&|\)|>|2>)\s?|\)\"|\"\)|\s--\s", " " + match.group(1) + " ")[0]
        rest = rest.strip().rstrip('")`')
        if SKETCH.search(rest):
            continue
        try:
            words = shlex.split(rest)
        except ValueError:
            continue  # a quote opened on another line: not a whole command
        found.append(words)
    return found


def examples() -> list[tuple[str, list[str], bool]]:
    found = []
    for doc in DOCS:
        for line, whole in _command_lines(doc.read_text()):
            for words in _invocations(line):
                found.append((f"{doc.relative_to(REPO)}: sharegpu {' '.join(words)}", words, whole))
    return found


def _parse(command: Any, words: list[str], whole: bool, parent: Any = None) -> None:
    """Parse `words` as click would before running the command (options, their values and
    choices, subcommands), running nothing; a fragment (not `whole`) may leave out required
    arguments and name an option without its value ("`sharegpu run --compute`"), nothing else."""
    try:
        ctx = command.make_context(command.name or "sharegpu", list(words), parent=parent)
    except MissingParameter:
        if whole:
            raise
        return
    except BadOptionUsage as err:
        if whole or "requires an argument" not in err.format_message():
            raise
        return
    if hasattr(command, "resolve_command"):  # a group
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if rest:
            name, sub, args = command.resolve_command(ctx, rest)
            assert sub is not None, f"no command {name}"
            _parse(sub, args, whole, ctx)


def test_the_docs_show_sharegpu_commands() -> None:
    # The extraction itself: the README's quick tour alone has nine.
    found = examples()
    assert len(found) > 40, found
    assert any(words[:1] == ["tenants"] for _, words, _ in found)
    assert sum(whole for _, _, whole in found) > 15  # whole command lines, from shell blocks


@pytest.mark.parametrize(
    ("where", "words", "whole"), examples(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_sharegpu_command_in_the_docs_parses(where: str, words: list[str], whole: bool) -> None:
    from sharegpu.cli import app

    command = typer.main.get_command(app)
    try:
        _parse(command, words, whole)
    except typer.Exit:
        pass  # --help and the like: parsed
    except ClickException as err:
        pytest.fail(f"{where}\n  {err.format_message()}")


def _quick_tour() -> str:
    text = (REPO / "README.md").read_text()
    tour = text[text.index("## Quick tour") :]
    ((_, block),) = FENCE.findall(tour)[:1]
    return block


def test_the_readme_quick_tour_runs_as_is(sim_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Verbatim, with `bash -e`, in a directory laid out like the checkout after `make run`
    (its .venv and src), on simulated GPUs of the size the tour describes (80 GiB)."""
    sim: Sim = sim_factory(memory_mib=80 * 1024)
    here = tmp_path / "checkout"
    here.mkdir()
    (here / ".venv").symlink_to(sys.prefix)  # the venv this test runs in
    (here / "src").symlink_to(REPO / "src")
    done = subprocess.run(
        ["bash", "-e", "-c", _quick_tour()],
        cwd=here,
        env=sim.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    print(done.stdout, done.stderr, sep="\n")
    assert done.returncode == 0, done.stderr
    assert "total=4294967296" in done.stdout  # the program saw a 4 GiB GPU
    assert "alloc=OK\nalloc=CUDA_ERROR_OUT_OF_MEMORY" in done.stdout  # the second refused at the cap
    assert re.search(r"^achieved=0\.(2[89]|3[01])", done.stdout, re.M)  # at most 30% of the card
    assert re.search(r"^ web .* share 30% ", done.stdout, re.M)  # the tenant in the table
    assert "deleted web" in done.stdout
    assert not (sim.runtime / "tenants" / "web").exists()


def _blocks(doc: str, language: str) -> list[str]:
    return [block for lang, block in FENCE.findall((REPO / doc).read_text()) if lang.strip() == language]


def test_the_agent_configuration_example_is_read_as_shown(tmp_path: Path) -> None:
    """docs/agent.md's config file, given to `sharegpu agent --print-config`: every value it
    sets is read, from that file."""
    (block,) = _blocks("docs/agent.md", "yaml")
    config = tmp_path / "config.yaml"
    config.write_text(block)
    done = subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "agent", "--config", str(config), "--print-config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "by-kernel" in done.stdout, done.stdout  # the GPU's own online_preempt
    assert str(config) in done.stdout  # and where it came from


def test_the_pod_example_asks_for_what_the_text_says() -> None:
    """docs/kubernetes.md's pod, read by the request reader the device plugin and the extender
    use: 8 GiB, 60%, burst, online."""
    from sharegpu.kube.request import pod_request

    (pod,) = [yaml.safe_load(b) for b in _blocks("docs/kubernetes.md", "yaml") if "kind: Pod" in b]
    pod["metadata"].update(namespace="shop", uid="0")
    request = pod_request(pod)
    assert request is not None
    (container,) = request.containers
    assert (container.count, container.memory_mib, container.compute_pct) == (1, 8192, 60)
    assert (request.policy, request.priority) == ("burst", "online")


def test_the_placement_example_names_the_api_as_it_is() -> None:
    """docs/placement.md's sketch: its import line runs, and every call it shows exists."""
    (block,) = _blocks("docs/placement.md", "python")
    namespace: dict[str, object] = {}
    exec(block.splitlines()[0], namespace)  # the import line; the rest needs a cluster
    for name in ("ClusterState", "Request", "Priority", "Workload", "place", "plan_preemption"):
        assert name in namespace, name
    state_class = namespace["ClusterState"]
    assert hasattr(state_class, "allocate")


def test_the_api_examples_of_agent_md_run_as_written(sim_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """docs/agent.md's curl examples, every shell block that has one, in order, by bash against
    a running agent: the only change is the socket (`S=`), the test agent's (the `sharegpu`
    lines beside them are checked above; `events --follow` would not end). Each answer is the
    document the text says: the tenant made, read and resized with its fields, the GPUs, the
    events; the delete answers nothing (204)."""
    from agentutil import Agent

    sim = sim_factory(memory_mib=8192)
    blocks = [b for b in _blocks("docs/agent.md", "sh") if "curl" in b or b.startswith("S=")]
    agent = Agent(sim, tmp_path / "state").start()
    try:
        lines = "\n".join(blocks).splitlines()
        script = "\n".join(line for line in lines if not line.startswith("sharegpu "))
        script = script.replace("S=/run/sharegpu/agent.sock", f"S={agent.sock}")
        script = script.replace("curl -s ", "curl -s -w '\\n' ")  # one answer per line
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            env=sim.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        agent.close()
    print(done.stdout, done.stderr, sep="\n")
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) if line else None for line in done.stdout.splitlines()]
    created, read, resized, deleted, gpus, events = answers
    assert (created["id"], created["devices"][0]["policy"], created["labels"]["pod"]) == (
        "web",
        "burst",
        "web-0",
    )
    assert read["id"] == "web"
    assert resized["id"] == "web"
    device = resized["devices"][0]
    assert (device["memory_cap_bytes"], device["compute_share_ratio"]) == (2 << 30, 0.5)  # the PATCH's
    assert deleted is None
    assert gpus["items"]
    assert "items" in events
