# Helpers shared by the bench-*.sh scripts (sourced, not run).

# The median of the numbers on stdin (0 when there are none).
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print 0} else if (NR%2) {print a[(NR+1)/2]} else {print (a[NR/2]+a[NR/2+1])/2}}'; }

# Field $2 of the JSON object $1.
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])['$2'])" "$1"; }

# A veth pair: HOST_IF here with HOST_IP/24, NS_IF in a new namespace NS
# with NS_IP/24 (and its loopback up).
veth_ns_up() { # NS HOST_IF NS_IF HOST_IP NS_IP
    local ns=$1 host_if=$2 ns_if=$3 host_ip=$4 ns_ip=$5
    ip netns add "$ns"
    ip link add "$host_if" type veth peer name "$ns_if"
    ip link set "$ns_if" netns "$ns"
    ip -n "$ns" addr add "$ns_ip/24" dev "$ns_if"
    ip -n "$ns" link set "$ns_if" up
    ip -n "$ns" link set lo up
    ip addr add "$host_ip/24" dev "$host_if"
    ip link set "$host_if" up
}

# Tear down what a bench made: stop the server whose pid is in $srv (if
# any), remove the veth HOST_IF and namespace NS, the scratch folder $WORK
# and the hugepage files of the EAL file prefix PREFIX-*.
bench_teardown() { # HOST_IF NS PREFIX
    [ -n "${srv:-}" ] && kill -INT "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
    ip link del "$1" 2>/dev/null || true
    ip netns del "$2" 2>/dev/null || true
    [ -n "${WORK:-}" ] && rm -rf "$WORK"
    rm -rf /dev/hugepages/"$3"-* 2>/dev/null || true
}
