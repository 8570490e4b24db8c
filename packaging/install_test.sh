#!/usr/bin/env bash
# tools/install.sh, from the binaries Bazel built, into a temporary DESTDIR:
# the expected tree with modes and links, libmuster's soname, the unit
# pointing at the installed musterd and not enabled, man pages, --version of
# each program, pkg-config (its flags, and a C program compiled and run with
# them), and the Python package loading the installed libmuster.so.
source "$(dirname "${BASH_SOURCE[0]}")/testlib.sh"

P=/opt/muster-test
D=$TMP/dest
out=$("$R/tools/install.sh" --prefix "$P" --destdir "$D" --from "$R" 2>&1)
rc=$?
check_eq "install.sh exit status" "$rc" 0
((rc == 0)) || { echo "$out"; finish install_test; }
echo "$out" | head -3

root=$D$P
expect_files=(
  bin/musterd bin/musterctl bin/muster-run
  "lib/libmuster.so.$API"
  include/muster/muster.h
  lib/pkgconfig/muster.pc
  lib/cmake/muster/muster-config.cmake
  lib/cmake/muster/muster-config-version.cmake
  lib/systemd/system/musterd.service
  share/man/man1/musterd.1.gz share/man/man1/musterctl.1.gz share/man/man1/muster-run.1.gz
  share/bash-completion/completions/musterctl
  share/doc/muster/README.md share/doc/muster/musterd.conf.example
)
for f in "${expect_files[@]}"; do
  [[ -f $root/$f ]] || fail "missing $P/$f"
done
pass "the ${#expect_files[@]} expected files are there"
for f in bin/musterd bin/musterctl bin/muster-run; do
  check_eq "mode of $f" "$(stat -c %a "$root/$f")" 755
done
check_eq "mode of the header" "$(stat -c %a "$root/include/muster/muster.h")" 644
check_eq "libmuster.so links to the soname" "$(readlink "$root/lib/libmuster.so")" "libmuster.so.$API"
for prog in muster-run musterd; do
  check_eq "completion of $prog" "$(readlink "$root/share/bash-completion/completions/$prog")" musterctl
done
# Nothing but the prefix: the destdir holds the prefix alone.
check_eq "the destdir holds only the prefix" "$(cd "$D" && ls && ls opt)" $'opt\nmuster-test'
# Only the C API's header: the C++ SDK's headers do not link against libmuster.so.
check_eq "installed headers" "$(cd "$root/include" && find . -type f)" "./muster/muster.h"

soname=$(readelf -d "$root/lib/libmuster.so.$API" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
check_eq "soname is libmuster.so.<MUSTER_C_API_VERSION>" "$soname" "libmuster.so.$API"
exports=$(nm -D --defined-only "$root/lib/libmuster.so.$API" | awk '$2 == "T" { print $3 }')
check_eq "the library exports muster_* only" "$(grep -vc '^muster_' <<<"$exports")" 0

unit=$(cat "$root/lib/systemd/system/musterd.service")
check_has "unit runs the installed musterd" "$unit" "^ExecStart=$P/bin/musterd --socket "
check_has "unit documents the installed README" "$unit" "^Documentation=file://$P/share/doc/muster/README.md"
[[ -e $D/etc ]] && fail "install.sh wrote under /etc (enabling the unit?)" || pass "the unit is not enabled"

for prog in musterd musterctl muster-run; do
  check_eq "$prog --version" "$("$root/bin/$prog" --version 2>&1)" "$prog $VERSION"
  page=$(zcat "$root/share/man/man1/$prog.1.gz")
  title=${prog^^}
  check_has "$prog.1 title" "$page" "^\\.TH ${title//-/\\\\-} 1 .*\"muster $VERSION\""
  check_has "$prog.1 has options" "$page" '^\.SH OPTIONS$'
  check_has "$prog.1 documents --version" "$page" '^\\fB\\-\\-version\\fR$'
  # Every flag of --help is in the page.
  while read -r flag; do
    grep -qF "\\fB${flag//-/\\-}\\fR" <<<"$page" || fail "$prog.1 lacks $flag"
  done < <("$root/bin/$prog" --help | sed -n 's/^  \(-[A-Za-z], \)\{0,1\}\(--[a-z0-9-]*\).*/\2/p')
done
page=$(zcat "$root/share/man/man1/muster-run.1.gz")
check_has "muster-run.1 names the flag --nproc-per-node" "$page" 'nproc\\-per\\-node'
check_has "muster-run.1 shows a one-letter alias" "$page" '^\\fB\\-m\\fR, \\fB\\-\\-module\\fR$'
if command -v groff >/dev/null; then
  rendered=$(zcat "$root/share/man/man1/musterctl.1.gz" | groff -man -Tutf8 -ww 2>&1 >/dev/null)
  check_eq "groff renders musterctl.1 without warnings" "$rendered" ""
fi

# pkg-config with PKG_CONFIG_PATH into the tree: the installed prefix's paths,
# and (--define-prefix) a program compiled and linked against the staged tree.
export PKG_CONFIG_PATH=$root/lib/pkgconfig
check_eq "pkg-config --modversion" "$(pkg-config --modversion muster 2>&1)" "$VERSION"
check_eq "pkg-config --cflags --libs" "$(pkg-config --cflags --libs muster 2>&1 | sed "s/ *$//")" \
  "-I$P/include -L$P/lib -lmuster"
flags=$(pkg-config --define-prefix --cflags --libs muster 2>&1 | sed "s/ *$//")
check_eq "pkg-config --define-prefix relocates to the staged tree" "$flags" \
  "-I$root/include -L$root/lib -lmuster"
cat >"$TMP/version.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include <muster/muster.h>
int main(void) {
  if (muster_api_version() != MUSTER_C_API_VERSION) return 1;
  printf("%s\n", muster_version());
  return 0;
}
EOF
# shellcheck disable=SC2086  # $flags is a list of words
if cc -std=c11 -Wall -Werror -o "$TMP/version" "$TMP/version.c" $flags 2>"$TMP/cc.log"; then
  ((SANITIZED)) || check_eq "a program built with pkg-config's flags runs" \
    "$(LD_LIBRARY_PATH=$root/lib "$TMP/version" 2>&1)" "$VERSION"
  check_has "it links the soname" "$(readelf -d "$TMP/version")" "NEEDED.*\[libmuster\.so\.$API\]"
else
  fail "cc with pkg-config's flags: $(cat "$TMP/cc.log")"
fi
unset PKG_CONFIG_PATH

# The Python package, installed for a real prefix (no destdir), finds its
# libmuster.so there with no help from the environment.
Q=$TMP/prefix
if ((SANITIZED)); then
  echo "skipped: the Python package (libmuster.so is a sanitizer build)"
elif "$R/tools/install.sh" --prefix "$Q" --from "$R" >"$TMP/install2.log" 2>&1; then
  py=/usr/bin/python3
  pydir=$("$py" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
  probe=$(cd "$TMP" && env -u MUSTER_LIBRARY PYTHONPATH="$Q/lib/$pydir/dist-packages" \
    PYTHONDONTWRITEBYTECODE=1 "$py" -c \
    'import muster, muster._capi as c; print(muster.__file__); print(c.library_path()); print(muster.version())' 2>&1)
  check_eq "python: the installed package, its library and version" "$probe" \
    "$Q/lib/$pydir/dist-packages/muster/__init__.py"$'\n'"$Q/lib/libmuster.so.$API"$'\n'"$VERSION"
  include=$(cd "$TMP" && PYTHONPATH="$Q/lib/$pydir/dist-packages" PYTHONDONTWRITEBYTECODE=1 "$py" -c \
    'from muster import _installed; print(_installed.INCLUDE_DIR)' 2>&1)
  check_eq "python: muster.torch compiles against the installed header" "$include" "$Q/include"
else
  fail "install.sh --prefix $Q: $(cat "$TMP/install2.log")"
fi

# Bad arguments are refused by name.
err=$("$R/tools/install.sh" --prefix relative/path --from "$R" 2>&1)
check_has "a relative --prefix is refused" "$err" "--prefix must be an absolute path"
err=$("$R/tools/install.sh" --bogus 2>&1)
check_has "an unknown argument is refused" "$err" "unknown argument '--bogus'"

finish install_test
