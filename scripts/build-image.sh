#!/usr/bin/env bash
# Build the project's image (ghcr.io/sharegpu/sharegpu: every container in deploy/kubernetes runs
# it) with no registry (issue 37): a root filesystem from Debian's packages (debootstrap, bookworm,
# its python3), the package's wheel from this tree with its dependencies' wheels from PyPI, made a
# one-layer OCI archive by scripts/oci-image.py, which `ctr images import` (containerd) and
# `podman load` read. deploy/image/Containerfile builds the same image where a registry serves
# python:3.11-slim; this script is the one the tests use.
#
#   scripts/build-image.sh             # build, print the archive's path and the image's name
#   scripts/build-image.sh --archive   # only print where the archive goes (tests use it)
#   SHAREGPU_IMAGE_CACHE=/some/dir scripts/build-image.sh
#
# The Debian root filesystem is made once and kept in the cache (a stamp records the suite and
# packages); the package layer is made again on every run, since the tree changes. Needs root
# (debootstrap), debootstrap, and the project's virtual environment (make setup) for pip.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUITE="${IMAGE_SUITE:-bookworm}"  # its python3 is 3.11, the version the wheel is built for
MIRROR="${IMAGE_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,ca-certificates"
NAME="${IMAGE_NAME:-ghcr.io/sharegpu/sharegpu:$(cd "$HERE" && .venv/bin/python -c 'import sharegpu; print(sharegpu.__version__)' 2>/dev/null || echo dev)}"
CACHE="${SHAREGPU_IMAGE_CACHE:-$HOME/.cache/sharegpu/image}"
ARCHIVE="$CACHE/sharegpu-image.tar"
PY="$HERE/.venv/bin/python"

if [[ "${1:-}" == "--archive" ]]; then
    echo "$ARCHIVE"
    exit 0
fi
[[ $(id -u) == 0 ]] || { echo "build-image: needs root (debootstrap)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "build-image: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
[[ -x "$PY" ]] || { echo "build-image: no $PY: run make setup first" >&2; exit 1; }
mkdir -p "$CACHE"

step() { echo "build-image: $1 ($(( $(date +%s) - T0 )) s)"; }
T0=$(date +%s)

# --- the Debian base, once -----------------------------------------------------------------------
BASE="$CACHE/base-$SUITE"
STAMP="suite=$SUITE packages=$PACKAGES"
if [[ ! -f "$BASE.stamp" || "$(cat "$BASE.stamp")" != "$STAMP" ]]; then
    rm -rf "$BASE" "$BASE.stamp" "$BASE.tmp"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$BASE.tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log" >&2; echo "build-image: debootstrap failed (log: $CACHE/debootstrap.log)" >&2; exit 1; }
    # What no container of ours reads: documentation, manuals, translations, apt's lists.
    rm -rf "$BASE.tmp"/usr/share/{doc,man,info,locale} "$BASE.tmp"/var/cache/apt/* "$BASE.tmp"/var/lib/apt/lists/*
    mv "$BASE.tmp" "$BASE"
    echo "$STAMP" >"$BASE.stamp"
    step "Debian $SUITE base made"
else
    step "Debian $SUITE base reused"
fi

# --- the package layer ---------------------------------------------------------------------------
WORK="$CACHE/work"
rm -rf "$WORK"
mkdir -p "$WORK/wheels"
"$PY" -m pip wheel -q --no-deps -w "$WORK/wheels" "$HERE"
step "wheel built"
ROOTFS="$WORK/rootfs"
cp -a "$BASE" "$ROOTFS"
# The package's path is the one python:3.11-slim gives it (deploy/image/Containerfile), which the
# CDI spec of deploy/kubernetes/kind names: Debian's python3 is told to look there too.
SITE="$ROOTFS/usr/local/lib/python3.11/site-packages"
mkdir -p "$SITE" "$ROOTFS/usr/local/lib/python3.11/dist-packages"
echo "import site; site.addsitedir('/usr/local/lib/python3.11/site-packages')" \
    >"$ROOTFS/usr/local/lib/python3.11/dist-packages/sharegpu-image.pth"
# The wheels for the image's Python (3.11, glibc 2.36), not this machine's: binary wheels only.
"$PY" -m pip install -q --no-compile --target "$SITE" --python-version 3.11 --implementation cp \
    --abi cp311 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform linux_x86_64 --only-binary=:all: \
    "$WORK"/wheels/sharegpu-*.whl
# pip put the commands under the target with this machine's interpreter: the image's instead.
for cmd in "$SITE"/bin/*; do
    sed '1s|^#!.*|#!/usr/bin/python3|' "$cmd" >"$ROOTFS/usr/local/bin/$(basename "$cmd")"
    chmod 755 "$ROOTFS/usr/local/bin/$(basename "$cmd")"
done
rm -rf "$SITE/bin"
# `python`, as python:3.11-slim has it: the manifests' commands and probes start `python -m ...`.
ln -sf /usr/bin/python3 "$ROOTFS/usr/local/bin/python"
# The image must start what the manifests run in it.
chroot "$ROOTFS" python -c "import sharegpu.kube.extender, sharegpu.kube.deviceplugin, sharegpu.agent.daemon
import sharegpu, sys
want = '/usr/local/lib/python3.11/site-packages/sharegpu/__init__.py'
sys.exit(None if sharegpu.__file__ == want else f'sharegpu is at {sharegpu.__file__}, not {want}')"
chroot "$ROOTFS" sharegpu --help >/dev/null
step "package installed"

"$PY" "$HERE/scripts/oci-image.py" --name "$NAME" --rootfs "$ROOTFS" --out "$ARCHIVE" \
    --cmd sharegpu version --env PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 >/dev/null
rm -rf "$WORK"
step "image archived"
echo "build-image: $NAME -> $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
