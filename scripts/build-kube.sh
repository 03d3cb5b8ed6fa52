#!/usr/bin/env bash
# Build the real Kubernetes control-plane and node binaries (and etcd) from the Go module proxy,
# once, into a cache outside the clone (issue 37, first increment). No Kubernetes binary comes from
# any package registry this project can reach, so we do what kubernetes-sigs/scheduler-plugins does:
# a throw-away Go module that requires k8s.io/kubernetes at one version and replaces every k8s.io/*
# staging module with the matching v0.X.Y release, then `go build` of the cmd/ packages.
#
#   scripts/build-kube.sh            # build what is missing, print where the binaries are
#   scripts/build-kube.sh --bin-dir  # only print the directory the binaries go to (tests use it)
#   SHAREGPU_KUBE_CACHE=/some/dir scripts/build-kube.sh
#
# Later runs reuse the cache: a binary is skipped when it exists and its stamp file records the
# same pins and Go version. Each step's wall time is printed. Compiles run niced with -p 1 (the
# machines are small and other work runs beside them); override with KUBE_BUILD_P / KUBE_NICE.
set -euo pipefail

# --- pins -----------------------------------------------------------------------------------------
# v1.37.2: the newest k8s.io/kubernetes the proxy serves; its go.mod says `go 1.26.0`, so it builds
# with the installed Go 1.26.x. Its kubelet refuses cgroup v1 unless the kubelet config sets
# failCgroupV1: false (the default flipped to true in 1.35); see docs/kubernetes.md.
KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
# etcd: the newest patch release of the line k8s v1.37.2 is tested with (its go.mod requires the
# v3.7.0 client, its hack/lib/etcd.sh wants etcd >= 3.7.0). Debian's etcd-server is 3.4.23: older
# than the 3.4.31 / 3.5.13 the apiserver's feature checker needs for watch progress requests, and
# a release line etcd no longer supports, so it is not used.
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"
# The binaries built from k8s.io/kubernetes (cmd/<name>).
KUBE_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
# containerd 2: the first line with CDI in its CRI plugin (on by default; Debian's 1.6 has none),
# so a device plugin's CDI device names reach the container. v2.4.2 is the newest the proxy
# serves; built without cgo and without the btrfs, devmapper and zfs snapshotters (overlayfs is
# the one used). Its runc shim must be the same version, so it is built too.
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
CONTAINERD_CMDS=(containerd ctr containerd-shim-runc-v2)
# Helm 4 (operators install with a chart: deploy/helm/sharegpu); the newest the proxy serves.
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
# Docker Engine (dockerd) and its CLI, for tests/e2e/test_docker_cdi.py: `docker run --device` with a
# CDI name came in 25 (Debian's docker.io 20.10 has none). v28.5.2 is the newest daemon release the
# proxy serves (github.com/docker/docker, +incompatible; Docker 29's daemon module, github.com/moby/
# moby/v2, has only v2.0.0-beta tags there); the CLI of the same release. Neither repository has a
# go.mod (only vendor.mod), so each helper module requires every module of its vendor.mod at the
# version Docker builds with. No docker-init or docker-proxy: the test runs dockerd without
# iptables, a bridge or a userland proxy, and its containers with --network none.
DOCKER_VERSION="${DOCKER_VERSION:-v28.5.2}"
DOCKER_CLI_VERSION="${DOCKER_CLI_VERSION:-v28.5.2}"
DOCKER_CMDS=(dockerd docker)

CACHE_ROOT="${SHAREGPU_KUBE_CACHE:-$HOME/.cache/sharegpu/kube}"
OUT="$CACHE_ROOT/$KUBE_VERSION"
BIN="$OUT/bin"
if [ "${1:-}" = --bin-dir ]; then echo "$BIN"; exit 0; fi
WORK="$OUT/src"            # the generated helper modules (kept: cheap, and handy to inspect)
P="${KUBE_BUILD_P:-1}"
NICE="${KUBE_NICE:-19}"

export CGO_ENABLED=0       # the upstream release binaries are static too

# The official Go tarball's place, where a non-login shell's PATH may not reach.
command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "build-kube: go is not installed (Kubernetes $KUBE_VERSION needs Go 1.26 or newer)" >&2; exit 1; }
GOVER="$(go env GOVERSION)"
mkdir -p "$BIN" "$WORK/kube" "$WORK/etcd" "$WORK/containerd"

t_all=$(date +%s)
step() {  # step LABEL CMD...: run CMD, print its wall time
    local label="$1" t0 rc=0; shift
    t0=$(date +%s)
    "$@" || rc=$?
    printf 'build-kube: %-28s %4ss%s\n' "$label" "$(( $(date +%s) - t0 ))" \
        "$([ "$rc" = 0 ] || echo "  FAILED (exit $rc)")"
    return "$rc"
}
stamp_of() {  # stamp_of NAME: the pins a binary was built with
    case " ${DOCKER_CMDS[*]} " in
        *" $1 "*) echo "docker=$DOCKER_VERSION cli=$DOCKER_CLI_VERSION go=$GOVER cgo=$CGO_ENABLED"; return ;;
    esac
    case " ${CONTAINERD_CMDS[*]} helm " in
        *" $1 "*) echo "containerd=$CONTAINERD_VERSION helm=$HELM_VERSION go=$GOVER cgo=$CGO_ENABLED" ;;
        *) echo "kube=$KUBE_VERSION etcd=$ETCD_VERSION go=$GOVER cgo=$CGO_ENABLED" ;;
    esac
}
is_built() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.stamp" 2>/dev/null)" = "$(stamp_of "$1")" ]; }

todo=()
for c in "${KUBE_CMDS[@]}" etcd "${CONTAINERD_CMDS[@]}" helm "${DOCKER_CMDS[@]}"; do is_built "$c" || todo+=("$c"); done
if [ "${#todo[@]}" = 0 ]; then
    echo "build-kube: all binaries for $KUBE_VERSION (etcd $ETCD_VERSION, containerd $CONTAINERD_VERSION, helm $HELM_VERSION, docker $DOCKER_VERSION, $GOVER) already in $BIN"
    exit 0
fi
echo "build-kube: building ${todo[*]} into $BIN ($GOVER, -p $P)"

# --- the helper module for Kubernetes ---------------------------------------------------------------
# k8s.io/kubernetes's go.mod replaces each staging module with ./staging/src/k8s.io/<name>, which
# only works inside its own repository. Each of those is published as its own module at v0.X.Y for
# release v1.X.Y, so rewrite every such replace to point at that published version.
gen_kube_module() {
    local gomod staging_ver
    # (The module is needed for the build anyway; `go mod download -json` also names its go.mod.)
    gomod="$(cd "$WORK" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [ -f "$gomod" ] || { echo "build-kube: cannot read go.mod of k8s.io/kubernetes@$KUBE_VERSION" >&2; return 1; }
    staging_ver="v0.${KUBE_VERSION#v1.}"
    {
        echo "module sharegpu.local/kube-build"
        echo
        sed -n 's/^go \(.*\)$/go \1/p' "$gomod" | head -1
        echo
        echo "require k8s.io/kubernetes $KUBE_VERSION"
        echo
        echo "replace ("
        # `	k8s.io/api => ./staging/src/k8s.io/api`  ->  `	k8s.io/api => k8s.io/api v0.37.2`
        sed -n "s#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/k8s\.io/.*\$#\t\1 => \1 $staging_ver#p" "$gomod"
        echo ")"
    } > "$WORK/kube/go.mod" || return 1
    echo "build-kube: $(grep -c ' => ' "$WORK/kube/go.mod") staging modules replaced with $staging_ver"
    # A file that imports every command, so that `go mod tidy` resolves all they need.
    {
        echo "//go:build tools"
        echo
        echo "package tools"
        echo
        echo "import ("
        for c in "${KUBE_CMDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
        echo ")"
    } > "$WORK/kube/tools.go"
    (cd "$WORK/kube" && nice -n "$NICE" go mod tidy)
}

gen_etcd_module() {
    # etcd's own main.go (repository root, module go.etcd.io/etcd/v3) is two lines around
    # go.etcd.io/etcd/server/v3/etcdmain.Main; depend on the server module alone.
    cat > "$WORK/etcd/go.mod" <<EOF
module sharegpu.local/etcd-build

go 1.26.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
    cat > "$WORK/etcd/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    (cd "$WORK/etcd" && nice -n "$NICE" go mod tidy)
}

gen_containerd_module() {
    {
        echo "module sharegpu.local/containerd-build"
        echo
        echo "go 1.26.0"
        echo
        echo "require github.com/containerd/containerd/v2 $CONTAINERD_VERSION"
    } > "$WORK/containerd/go.mod"
    {
        echo "//go:build tools"
        echo
        echo "package tools"
        echo
        echo "import ("
        for c in "${CONTAINERD_CMDS[@]}"; do echo "	_ \"github.com/containerd/containerd/v2/cmd/$c\""; done
        echo ")"
    } > "$WORK/containerd/tools.go"
    (cd "$WORK/containerd" && nice -n "$NICE" go mod tidy)
}

# -X flags so that `--version` and the apiserver's /version report the release, as upstream's
# hack/lib/version.sh does.
minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDFLAGS+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done

# (Functions run by `step` are in an `||` list, where set -e does not apply: chain with &&.)
build_one() {  # build_one NAME MODULE_DIR PACKAGE [GO BUILD FLAGS...]
    local name="$1" dir="$2" pkg="$3"; shift 3
    (cd "$dir" && nice -n "$NICE" go build -p "$P" -trimpath -ldflags "$LDFLAGS" "$@" -o "$BIN/$name.tmp" "$pkg") &&
        mv "$BIN/$name.tmp" "$BIN/$name" &&
        stamp_of "$name" > "$BIN/.$name.stamp"
}

need_kube=0
for c in "${todo[@]}"; do case " ${KUBE_CMDS[*]} " in *" $c "*) need_kube=1 ;; esac; done
if [ "$need_kube" = 1 ]; then
    step "module kubernetes (tidy)" gen_kube_module
    for c in "${todo[@]}"; do
        case " ${KUBE_CMDS[*]} " in *" $c "*) ;; *) continue ;; esac
        step "compile $c" build_one "$c" "$WORK/kube" "k8s.io/kubernetes/cmd/$c"
    done
fi
if is_built etcd; then :; else
    step "module etcd (tidy)" gen_etcd_module
    step "compile etcd" build_one etcd "$WORK/etcd" .
fi

need_containerd=0
for c in "${CONTAINERD_CMDS[@]}"; do is_built "$c" || need_containerd=1; done
if [ "$need_containerd" = 1 ]; then
    step "module containerd (tidy)" gen_containerd_module
    LDFLAGS="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
    for c in "${CONTAINERD_CMDS[@]}"; do
        is_built "$c" || step "compile $c" build_one "$c" "$WORK/containerd" \
            "github.com/containerd/containerd/v2/cmd/$c" -tags "no_btrfs no_devmapper no_zfs"
    done
fi

gen_helm_module() {
    printf 'module sharegpu.local/helm-build\n\ngo 1.26.0\n\nrequire helm.sh/helm/v4 %s\n' "$HELM_VERSION" \
        > "$WORK/helm/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport _ "helm.sh/helm/v4/cmd/helm"\n' > "$WORK/helm/tools.go"
    (cd "$WORK/helm" && nice -n "$NICE" go mod tidy)
}
if ! is_built helm; then
    mkdir -p "$WORK/helm"
    step "module helm (tidy)" gen_helm_module
    LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
    step "compile helm" build_one helm "$WORK/helm" helm.sh/helm/v4/cmd/helm
fi

gen_docker_module() {  # gen_docker_module DIR MODULE VERSION PACKAGE: require MODULE and its vendor.mod's pins
    local dir="$1" mod="$2" ver="$3" pkg="$4" src
    src="$(cd "$dir" && go mod download -json "$mod@$ver+incompatible" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
    [ -f "$src/vendor.mod" ] || { echo "build-kube: no vendor.mod in $mod@$ver" >&2; return 1; }
    {
        printf 'module sharegpu.local/%s-build\n\n' "${mod##*/}"
        sed -n 's/^go \(.*\)$/go \1/p' "$src/vendor.mod" | head -1
        printf '\nrequire %s %s+incompatible\n\n' "$mod" "$ver"
        # Both forms of vendor.mod's require lines (block entries and one-liners); it has no replace.
        awk '/^require \(/ { inb = 1; next } inb && /^\)/ { inb = 0; next }
             inb && NF >= 2 && $1 !~ /^\/\// { print "require " $1 " " $2 }
             /^require [^(]/ { print "require " $2 " " $3 }' "$src/vendor.mod"
    } > "$dir/go.mod" || return 1
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > "$dir/tools.go"
    (cd "$dir" && nice -n "$NICE" go mod tidy)
}
if ! is_built dockerd; then
    mkdir -p "$WORK/dockerd"
    step "module dockerd (tidy)" gen_docker_module "$WORK/dockerd" github.com/docker/docker "$DOCKER_VERSION" \
        github.com/docker/docker/cmd/dockerd
    LDFLAGS="-s -w -X github.com/docker/docker/dockerversion.Version=${DOCKER_VERSION#v}"
    # hack/make.sh's tags for a static binary; without the btrfs graph driver (cgo) and zfs (unused).
    step "compile dockerd" build_one dockerd "$WORK/dockerd" github.com/docker/docker/cmd/dockerd \
        -tags "netgo osusergo static_build exclude_graphdriver_btrfs exclude_graphdriver_zfs"
fi
if ! is_built docker; then
    mkdir -p "$WORK/docker"
    step "module docker cli (tidy)" gen_docker_module "$WORK/docker" github.com/docker/cli "$DOCKER_CLI_VERSION" \
        github.com/docker/cli/cmd/docker
    LDFLAGS="-s -w -X github.com/docker/cli/cli/version.Version=${DOCKER_CLI_VERSION#v}"
    step "compile docker" build_one docker "$WORK/docker" github.com/docker/cli/cmd/docker -tags "osusergo"
fi

echo "build-kube: done in $(( $(date +%s) - t_all ))s; binaries in $BIN:"
for c in "${KUBE_CMDS[@]}" etcd "${CONTAINERD_CMDS[@]}" helm "${DOCKER_CMDS[@]}"; do
    printf '  %-26s %s\n' "$c" "$(du -h "$BIN/$c" | cut -f1)"
done
