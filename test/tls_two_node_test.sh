#!/usr/bin/env bash
# Two "nodes" in network namespaces, each musterd serving TCP gRPC with
# mutual TLS (certificates from one CA, made here with openssl). A job spans
# both daemons; musterctl on node B reaches node A's daemon with node B's
# certificate; a certificate from another CA, no certificate, plain TCP, and
# a client that trusts another CA are all refused.
# Needs root (ip netns) and openssl; otherwise reported as skipped.
set -uo pipefail

source "$(dirname "$0")/netns_lib.sh"
command -v openssl >/dev/null || { echo "MUSTER_TEST_SKIPPED: no openssl"; exit 0; }
MUSTERD=$(find_bin daemon/musterd)
MUSTERCTL=$(find_bin tools/musterctl)
RANK=$(find_bin test/muster-test-rank)

cd "$WORK" || fail "cd"
new_ca() {  # name
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=$1" -keyout "$1.key" -out "$1.pem" 2>>openssl.log || fail "CA $1"
}
new_cert() {  # name ca ip
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
    -keyout "$1.key" -out "$1.csr" 2>>openssl.log || fail "key $1"
  printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 1 \
    -extfile "$1.ext" -out "$1.pem" 2>>openssl.log || fail "cert $1"
  chmod 600 "$1.key"
}
new_ca cluster
new_ca other
new_cert node-a cluster "$IPA"
new_cert node-b cluster "$IPB"
new_cert rogue other "$IPB"

tls() { echo --tls-cert "$1.pem" --tls-key "$1.key" --tls-ca cluster.pem; }
start_daemons "$MUSTERD" $(tls node-a) -- $(tls node-b)
STORE=$PORT
(( GRPC_A > 0 )) || fail "node A serves no TCP gRPC"
grep -q "(mutual TLS)" "$WORK/musterd-a.log" || fail "node A's log does not say mutual TLS"

# A job across both nodes.
for r in 0 1; do
  ns=$NA; sock=$WORK/a.sock
  (( r == 1 )) && { ns=$NB; sock=$WORK/b.sock; }
  ip netns exec "$ns" env RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR="$IPA" \
    MASTER_PORT="$STORE" MUSTER_SOCKET="$sock" MUSTER_JOB_ID=tls-job "$RANK" \
    "init;allreduce world 1000;barrier world;sleep 1500" >"$WORK/rank$r.out" 2>&1 &
  pids+=($!)
done
sleep 0.8

ctl_b() { ip netns exec "$NB" "$MUSTERCTL" --addr "$IPA:$GRPC_A" --timeout 3 "$@"; }
jobs=$(ctl_b --tls-ca cluster.pem --tls-cert node-b.pem --tls-key node-b.key jobs 2>&1) \
  || fail "node B's certificate was refused by node A: $jobs"
echo "$jobs" | grep -Eq "^tls-job +0 +2 +1 +running" || fail "node A's jobs over mutual TLS: $jobs"

out=$(ctl_b --tls-ca cluster.pem --tls-cert rogue.pem --tls-key rogue.key status 2>&1) \
  && fail "a certificate from another CA was accepted: $out"
echo "another CA's certificate: $out"
out=$(ctl_b --tls-ca cluster.pem status 2>&1) && fail "a client without a certificate was accepted: $out"
echo "no client certificate: $out"
out=$(ctl_b status 2>&1) && fail "plain TCP was accepted by a TLS daemon: $out"
echo "plain TCP: $out"
out=$(ctl_b --tls-ca other.pem --tls-cert node-b.pem --tls-key node-b.key status 2>&1) \
  && fail "a client trusting another CA accepted node A's certificate: $out"
echo "client trusting another CA: $out"

for r in 0 1; do wait "${pids[$((r + 2))]}"; done
for r in 0 1; do
  grep -q "rank $r: allreduce world 1000 ok" "$WORK/rank$r.out" || fail "rank $r all_reduce across nodes"
  grep -q "rank $r: barrier world ok" "$WORK/rank$r.out" || fail "rank $r barrier across nodes"
done
grep -q "BEGIN" "$WORK/musterd-a.log" "$WORK/musterd-b.log" && fail "key material in a log"
echo "PASS: mutual TLS between two nodes; another CA's certificate, no certificate, plain TCP and a client trusting another CA refused"
