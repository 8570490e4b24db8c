#!/usr/bin/env bash
# musterd --store-backend etcd against an etcd that demands credentials, with
# real etcd processes started here (one member each, free ports):
#
#   password  etcd auth enabled (user root), simple tokens living 2 s
#             (--auth-token-ttl): musterd with --etcd-user/--etcd-password-file
#             stores and reads; after the token expired (checked on etcd's
#             own HTTP gateway) calls still work (EtcdStore authenticates
#             again); a wrong password fails the call at once with an error
#             naming etcd authentication, and musterd stays up.
#   tls       a CA, a server and a client certificate made here with openssl
#             (no keys in the tree); etcd on https with --client-cert-auth:
#             musterd with --etcd-ca/--etcd-cert/--etcd-key works; without
#             the client certificate, or without the CA, calls fail quickly
#             with an error naming TLS and the flags to check.
#
# Prints "MUSTER_TEST_SKIPPED: ..." and exits 0 when etcd is not installed.
set -uo pipefail

log() { echo "etcd_auth_test: $*" >&2; }

if [[ -n "${TEST_SRCDIR:-}" && -d "${TEST_SRCDIR}/muster" ]]; then
  ROOT="${TEST_SRCDIR}/muster"
  MUSTERD="$ROOT/daemon/musterd"
  MUSTERCTL="$ROOT/tools/musterctl"
else
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  MUSTERD="$ROOT/bazel-bin/daemon/musterd"
  MUSTERCTL="$ROOT/bazel-bin/tools/musterctl"
fi
ETCD=${ETCD:-/usr/bin/etcd}
if [[ ! -x "$ETCD" ]]; then
  echo "MUSTER_TEST_SKIPPED: etcd not installed (apt-get install etcd-server)"
  exit 0
fi
for tool in openssl curl python3; do
  command -v "$tool" >/dev/null || { log "FAIL: $tool not installed"; exit 1; }
done

DIR="$(mktemp -d /tmp/muster-etcdauth-XXXXXX)" || { log "FAIL: mktemp"; exit 1; }
PIDS=()
FAILED=0
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  if [[ $FAILED != 0 ]]; then
    for f in "$DIR"/*.log; do
      [[ -f "$f" ]] || continue
      log "--- $f (last 30 lines)"
      tail -n 30 "$f" >&2
    done
  fi
  [[ -n "${KEEP_DIR:-}" ]] || rm -rf "$DIR"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 1' INT TERM
fail() {
  FAILED=1
  log "FAIL: $*"
  exit 1
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_etcd NAME SCHEME EXTRA_ARGS...: sets ETCD_URL; waits until it answers.
start_etcd() {
  local name=$1 scheme=$2
  shift 2
  local client="$scheme://127.0.0.1:$(free_port)" peer="http://127.0.0.1:$(free_port)"
  "$ETCD" --name "$name" --data-dir "$DIR/$name.etcd" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "$name=$peer" --initial-cluster-state new \
    --logger zap --log-outputs "$DIR/$name.log" "$@" </dev/null >/dev/null 2>&1 &
  PIDS+=($!)
  ETCD_URL=$client
}

# start_musterd NAME ARGS...: sets SOCK (the daemon's unix socket).
start_musterd() {
  local name=$1
  shift
  SOCK="$DIR/$name.sock"
  local ready="$DIR/$name.ready"
  "$MUSTERD" --socket "$SOCK" --grpc-port 0 --store-port 0 --listen 127.0.0.1 \
    --store-backend etcd --etcd-prefix "/$name/" "$@" --ready-file "$ready" \
    --log-level info >>"$DIR/$name-musterd.log" 2>&1 &
  local pid=$!
  PIDS+=($pid)
  MUSTERD_PID=$pid
  for _ in $(seq 200); do
    [[ -s "$ready" ]] && return 0
    kill -0 "$pid" 2>/dev/null || fail "musterd $name exited before it was ready"
    sleep 0.1
  done
  fail "musterd $name: no ready file after 20 s"
}

ctl() { "$MUSTERCTL" --socket "$SOCK" --timeout 10 "$@"; }

# api URL PATH JSON [CURL_ARGS...]: etcd's v3 HTTP gateway (no etcdctl needed).
api() {
  local url=$1 path=$2 body=$3
  shift 3
  curl -sS -m 5 -X POST "$@" "$url/v3/$path" -d "$body"
}
wait_healthy() {  # URL [CURL_ARGS...]
  local url=$1
  shift
  for _ in $(seq 100); do
    curl -fsS -m 1 "$@" "$url/health" 2>/dev/null | grep -q '"health":"true"' && return 0
    sleep 0.2
  done
  fail "etcd at $url not healthy after 20 s"
}
b64() { printf '%s' "$1" | base64 -w0; }

# expect_fails WHAT PATTERN CMD...: CMD fails within 8 s, output matching PATTERN.
expect_fails() {
  local what=$1 pattern=$2
  shift 2
  local start=$SECONDS out
  if out=$("$@" 2>&1); then fail "$what: succeeded: $out"; fi
  (( SECONDS - start <= 8 )) || fail "$what: took $((SECONDS - start)) s to fail: $out"
  grep -Eq -- "$pattern" <<<"$out" || fail "$what: error does not match /$pattern/: $out"
  log "$what fails as it should: $out"
}

# ---------------------------------------------------------------- password
start_etcd pw http --auth-token simple --auth-token-ttl 2
PW_URL=$ETCD_URL
wait_healthy "$PW_URL"
# What `etcdctl user add root; etcdctl auth enable` does.
api "$PW_URL" auth/role/add '{"name":"root"}' -f >/dev/null || fail "role add root"
api "$PW_URL" auth/user/add '{"name":"root","password":"s3cret-pw"}' -f >/dev/null \
  || fail "user add root"
api "$PW_URL" auth/user/grant '{"user":"root","role":"root"}' -f >/dev/null || fail "grant root"
api "$PW_URL" auth/enable '{}' -f >/dev/null || fail "auth enable"
# etcd itself refuses an anonymous client now.
anonymous=$(api "$PW_URL" kv/put "{\"key\":\"$(b64 /x)\",\"value\":\"eA==\"}")
grep -q "user name is empty\|permission denied\|invalid auth token" <<<"$anonymous" \
  || fail "etcd takes an anonymous write: auth is not enabled: $anonymous"
token() {
  api "$PW_URL" auth/authenticate '{"name":"root","password":"s3cret-pw"}' -f |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])'
}

printf 's3cret-pw\n' >"$DIR/pw" && chmod 600 "$DIR/pw"
start_musterd pw --etcd-endpoints "$PW_URL" --etcd-user root --etcd-password-file "$DIR/pw"
ctl store set greeting hello || fail "store set with the right password"
[[ "$(ctl store get greeting)" == hello ]] || fail "store get with the right password"
# The key is in etcd under musterd's prefix (read with etcd's own gateway).
tok=$(token) || fail "could not authenticate through etcd's gateway"
stored=$(api "$PW_URL" kv/range "{\"key\":\"$(b64 /pw/greeting)\"}" -H "Authorization: $tok")
grep -q "\"value\":\"$(b64 hello)\"" <<<"$stored" || fail "/pw/greeting not in etcd: $stored"

# The token expires: a token taken now is refused after 2 s idle.
tok=$(token) || fail "could not authenticate through etcd's gateway"
api "$PW_URL" kv/range '{"key":"eA=="}' -f -H "Authorization: $tok" >/dev/null \
  || fail "a fresh token is refused"
sleep 4
expired=$(api "$PW_URL" kv/range '{"key":"eA=="}' -H "Authorization: $tok")
grep -q "invalid auth token" <<<"$expired" || fail "the token did not expire in 2 s: $expired"
log "etcd's simple token expired after 2 s idle, as configured"
# musterd's token is as old: its next calls authenticate again and work.
ctl store set after-expiry yes || fail "store set after the token expired"
[[ "$(ctl store get greeting)" == hello ]] || fail "store get after the token expired"
sleep 3
[[ "$(ctl store get after-expiry)" == yes ]] || fail "store get after a second expiry"
log "password: calls work across token expiry"

printf 'wrong-pw\n' >"$DIR/bad" && chmod 600 "$DIR/bad"
start_musterd pwbad --etcd-endpoints "$PW_URL" --etcd-user root --etcd-password-file "$DIR/bad"
expect_fails "a wrong password" "authenticating as 'root' failed.*(authentication failed|invalid)" \
  ctl store set k v
kill -0 "$MUSTERD_PID" 2>/dev/null || fail "musterd with a wrong password crashed"

# --------------------------------------------------------------------- tls
cd "$DIR" || fail "cd $DIR"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=muster-test-ca" \
  -keyout ca.key -out ca.pem >/dev/null 2>&1 || fail "openssl: CA"
make_cert() {  # NAME CN EXT
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$1.key" -out "$1.csr" \
    >/dev/null 2>&1 || fail "openssl: $1 request"
  printf '%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
    -extfile "$1.ext" -out "$1.pem" >/dev/null 2>&1 || fail "openssl: $1 certificate"
}
make_cert server 127.0.0.1 "subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth"
make_cert client muster-client "extendedKeyUsage=clientAuth"
cd - >/dev/null || true

start_etcd tls https --cert-file "$DIR/server.pem" --key-file "$DIR/server.key" \
  --client-cert-auth --trusted-ca-file "$DIR/ca.pem"
TLS_URL=$ETCD_URL
wait_healthy "$TLS_URL" --cacert "$DIR/ca.pem" --cert "$DIR/client.pem" --key "$DIR/client.key"
start_musterd tls --etcd-endpoints "$TLS_URL" --etcd-ca "$DIR/ca.pem" \
  --etcd-cert "$DIR/client.pem" --etcd-key "$DIR/client.key"
ctl store set secure yes || fail "store set over TLS with a client certificate"
[[ "$(ctl store get secure)" == yes ]] || fail "store get over TLS"
log "tls: musterd with --etcd-ca/--etcd-cert/--etcd-key works"

start_musterd tlsnocert --etcd-endpoints "$TLS_URL" --etcd-ca "$DIR/ca.pem"
expect_fails "TLS without a client certificate" "TLS.*--etcd-cert" ctl store set k v
kill -0 "$MUSTERD_PID" 2>/dev/null || fail "musterd without a client certificate crashed"

start_musterd tlsnoca --etcd-endpoints "$TLS_URL" --etcd-cert "$DIR/client.pem" \
  --etcd-key "$DIR/client.key"
expect_fails "TLS without the CA" "TLS.*--etcd-ca" ctl store set k v

log "PASS"
