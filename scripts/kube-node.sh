#!/usr/bin/env bash
# A real single-node Kubernetes on this machine (issue 37, second increment): etcd, kube-apiserver,
# kube-scheduler and kube-controller-manager on loopback with certificates and RBAC,
# then containerd 2 (built by scripts/build-kube.sh, CDI on) and Debian's runc with a bridge CNI
# network, and a real kubelet
# registered as node "localhost". The sandbox (pause) image and a busybox test image are built here
# from files (images/pause/pause.c compiled static; Debian's busybox-static) as OCI archives by
# scripts/oci-image.py and imported with `ctr`: no registry. Then a pod runs to completion and its
# log is read back through the API server. Everything is stopped, unmounted and removed on exit,
# containerd's, runc's and the kubelet's state included (all in the temp dir).
#
#   scripts/kube-node.sh [BIN_DIR]         # start, run the pod, print timings, tear down
#   scripts/kube-node.sh --hold [BIN_DIR]  # start, print a READY line, keep running until stdin
#                                          # closes or SIGTERM/SIGINT, then tear down (the e2e
#                                          # fixture tests/e2e/kubenode.py runs it this way)
#   scripts/kube-node.sh --hold --api-only # only etcd and kube-apiserver (certificates, RBAC, an
#                                          # audit log of every request), for tests of sharegpu's
#                                          # API clients against the real server (no node, no pods run)
#   KEEP=1 scripts/kube-node.sh            # keep the temp dir (logs, configs) for a look
#
# Needs root, the binaries of scripts/build-kube.sh (containerd 2 among them), and the Debian packages runc,
# containernetworking-plugins, busybox-static, gcc, openssl, curl, iproute2.
#
# Host settings it changes while it runs, and restores on exit: the kubelet refuses to start unless
# vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1 (what kubeadm and kind nodes run
# with); those sysctls are not namespaced, so the script sets them before the kubelet starts, prints
# and records the old values ($D/sysctl.orig) and writes them back when it stops. The kubelet runs
# with protectKernelDefaults: true, so it checks them and changes nothing itself. The pods' bridge
# has no gateway address, so the bridge plugin leaves net.ipv4.ip_forward alone, and no masquerade
# rule is added (the pods need no route out).
set -euo pipefail

HOLD=0 API_ONLY=0
while :; do
    case "${1:-}" in
        --hold) HOLD=1; shift ;;
        --api-only) API_ONLY=1; shift ;;
        *) break ;;
    esac
done
[ "$API_ONLY" = 0 ] || [ "$HOLD" = 1 ] || { echo "kube-node: --api-only needs --hold" >&2; exit 2; }
BIN="${1:-${SHAREGPU_KUBE_CACHE:-$HOME/.cache/sharegpu/kube}/${KUBE_VERSION:-v1.37.2}/bin}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CNI_BIN="${CNI_BIN:-/usr/lib/cni}"
BUSYBOX="${BUSYBOX:-/bin/busybox}"
NODE=localhost           # see the apiserver's --kubelet-preferred-address-types below
PAUSE_IMAGE=sharegpu.local/pause:1
TEST_IMAGE=sharegpu.local/busybox:1
POD_SUBNET="${KUBE_NODE_POD_SUBNET:-10.244.0.0/24}"
RUNC="${KUBE_NODE_RUNC:-runc}"     # the runc binary containerd's shim runs (a wrapper, to debug)

die() { echo "kube-node: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (containerd, runc, the kubelet)"
NEED_BINS=(etcd kube-apiserver kubectl) NEED_CMDS=(openssl curl python3)
if [ "$API_ONLY" = 0 ]; then
    NEED_BINS+=(kube-scheduler kube-controller-manager kubelet containerd ctr containerd-shim-runc-v2)
    NEED_CMDS+=(runc gcc ip)
fi
for b in "${NEED_BINS[@]}"; do
    [ -x "$BIN/$b" ] || die "$BIN/$b missing: run scripts/build-kube.sh (make kube)"
done
for c in "${NEED_CMDS[@]}"; do
    command -v "$c" >/dev/null || die "$c not found (apt-get install runc gcc openssl curl iproute2)"
done
if [ "$API_ONLY" = 0 ]; then  # the pods' network and test image
    for p in bridge host-local loopback; do
        [ -x "$CNI_BIN/$p" ] || die "$CNI_BIN/$p missing (apt-get install containernetworking-plugins)"
    done
    [ -x "$BUSYBOX" ] || die "$BUSYBOX missing (apt-get install busybox-static)"
    if readelf -l "$BUSYBOX" 2>/dev/null | grep -q 'program interpreter'; then
        die "$BUSYBOX is dynamically linked: the image has no libc (apt-get install busybox-static)"
    fi
fi

T0=$(date +%s%3N)
ms() { date +%s%3N; }
D="$(mktemp -d /tmp/sharegpu-kube-node.XXXXXX)"
BRIDGE="sgkn${D##*.}"      # <= 15 characters, unique to this run
PIDS=()                    # started in this order; stopped newest first
P_KUBELET_PID=""
P_CONTAINERD_PID=""
WAITER=""                  # --hold: the `cat` that ends when stdin does
MADE=()                    # fixed host paths that this run made (removed again on exit)
CG_MADE=()                 # containerd's cgroup parent, /k8s.io, in each v1 hierarchy (or v2's)
if [ "$API_ONLY" = 0 ]; then  # (an API server alone makes none of these: it leaves a node's alone)
    for p in /var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/pods /run/containerd /run/netns; do
        [ -e "$p" ] || MADE+=("$p")
    done
    for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
        [ -e "$h/cgroup.procs" ] && [ ! -e "${h}k8s.io" ] && CG_MADE+=("${h}k8s.io")
    done
fi
NETNS_BEFORE=" $(ls /run/netns 2>/dev/null | tr '\n' ' ' || true) "
SYSCTLS=(vm.overcommit_memory=1 kernel.panic=10 kernel.panic_on_oops=1)
SYSCTL_OLD=()

sysctl_path() { echo "/proc/sys/${1//.//}"; }
set_sysctls() {
    local kv k v old
    for kv in "${SYSCTLS[@]}"; do
        k="${kv%%=*}" v="${kv#*=}"
        old="$(cat "$(sysctl_path "$k")")"
        [ "$old" = "$v" ] && continue
        echo "$k=$old" >> "$D/sysctl.orig"
        SYSCTL_OLD+=("$k=$old")
        echo "$v" > "$(sysctl_path "$k")"
        echo "kube-node: sysctl $k: $old -> $v (put back on exit)"
    done
}
restore_sysctls() {
    local kv
    for kv in "${SYSCTL_OLD[@]}"; do
        echo "${kv#*=}" > "$(sysctl_path "${kv%%=*}")" && echo "kube-node: sysctl ${kv%%=*} put back to ${kv#*=}"
    done
}

stop() {  # stop PID: SIGTERM, then SIGKILL after 10 s
    local i
    [ -n "$1" ] || return 0
    kill "$1" 2>/dev/null || return 0
    for i in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
CTR() { "$BIN/ctr" --address "$D/containerd.sock" -n k8s.io "$@"; }
K() { "$BIN/kubectl" --kubeconfig "$D/kubeconfig" "$@"; }

cleanup() {
    local rc=$? i m left t0
    t0=$(ms)
    set +e
    trap - INT TERM
    # The reader of our output may be gone (a test runner killed): an echo to its pipe must not
    # kill the teardown with SIGPIPE, and leave the node's processes and mounts behind.
    trap '' PIPE
    echo "kube-node: tearing down (exit status $rc)"
    [ -z "$WAITER" ] || kill "$WAITER" 2>/dev/null
    # Pods first, while the kubelet and containerd still run: the kubelet stops their containers,
    # and containerd calls the CNI DEL and removes their network namespaces and mounts.
    if [ -n "$P_KUBELET_PID" ] && kill -0 "$P_KUBELET_PID" 2>/dev/null; then
        K delete pods --all --all-namespaces --grace-period 1 --wait --timeout 60s >/dev/null 2>&1
    fi
    stop "$P_KUBELET_PID"
    # Whatever is left in containerd (a pod the kubelet did not get to), killed and deleted.
    if [ -n "$P_CONTAINERD_PID" ] && kill -0 "$P_CONTAINERD_PID" 2>/dev/null; then
        for i in $(CTR tasks ls -q 2>/dev/null); do
            CTR tasks kill -s SIGKILL "$i" >/dev/null 2>&1; sleep 0.2; CTR tasks delete "$i" >/dev/null 2>&1
        done
        for i in $(CTR containers ls -q 2>/dev/null); do CTR containers delete "$i" >/dev/null 2>&1; done
    fi
    # Newest first: the apiserver's graceful shutdown hangs on an etcd already gone.
    for (( i=${#PIDS[@]}-1; i>=0; i-- )); do stop "${PIDS[i]}"; done
    # The runc shims of this containerd (their command lines name its socket), if any outlived it.
    for i in $(pgrep -f -- "-address $D/containerd.sock" 2>/dev/null); do kill -9 "$i" 2>/dev/null; done
    # Mounts under the temp dir, deepest first: the kubelet's bind of its --root-dir onto itself,
    # its tmpfs volumes, containers' rootfs overlays, the sandboxes' /dev/shm.
    for m in $(awk -v d="$D/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m"
    done
    while mountpoint -q "$D/kubelet" 2>/dev/null; do umount "$D/kubelet" || break; done
    # Network namespaces containerd made (bind mounts under /run/netns) that a pod left behind.
    for m in /run/netns/*; do
        [ -e "$m" ] || continue
        case "$NETNS_BEFORE" in *" ${m##*/} "*) continue ;; esac
        umount "$m" 2>/dev/null; rm -f "$m"
    done
    ip link del "$BRIDGE" 2>/dev/null
    # runc removes each container's cgroup, not the /k8s.io parent containerd named: empty now.
    for i in "${CG_MADE[@]}"; do
        [ -d "$i" ] || continue
        find "$i" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null; rmdir "$i"
    done
    restore_sysctls
    for i in "${MADE[@]}"; do rm -rf "$i"; done
    left="$(awk -v d="$D/" 'index($5, d) == 1' /proc/self/mountinfo)"
    if [ -n "$left" ]; then
        echo "kube-node: mounts left under $D, not removing it:"; echo "$left"
    elif [ "${KEEP:-0}" = 1 ]; then echo "kube-node: kept $D"
    else rm -rf "$D"
    fi
    echo "kube-node: torn down in $(( $(ms) - t0 )) ms"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Free loopback ports (other suites may run beside this one).
read -r P_ETCD P_PEER P_API P_SCHED P_KCM P_KUBELET P_HZ < <(python3 - <<'EOF'
import socket
ss = [socket.socket() for _ in range(7)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
EOF
)
wait_for() {  # wait_for LABEL T0 TIMEOUT_S PID LOG CMD...: poll CMD until it succeeds; print time since T0
    local label="$1" t0="$2" limit="$3" pid="$4" log="$5"; shift 5
    local end=$(( $(date +%s) + limit ))
    until "$@" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "kube-node: $label exited; last errors in $log:"; grep -E '^[EF][0-9]{4}|level=(error|fatal)' "$log" | tail -5; return 1
        fi
        if [ "$(date +%s)" -ge "$end" ]; then echo "kube-node: $label: not ready after ${limit}s"; return 1; fi
        sleep 0.2
    done
    echo "kube-node: $label ready after $(( $(ms) - t0 )) ms"
}
cd "$D"

# --- images, from files ----------------------------------------------------------------------------
t=$(ms)
[ "$API_ONLY" = 1 ] || {
mkdir -p img/pause/{dev,proc,sys,etc} img/busybox/{bin,dev,proc,sys,etc,tmp}
gcc -static -Os -s -Wall -Wextra -Werror -o img/pause/pause "$HERE/images/pause/pause.c"
cp "$BUSYBOX" img/busybox/bin/busybox
for a in sh echo cat ls sleep true false env id hostname head; do ln -s busybox "img/busybox/bin/$a"; done
python3 "$HERE/scripts/oci-image.py" --name "$PAUSE_IMAGE" --rootfs img/pause --out pause.tar --entrypoint /pause >/dev/null
python3 "$HERE/scripts/oci-image.py" --name "$TEST_IMAGE" --rootfs img/busybox --out busybox.tar --cmd /bin/sh >/dev/null
echo "kube-node: images built in $(( $(ms) - t )) ms (pause $(du -k pause.tar | cut -f1) KiB, busybox $(du -k busybox.tar | cut -f1) KiB)"
}

# --- certificates: a CA; the apiserver's serving cert; admin (system:masters); the apiserver's
# client cert for kubelets; the kubelet's own (system:node:localhost in system:nodes); SA keys ---
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj "/CN=kube-node-ca" 2>/dev/null
cert() {  # cert NAME SUBJECT [SAN]
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    if [ -n "${3:-}" ]; then printf 'subjectAltName=%s\n' "$3" > "$1.ext"; else : > "$1.ext"; fi
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
}
cert apiserver "/CN=kube-apiserver" "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
cert admin "/O=system:masters/CN=kube-node-admin"
cert apiserver-kubelet-client "/O=kube-node:apiserver/CN=kube-apiserver-kubelet-client"
cert kubelet "/O=system:nodes/CN=system:node:$NODE"
cert kubelet-serving "/CN=$NODE" "IP:127.0.0.1,DNS:localhost"
# The front proxy, as kubeadm makes it: a CA of its own and the apiserver's client cert for the
# aggregation layer. The API server publishes the CA in kube-system's
# extension-apiserver-authentication ConfigMap, where every component's secure port reads it
# (without it each logs "missing content for CA bundle" every few seconds).
openssl req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt -days 1 \
    -subj "/CN=kube-node-front-proxy-ca" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr \
    -subj "/CN=front-proxy-client" 2>/dev/null
openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key \
    -CAcreateserial -days 1 -out front-proxy-client.crt 2>/dev/null
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
kubeconfig() {  # kubeconfig FILE USER_CERT_NAME
    cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kube-node
  cluster: {server: "https://127.0.0.1:$P_API", certificate-authority: $D/ca.crt}
users:
- name: u
  user: {client-certificate: $D/$2.crt, client-key: $D/$2.key}
contexts:
- name: kube-node
  context: {cluster: kube-node, user: u}
current-context: kube-node
EOF
}
kubeconfig kubeconfig admin
kubeconfig kubelet.kubeconfig kubelet

# --- etcd, kube-apiserver, kube-scheduler, kube-controller-manager -------------------------------
t=$(ms)
"$BIN/etcd" --name kube-node --data-dir "$D/etcd" \
    --listen-client-urls "http://127.0.0.1:$P_ETCD" --advertise-client-urls "http://127.0.0.1:$P_ETCD" \
    --listen-peer-urls "http://127.0.0.1:$P_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$P_PEER" \
    --initial-cluster "kube-node=http://127.0.0.1:$P_PEER" --listen-metrics-urls "" > etcd.log 2>&1 &
PIDS+=($!)
wait_for etcd "$t" 30 "${PIDS[-1]}" etcd.log curl -sf "http://127.0.0.1:$P_ETCD/health"

# --endpoint-reconciler-type none: the default reconciler refuses a loopback advertise address.
# The kubelet serves on 127.0.0.1 only, and a node's InternalIP may not be a loopback address, so
# the apiserver reaches it (logs, exec) by its Hostname address: the node is named "localhost".
# --allow-privileged: the node DaemonSet of deploy/kubernetes runs privileged, as kubeadm clusters allow.
# The audit log records every request of sharegpu's service accounts (the e2e tests read it: a
# component denied something fails them); nothing else is logged.
# With --api-only, the tests' own clients are the ones of interest: every request is logged.
if [ "$API_ONLY" = 1 ]; then AUDITED="- level: Metadata"
else AUDITED='- level: Metadata
    userGroups: ["system:serviceaccounts:sharegpu-system"]
  - level: None'
fi
cat > audit-policy.yaml <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  $AUDITED
EOF
t=$(ms)
"$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$P_ETCD" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$P_API" \
    --tls-cert-file apiserver.crt --tls-private-key-file apiserver.key --client-ca-file ca.crt \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file sa.pub --service-account-signing-key-file sa.key \
    --service-cluster-ip-range 10.0.0.0/24 --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate apiserver-kubelet-client.crt --kubelet-client-key apiserver-kubelet-client.key \
    --kubelet-certificate-authority ca.crt --kubelet-preferred-address-types Hostname \
    --endpoint-reconciler-type none --allow-privileged=true \
    --requestheader-client-ca-file front-proxy-ca.crt --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file front-proxy-client.crt --proxy-client-key-file front-proxy-client.key \
    --audit-policy-file audit-policy.yaml --audit-log-path "$D/audit.log" > apiserver.log 2>&1 &
PIDS+=($!)
wait_for kube-apiserver "$t" 120 "${PIDS[-1]}" apiserver.log K get --raw /readyz

if [ "$API_ONLY" = 1 ]; then
    echo "kube-node: API server up $(( $(ms) - T0 )) ms after the script started"
    echo "kube-node: READY dir=$D kubeconfig=$D/kubeconfig kubectl=$BIN/kubectl bin=$BIN audit=$D/audit.log"
    exec 3<&0              # (as --hold below: until stdin ends, or the API server exits)
    cat <&3 >/dev/null &
    WAITER=$!
    wait -n "$WAITER" "${PIDS[-1]}" || true
    kill -0 "${PIDS[-1]}" 2>/dev/null || die "the API server exited; see $D/apiserver.log"
    exit 0
fi

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
# The apiserver uses this cert to reach the kubelet: it may read logs and exec (nodes/proxy etc.).
K create clusterrolebinding kube-node-apiserver-kubelet --clusterrole system:kubelet-api-admin \
    --group kube-node:apiserver >/dev/null

# --- containerd (CRI), its state and socket in the temp dir, with a bridge CNI network --------------
mkdir -p cni
cat > cni/10-kube-node.conflist <<EOF
{
  "cniVersion": "0.4.0",
  "name": "sharegpu-kube-node",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]], "dataDir": "$D/cni-ipam"}}
  ]
}
EOF
# Config version 3 (containerd 2.0's; 2.4 reads it). CDI is on by default in containerd 2; the
# spec directory is this node's own (the device plugin writes its spec there).
mkdir -p cdi
cat > containerd.toml <<EOF
version = 3
root = "$D/containerd/root"
state = "$D/containerd/state"
[grpc]
  address = "$D/containerd.sock"
[ttrpc]
  address = "$D/containerd.sock.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ["$D/cdi"]
  # This sandbox's root lacks CAP_SYS_RESOURCE, so no process may lower its oom_score_adj below
  # its parent's; runc failed the sandbox's -998 ("nsexec: failed to update
  # /proc/self/oom_score_adj: Permission denied"). This clamps every container's to containerd's.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        Root = "$D/runc"
        BinaryName = "$RUNC"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$D/cni"
    max_conf_num = 1
EOF
t=$(ms)
# Its runc shim is found on PATH: the one built with it, not a packaged one of another version.
PATH="$BIN:$PATH" "$BIN/containerd" --config containerd.toml > containerd.log 2>&1 &
PIDS+=($!)
P_CONTAINERD_PID=$!
wait_for containerd "$t" 30 "$P_CONTAINERD_PID" containerd.log CTR version
t=$(ms)
CTR images import pause.tar >/dev/null
CTR images import busybox.tar >/dev/null
echo "kube-node: images imported in $(( $(ms) - t )) ms: $(CTR images ls -q | grep -v '^sha256:' | tr '\n' ' ')"

# --- the kubelet ---------------------------------------------------------------------------------
set_sysctls
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
oomScoreAdj: 0   # it cannot lower its own here (no CAP_SYS_RESOURCE): the default -999 only logs an error
tlsCertFile: $D/kubelet-serving.crt
tlsPrivateKeyFile: $D/kubelet-serving.key
containerRuntimeEndpoint: unix://$D/containerd.sock
podLogsDirectory: $D/pod-logs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $D/ca.crt}}
authorization: {mode: AlwaysAllow}
EOF
start_kubelet() {
    "$BIN/kubelet" --config kubelet.yaml --kubeconfig kubelet.kubeconfig --root-dir "$D/kubelet" \
        --cert-dir "$D/kubelet-pki" --hostname-override "$NODE" >> kubelet.log 2>&1 &
    P_KUBELET_PID=$!
}
t=$(ms)
start_kubelet
PIDS+=("$P_KUBELET_PID")
wait_for "kubelet (node registered)" "$t" 60 "$P_KUBELET_PID" kubelet.log K get node "$NODE"
node_ready() { [ "$(K get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
kubelet_healthy() { curl -sf "http://127.0.0.1:$P_HZ/healthz" >/dev/null && node_ready; }
wait_for "kubelet (node Ready)" "$t" 120 "$P_KUBELET_PID" kubelet.log node_ready
K get node -o wide
# The default service account, needed by any pod in "default" (the controller-manager makes it).
wait_for "serviceaccount default/default" "$t" 60 "${PIDS[-3]}" controller-manager.log \
    K -n default get serviceaccount default
echo "kube-node: node up $(( $(ms) - T0 )) ms after the script started"

if [ "$HOLD" = 1 ]; then
    echo "kube-node: READY dir=$D kubeconfig=$D/kubeconfig node=$NODE image=$TEST_IMAGE kubectl=$BIN/kubectl bin=$BIN audit=$D/audit.log cdi=$D/cdi"
    # Until stdin reaches its end (the fixture closes it, or dies), the kubelet exits, or a signal
    # comes. (A SIGTERM that arrived in a `read -t` loop here once made bash 5.2 crash in the
    # middle of the teardown: the trap now runs out of `wait`, the documented way.) SIGUSR1
    # restarts the kubelet under the running pods (tests/e2e/kubenode.py's restart_kubelet):
    # stopped, started again with the same flags and state, then healthy and the node Ready.
    exec 3<&0              # (a background command's stdin is /dev/null unless redirected)
    cat <&3 >/dev/null &
    WAITER=$!
    RESTART=0
    trap 'RESTART=1' USR1
    while :; do
        wait -n "$WAITER" "$P_KUBELET_PID" || true
        [ "$RESTART" = 1 ] || break
        RESTART=0
        t=$(ms)
        stop "$P_KUBELET_PID"
        start_kubelet
        wait_for "kubelet (restarted)" "$t" 120 "$P_KUBELET_PID" kubelet.log kubelet_healthy
        echo "kube-node: KUBELET-RESTARTED"
    done
    kill -0 "$P_KUBELET_PID" 2>/dev/null || die "the kubelet exited; see $D/kubelet.log"
    exit 0
fi

# --- a pod, to completion --------------------------------------------------------------------------
cat > pod.yaml <<EOF
apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: hello
    image: $TEST_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'echo "kube-node: hello from pod \$(hostname)"']
EOF
t=$(ms)
K apply -f pod.yaml >/dev/null
t_sched="" t_run="" phase=""
end=$(( $(date +%s) + 120 ))
while :; do
    s="$(K get pod hello -o jsonpath='{.status.phase}/{.spec.nodeName}' 2>/dev/null || true)"
    now=$(ms) phase="${s%%/*}" node="${s#*/}"
    [ -n "$t_sched" ] || [ -z "$node" ] || t_sched=$now
    case "$phase" in Running|Succeeded|Failed) [ -n "$t_run" ] || t_run=$now ;; esac
    case "$phase" in Succeeded|Failed) break ;; esac
    [ "$(date +%s)" -lt "$end" ] || { echo "kube-node: pod not done after 120 s (phase $phase)"; K describe pod hello | tail -20; exit 1; }
    sleep 0.1
done
echo "kube-node: pod $phase: created -> scheduled $(( t_sched - t )) ms, -> running/finished $(( t_run - t )) ms (as polled)"
K get pod hello -o jsonpath='{range .status.conditions[*]}  {.type}={.status} at {.lastTransitionTime}{"\n"}{end}'
K get pod hello -o jsonpath='  pod IP {.status.podIP}; container started {.status.containerStatuses[0].state.terminated.startedAt}, finished {.status.containerStatuses[0].state.terminated.finishedAt}, exit code {.status.containerStatuses[0].state.terminated.exitCode}{"\n"}'
log="$(K logs hello)"
echo "kube-node: kubectl logs hello: $log"
[ "$phase" = Succeeded ] && [[ "$log" == "kube-node: hello from pod hello" ]] || exit 1
echo "kube-node: OK in $(( $(ms) - T0 )) ms"
