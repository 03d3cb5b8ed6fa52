#!/bin/sh
# Install sharegpu on a GPU host from this source tree:
#   - a virtual environment of its own (--prefix, default /opt/sharegpu): Debian 12 and
#     Ubuntu 23.04+ refuse `pip install` into the system's Python (PEP 668,
#     "externally-managed-environment"), and a venv keeps sharegpu's dependencies apart;
#   - the `sharegpu` command linked where the systemd unit runs it (--bin-dir, default
#     /usr/local/bin);
#   - the agent's systemd unit (--unit-dir, default /etc/systemd/system; --no-unit: none), its
#     ExecStart pointing at that command.
# Needs python3 with venv (Debian: apt-get install python3-venv), gcc and make (the shim is
# built from source), and PyPI. Run again to upgrade: the venv is reused, running tenants keep
# the shim they loaded (docs/agent.md, "Upgrades").
set -eu

prefix=/opt/sharegpu
bin_dir=/usr/local/bin
unit_dir=/etc/systemd/system
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --bin-dir) bin_dir=$2; shift 2 ;;
        --unit-dir) unit_dir=$2; shift 2 ;;
        --no-unit) unit_dir=; shift ;;
        -h|--help) sed -n '2,12s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "install-host.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

src=$(cd "$(dirname "$0")/.." && pwd)
python3 -c 'import venv, ensurepip' 2>/dev/null || {
    echo "install-host.sh: python3 cannot make a virtual environment: install python3-venv" >&2
    exit 1
}
[ -x "$prefix/bin/python" ] || python3 -m venv "$prefix"
"$prefix/bin/python" -m pip install --quiet --upgrade pip
"$prefix/bin/python" -m pip install --quiet "$src"
mkdir -p "$bin_dir"
ln -sfn "$prefix/bin/sharegpu" "$bin_dir/sharegpu"
echo "installed $("$bin_dir/sharegpu" version) in $prefix; the command: $bin_dir/sharegpu"
if [ -n "$unit_dir" ]; then
    mkdir -p "$unit_dir"
    sed "s|^ExecStart=/usr/local/bin/sharegpu |ExecStart=$bin_dir/sharegpu |" \
        "$src/deploy/systemd/sharegpu-agent.service" > "$unit_dir/sharegpu-agent.service"
    echo "the agent's unit: $unit_dir/sharegpu-agent.service; start it with"
    echo "  systemctl daemon-reload && systemctl enable --now sharegpu-agent"
fi
