#!/usr/bin/env bash
# A local 3-member etcd cluster for tests and for trying musterd's etcd store
# backend (musterd --store-backend etcd). Every member listens on 127.0.0.1
# (or $ETCD_HOST, e.g. an address other network namespaces reach) on free
# ports and keeps its data under DIR.
#
#   tools/etcd_cluster.sh start DIR [MEMBERS]  start (default 3 members); prints the
#                                    endpoints, also written to DIR/endpoints
#   tools/etcd_cluster.sh stop DIR             stop every member (data stays in DIR)
#   tools/etcd_cluster.sh leader DIR           print the leader: "NAME PID URL"
#   tools/etcd_cluster.sh kill DIR NAME        SIGKILL one member (e.g. the leader)
#   tools/etcd_cluster.sh restart DIR NAME     start a killed member again
#
# DIR/members has one line per member: NAME PID CLIENT_URL PEER_URL.
# Needs etcd (Debian's etcd-server, tools/setup.sh installs it) and curl.
set -euo pipefail

ETCD=${ETCD:-$(command -v etcd || true)}
HOST=${ETCD_HOST:-127.0.0.1}

usage() { sed -n '2,15p' "$0" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("'"$HOST"'",0)); print(s.getsockname()[1])'
}

alive() {  # PID: running (a zombie nobody has reaped yet is gone)
  local state
  state=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

healthy() {  # URL
  curl -fsS -m 1 "$1/health" 2>/dev/null | grep -q '"health":"true"'
}

start_member() {  # NAME CLIENT PEER CLUSTER STATE
  local name=$1 client=$2 peer=$3 cluster=$4 state=$5
  ETCD_UNSUPPORTED_ARCH=${ETCD_UNSUPPORTED_ARCH:-} setsid "$ETCD" --name "$name" \
    --data-dir "$dir/$name.etcd" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "$cluster" --initial-cluster-state "$state" \
    --initial-cluster-token "muster-test-$$" \
    --heartbeat-interval 50 --election-timeout 500 --max-request-bytes 33554432 \
    --logger zap --log-outputs "$dir/$name.log" </dev/null >"$dir/$name.out" 2>&1 &
  echo $!
}

case "$cmd" in
  start)
    [[ -x "$ETCD" ]] || { echo "etcd_cluster: etcd not installed (apt-get install etcd-server)" >&2; exit 3; }
    n=${3:-3}
    # A member that exits at start (a port taken between free_port and its
    # bind) makes the cluster start again on new ports, up to 3 times; a
    # loaded machine gets ETCD_START_TIMEOUT seconds (default 60) to elect.
    limit=${ETCD_START_TIMEOUT:-60}
    for attempt in 1 2 3; do
      : >"$dir/members"
      names=() clients=() peers=() pids=() cluster=""
      for i in $(seq 1 "$n"); do
        names+=("m$i")
        clients+=("http://$HOST:$(free_port)")
        peers+=("http://$HOST:$(free_port)")
        cluster+="${cluster:+,}m$i=${peers[-1]}"
      done
      (( attempt == 1 )) || rm -rf "$dir"/m*.etcd  # the failed attempt's data
      for i in "${!names[@]}"; do
        pid=$(start_member "${names[$i]}" "${clients[$i]}" "${peers[$i]}" "$cluster" new)
        pids+=("$pid")
        echo "${names[$i]} $pid ${clients[$i]} ${peers[$i]}" >>"$dir/members"
      done
      echo "$cluster" >"$dir/cluster"
      endpoints=$(IFS=,; echo "${clients[*]}")
      echo "$endpoints" >"$dir/endpoints"
      deadline=$(( SECONDS + limit )) died=""
      while (( SECONDS < deadline )); do
        ok=1
        for i in "${!clients[@]}"; do
          alive "${pids[$i]}" || { died=${names[$i]}; break 2; }
          healthy "${clients[$i]}" || ok=0
        done
        [[ $ok == 1 ]] && { echo "$endpoints"; exit 0; }
        sleep 0.1
      done
      for i in "${!names[@]}"; do
        echo "etcd_cluster: ${names[$i]} (pid ${pids[$i]}, ${clients[$i]}) last log lines:" >&2
        tail -n 5 "$dir/${names[$i]}.out" "$dir/${names[$i]}.log" >&2 2>/dev/null || true
      done
      bash "$0" stop "$dir"
      if [[ -z "$died" ]]; then
        echo "etcd_cluster: members not healthy after $limit s; logs in $dir/*.log" >&2
        exit 1
      fi
      echo "etcd_cluster: member $died exited at start (attempt $attempt of 3); starting again on new ports" >&2
      mkdir -p "$dir/failed-$attempt" && mv "$dir"/m*.log "$dir"/m*.out "$dir/failed-$attempt/" 2>/dev/null || true
    done
    echo "etcd_cluster: a member exited at start 3 times; logs in $dir/failed-*/" >&2
    exit 1
    ;;
  stop)
    [[ -f "$dir/members" ]] || exit 0
    while read -r name pid client peer; do
      kill "$pid" 2>/dev/null || true
    done <"$dir/members"
    while read -r name pid client peer; do
      for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    done <"$dir/members"
    ;;
  leader)
    while read -r name pid client peer; do
      status=$(curl -fsS -m 1 -X POST -d '{}' "$client/v3/maintenance/status" 2>/dev/null) || continue
      member=$(sed -n 's/.*"member_id":"\([0-9]*\)".*/\1/p' <<<"$status")
      leader=$(sed -n 's/.*"leader":"\([0-9]*\)".*/\1/p' <<<"$status")
      if [[ -n "$member" && "$member" == "$leader" ]]; then echo "$name $pid $client"; exit 0; fi
    done <"$dir/members"
    echo "etcd_cluster: no leader" >&2
    exit 1
    ;;
  kill)
    [[ $# -ge 3 ]] || usage
    pid=$(awk -v n="$3" '$1==n {print $2}' "$dir/members")
    [[ -n "$pid" ]] || { echo "etcd_cluster: no member $3" >&2; exit 1; }
    kill -9 "$pid" 2>/dev/null || true  # already dead (killed earlier) is fine
    # Gone (its ports free) before a restart may bind them again.
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
    ;;
  restart)
    [[ $# -ge 3 ]] || usage
    read -r name pid client peer < <(awk -v n="$3" '$1==n' "$dir/members")
    newpid=$(start_member "$name" "$client" "$peer" "$(cat "$dir/cluster")" existing)
    sed -i "s|^$name $pid |$name $newpid |" "$dir/members"
    for _ in $(seq 1 100); do healthy "$client" && exit 0; alive "$newpid" || break; sleep 0.1; done
    # A lone member cannot be healthy (no quorum): running is enough.
    alive "$newpid" || { echo "etcd_cluster: $name exited; see $dir/$name.log" >&2; exit 1; }
    ;;
  *) usage ;;
esac
