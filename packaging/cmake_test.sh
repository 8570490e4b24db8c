#!/usr/bin/env bash
# A plain CMake project outside the tree (testdata/cmake_project) against an
# installed muster: install.sh stages a prefix with the Debian library layout
# (lib/<multiarch>), the project configures with
# -DCMAKE_PREFIX_PATH=<that prefix>, builds a C and a C++ program linked to
# muster::muster, and each program runs as the two ranks of a job on a
# running musterd (started here) through muster-run, all-reducing. A version
# request the installation cannot meet fails the configure step.
source "$(dirname "${BASH_SOURCE[0]}")/testlib.sh"

if ((SANITIZED)); then
  echo "MUSTER_TEST_SKIPPED: libmuster.so is a sanitizer build; CMake's programs would not load it"
  exit 0
fi
command -v cmake >/dev/null || { fail "cmake is not installed"; finish cmake_test; }
P=/opt/muster
D=$TMP/dest
if ! "$R/tools/install.sh" --prefix "$P" --destdir "$D" --libdir "lib/$MULTIARCH" --no-python \
  --from "$R" >"$TMP/install.log" 2>&1; then
  cat "$TMP/install.log"
  fail "install.sh"
  finish cmake_test
fi
prefix=$D$P
cp -rL "$R/packaging/testdata/cmake_project" "$TMP/project"

out=$(cmake -S "$TMP/project" -B "$TMP/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release 2>&1)
rc=$?
check_eq "cmake configure" "$rc" 0
check_has "find_package(muster) found the staged installation" "$out" \
  "muster $VERSION found in $prefix/lib/$MULTIARCH/cmake/muster"
if ((rc != 0)); then
  echo "$out"
  finish cmake_test
fi
out=$(cmake --build "$TMP/build" -j 2 2>&1)
rc=$?
check_eq "cmake --build" "$rc" 0
((rc == 0)) || { echo "$out"; finish cmake_test; }
for prog in allreduce_c allreduce_cxx; do
  check_has "$prog links the installed libmuster.so.$API" "$(ldd "$TMP/build/$prog")" \
    "libmuster\.so\.$API => $prefix/lib/$MULTIARCH/libmuster\.so\.$API"
done

# A version the installation does not satisfy is refused at configure time.
out=$(cmake -S "$TMP/project" -B "$TMP/build-v" -DCMAKE_PREFIX_PATH="$prefix" \
  -DMUSTER_WANT_VERSION=99.0 2>&1)
rc=$?
if ((rc == 0)); then fail "find_package(muster 99.0) succeeded"; else pass "find_package(muster 99.0) fails"; fi
check_has "it names the version found" "$out" "$VERSION"

# A musterd of its own (socket and store port private to this test; the
# socket in a short directory: unix socket paths are at most 107 bytes).
sockdir=$(mktemp -d /tmp/muster-cmake.XXXXXX)
cleanup_hooks+=("rm -rf '$sockdir'")
sock=$sockdir/musterd.sock
"$R/daemon/musterd" --socket "$sock" --store-port 0 --ready-file "$TMP/ready.json" \
  2>"$TMP/musterd.log" &
daemon=$!
cleanup_hooks+=("kill $daemon 2>/dev/null; wait $daemon 2>/dev/null")
for _ in $(seq 600); do  # up to 30 s on a loaded machine
  [[ -s $TMP/ready.json ]] && break
  kill -0 "$daemon" 2>/dev/null || break
  sleep 0.05
done
if [[ ! -s $TMP/ready.json ]]; then
  cat "$TMP/musterd.log"
  fail "musterd did not become ready"
  finish cmake_test
fi

for prog in allreduce_c allreduce_cxx; do
  timeout 120 "$R/tools/muster-run" --nproc-per-node 2 --socket "$sock" \
    --job-id "cmake-$prog" -- "$TMP/build/$prog" >"$TMP/$prog.out" 2>&1
  rc=$?
  check_eq "$prog: muster-run exit status" "$rc" 0
  ((rc == 0)) || cat "$TMP/$prog.out"
  for r in 0 1; do
    check_has "$prog: rank $r all-reduced" "$(cat "$TMP/$prog.out")" "RANK $r OK sum=3( |$)"
  done
done
check_has "the C++ program's MAX all_reduce" "$(cat "$TMP/allreduce_cxx.out")" "RANK 1 OK sum=3 max=1"
# Both jobs ran on this musterd, not on an embedded one.
jobs=$("$R/tools/musterctl" --socket "$sock" jobs 2>&1)
check_has "musterctl shows the C job" "$jobs" "cmake-allreduce_c"
check_has "musterctl shows the C++ job" "$jobs" "cmake-allreduce_cxx"

finish cmake_test
