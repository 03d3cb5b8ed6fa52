#!/usr/bin/env bash
# Hand-run smoke check of the binaries scripts/build-kube.sh built (issue 37; not a test yet):
# etcd + kube-apiserver + kube-scheduler + kube-controller-manager on loopback in a temp dir,
# checked with kubectl, then the kubelet for a few seconds with no container runtime, to record
# what it says. Everything it starts is stopped and the temp dir removed on exit.
#
#   scripts/kube-smoke.sh [BIN_DIR]     # default: the cache dir build-kube.sh prints
#   KEEP=1 scripts/kube-smoke.sh        # keep the temp dir (logs, certs) for a look
set -euo pipefail

BIN="${1:-${SHAREGPU_KUBE_CACHE:-$HOME/.cache/sharegpu/kube}/${KUBE_VERSION:-v1.37.2}/bin}"
for b in etcd kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl; do
    [ -x "$BIN/$b" ] || { echo "kube-smoke: $BIN/$b missing: run scripts/build-kube.sh" >&2; exit 1; }
done
D="$(mktemp -d /tmp/sharegpu-kube-smoke.XXXXXX)"
PIDS=()
MADE=()
for p in /var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/pods; do [ -e "$p" ] || MADE+=("$p"); done
stop() {  # stop PID: SIGTERM, then SIGKILL after 10 s
    local i
    kill "$1" 2>/dev/null || return 0
    for i in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {  # newest first: the apiserver's graceful shutdown hangs on an etcd already gone
    local i
    for (( i=${#PIDS[@]}-1; i>=0; i-- )); do stop "${PIDS[i]}"; done
    # With a runtime, the kubelet makes these fixed paths whatever --root-dir says: remove them
    # when this run made them and they are still empty.
    for i in "${MADE[@]}"; do rmdir "$i" 2>/dev/null || true; done
    # It also bind-mounts its --root-dir onto itself (to make it a shared mount).
    while mountpoint -q "$D/kubelet" 2>/dev/null; do umount "$D/kubelet" || break; done
    if [ "${KEEP:-0}" = 1 ]; then echo "kube-smoke: kept $D"; else rm -rf "$D"; fi
}
trap cleanup EXIT

# Free loopback ports (other suites may run beside this one).
read -r P_ETCD P_PEER P_API P_SCHED P_KCM P_KUBELET P_HZ < <(python3 - <<'EOF'
import socket
ss = [socket.socket() for _ in range(7)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
EOF
)
ms() { date +%s%3N; }
wait_for() {  # wait_for LABEL T0 TIMEOUT_S PID LOG CMD...: poll CMD until it succeeds; print time since T0
    local label="$1" t0="$2" limit="$3" pid="$4" log="$5"; shift 5
    local end=$(( $(date +%s) + limit ))
    until "$@" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "kube-smoke: $label exited; last errors in $log:"; grep -E '^[EF][0-9]{4}' "$log" | tail -3; return 1
        fi
        if [ "$(date +%s)" -ge "$end" ]; then echo "kube-smoke: $label: not ready after ${limit}s"; return 1; fi
        sleep 0.2
    done
    echo "kube-smoke: $label ready after $(( $(ms) - t0 )) ms"
}

# --- certificates: a CA, the apiserver's serving cert, an admin client cert, the SA key pair ---
cd "$D"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj "/CN=smoke-ca" 2>/dev/null
cert() {  # cert NAME SUBJECT [SAN]
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    if [ -n "${3:-}" ]; then printf 'subjectAltName=%s\n' "$3" > "$1.ext"; else : > "$1.ext"; fi
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
}
cert apiserver "/CN=kube-apiserver" "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
cert admin "/O=system:masters/CN=smoke-admin"
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

cat > kubeconfig <<EOF
apiVersion: v1
kind: Config
clusters:
- name: smoke
  cluster: {server: "https://127.0.0.1:$P_API", certificate-authority: $D/ca.crt}
users:
- name: admin
  user: {client-certificate: $D/admin.crt, client-key: $D/admin.key}
contexts:
- name: smoke
  context: {cluster: smoke, user: admin}
current-context: smoke
EOF
K() { "$BIN/kubectl" --kubeconfig "$D/kubeconfig" "$@"; }

# --- etcd --------------------------------------------------------------------------------------
t=$(ms)
"$BIN/etcd" --name smoke --data-dir "$D/etcd" \
    --listen-client-urls "http://127.0.0.1:$P_ETCD" --advertise-client-urls "http://127.0.0.1:$P_ETCD" \
    --listen-peer-urls "http://127.0.0.1:$P_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$P_PEER" \
    --initial-cluster "smoke=http://127.0.0.1:$P_PEER" --listen-metrics-urls "" > etcd.log 2>&1 &
PIDS+=($!)
wait_for etcd "$t" 30 "${PIDS[-1]}" etcd.log curl -sf "http://127.0.0.1:$P_ETCD/health"
"$BIN/etcd" --version | head -1

# --- kube-apiserver ------------------------------------------------------------------------------
# --endpoint-reconciler-type none: the default reconciler refuses a loopback advertise address
# ("cannot use public IP 127.0.0.1 with endpoint reconciler ... may not be in the loopback range").
t=$(ms)
"$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$P_ETCD" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$P_API" \
    --tls-cert-file apiserver.crt --tls-private-key-file apiserver.key --client-ca-file ca.crt \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file sa.pub --service-account-signing-key-file sa.key \
    --service-cluster-ip-range 10.0.0.0/24 --authorization-mode Node,RBAC \
    --endpoint-reconciler-type none > apiserver.log 2>&1 &
PIDS+=($!)
wait_for kube-apiserver "$t" 120 "${PIDS[-1]}" apiserver.log K get --raw /readyz
K version
K get --raw '/readyz?verbose' | tail -3
K api-resources > api-resources.txt; head -5 api-resources.txt; echo "($(wc -l < api-resources.txt) lines)"
K get namespaces

# --- scheduler and controller-manager (admin kubeconfig; they serve /healthz with a self-signed cert) ---
t=$(ms)
"$BIN/kube-scheduler" --kubeconfig kubeconfig --authentication-kubeconfig kubeconfig \
    --authorization-kubeconfig kubeconfig --bind-address 127.0.0.1 --secure-port "$P_SCHED" \
    --cert-dir "$D/sched-certs" > scheduler.log 2>&1 &
PIDS+=($!)
"$BIN/kube-controller-manager" --kubeconfig kubeconfig --authentication-kubeconfig kubeconfig \
    --authorization-kubeconfig kubeconfig --bind-address 127.0.0.1 --secure-port "$P_KCM" \
    --cert-dir "$D/kcm-certs" --service-account-private-key-file sa.key --root-ca-file ca.crt \
    --use-service-account-credentials=false > controller-manager.log 2>&1 &
PIDS+=($!)
wait_for kube-scheduler "$t" 60 "${PIDS[-2]}" scheduler.log curl -skf "https://127.0.0.1:$P_SCHED/healthz"
wait_for kube-controller-manager "$t" 60 "${PIDS[-1]}" controller-manager.log curl -skf "https://127.0.0.1:$P_KCM/healthz"
sleep 3
K -n kube-system get leases
K -n default get serviceaccounts   # made by the controller-manager's serviceaccount controller

# --- kubelet, a few seconds, no container runtime ---------------------------------------------------
# failCgroupV1: false lets it start on a cgroup v1 host; protectKernelDefaults: true makes it fail
# rather than change the host's sysctls; cgroupsPerQOS: false keeps it from making kubepods cgroups.
cat > kubelet.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
protectKernelDefaults: true
cgroupsPerQOS: false
enforceNodeAllocatable: []
cgroupDriver: cgroupfs
address: 127.0.0.1
port: $P_KUBELET
healthzPort: $P_HZ
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
containerRuntimeEndpoint: unix://$D/no-runtime.sock
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $D/ca.crt}}
authorization: {mode: AlwaysAllow}
EOF
# KUBE_SMOKE_CONTAINERD=1: give it a containerd (Debian's 1.6, CRI v1) of its own instead, with
# its root, state and socket in the temp dir, and run the kubelet for 30 s.
secs=20
if [ "${KUBE_SMOKE_CONTAINERD:-0}" = 1 ]; then
    cat > containerd.toml <<EOF
version = 2
root = "$D/containerd/root"
state = "$D/containerd/state"
[grpc]
  address = "$D/containerd.sock"
# (Its "opt" plugin makes /opt/containerd unless told otherwise.)
[plugins."io.containerd.internal.v1.opt"]
  path = "$D/containerd/opt"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
EOF
    t=$(ms)
    containerd --config containerd.toml > containerd.log 2>&1 &
    PIDS+=($!)
    wait_for containerd "$t" 30 "${PIDS[-1]}" containerd.log test -S "$D/containerd.sock"
    containerd --version
    sed -i "s#^containerRuntimeEndpoint: .*#containerRuntimeEndpoint: unix://$D/containerd.sock#" kubelet.yaml
    secs=30
fi
t=$(ms)
rc=0
timeout "$secs" "$BIN/kubelet" --config kubelet.yaml --kubeconfig kubeconfig --root-dir "$D/kubelet" \
    --cert-dir "$D/kubelet-pki" --hostname-override smoke-node > kubelet.log 2>&1 || rc=$?
echo "kube-smoke: kubelet exited $rc after $(( $(ms) - t )) ms; its last lines:"
grep -E '^[EF][0-9]{4}|error|failed' kubelet.log | tail -5 || tail -5 kubelet.log
K get nodes -o wide || true
