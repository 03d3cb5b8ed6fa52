#!/usr/bin/env bash
# The validation run on a real NVIDIA GPU (issue 15), or its dry run on the simulated GPU.
#
#     scripts/gpu-check.sh [--dry-run] [--quick] [--out FILE] [--only STEPS] ...   (--help: all)
#
# 1. Builds the C libraries (gcc and make; no CUDA toolkit needed for them).
# 2. Finds a Python that can run sharegpu: $PYTHON, else the project's .venv for a dry run, else
#    python3 (on a GPU machine, the one with PyTorch). Installs nothing from the network: what
#    that Python lacks comes from wheels carried in .whl/ (`make gpu-wheels` prepares them on a
#    machine with a package registry), installed with pip --no-index into build/gpu-check/site.
# 3. Runs the steps (bench/gpucheck): each in a process of its own, killed at its time limit;
#    one JSON report (--out, default build/gpu-check/report.json) and one table.
# Exit status: 0 every step passed or was skipped with its reason, 1 a step did not pass or the
# set-up failed, 2 bad input.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/build/gpu-check
mkdir -p "$work"

say() { echo "gpu-check: $*" >&2; }

dry=0
for arg in "$@"; do
    [ "$arg" = --dry-run ] && dry=1
done

if [ -n "${PYTHON:-}" ]; then
    py=$PYTHON
elif [ "$dry" = 1 ] && [ -x .venv/bin/python ]; then
    py=.venv/bin/python
elif command -v python3 >/dev/null; then
    py=$(command -v python3)
else
    say "no python3 found (set PYTHON=...)"
    exit 1
fi

for tool in gcc make; do
    command -v "$tool" >/dev/null || { say "$tool is needed to build the C libraries and is not installed"; exit 1; }
done
if ! timeout 300 make -s -C native >"$work/native.log" 2>&1; then
    say "building the C libraries failed (make -C native); the end of $work/native.log:"
    tail -n 20 "$work/native.log" >&2
    exit 1
fi

export PYTHONPATH="$root/src:$root/bench${PYTHONPATH:+:$PYTHONPATH}"
# What `sharegpu run`, the tests' conftest and the steps import beyond the standard library.
need='import typer, rich, pydantic, pynvml, pytest, sharegpu.cli, sharegpu.runtime.run, sharegpu.tenant, gpucheck.cli'
if ! missing=$("$py" -c "$need" 2>&1); then
    if compgen -G "$root/.whl/*.whl" >/dev/null; then
        say "installing the carried wheels (.whl/) into $work/site"
        if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$work/site" "$root"/.whl/*.whl >"$work/pip.log" 2>&1; then
            say "pip could not install the carried wheels:"
            tail -n 20 "$work/pip.log" >&2
            exit 1
        fi
        export PYTHONPATH="$work/site:$PYTHONPATH"
        missing=$("$py" -c "$need" 2>&1) || true
    fi
    if ! "$py" -c "$need" 2>/dev/null; then
        say "$py cannot run sharegpu: $(echo "$missing" | tail -n 1)"
        say "carry the missing packages as wheels: run \`make gpu-wheels\` where a package registry answers, then bring .whl/ along"
        exit 1
    fi
fi

exec "$py" -m gpucheck "$@"
