#!/usr/bin/env bash
# tools/package.sh's Debian package: its control fields (Depends derived from
# the libraries the binaries link), root-owned contents; installed into a
# fresh root with `dpkg --root` (maintainer scripts chrootless, as DPKG_ROOT
# tells them: the fresh root has no shell; dependencies forced: the fresh
# root has no libraries, the host does), the programs run from there, the
# unit in place and not enabled; then `dpkg --root -r` leaves none of the
# package's files behind, not even the bytecode Python wrote at import.
source "$(dirname "${BASH_SOURCE[0]}")/testlib.sh"

for tool in dpkg dpkg-deb; do
  command -v "$tool" >/dev/null || { fail "$tool is not installed"; finish deb_test; }
done
deb=$("$R/tools/package.sh" --from "$R" --out "$TMP/out" 2>"$TMP/package.log")
rc=$?
check_eq "package.sh exit status" "$rc" 0
if ((rc != 0)) || [[ ! -f $deb ]]; then
  cat "$TMP/package.log"
  finish deb_test
fi
arch=$(dpkg --print-architecture)
check_eq "the package's file name" "$(basename "$deb")" "muster_${VERSION}_${arch}.deb"
check_eq "Package" "$(dpkg-deb -f "$deb" Package)" muster
check_eq "Version" "$(dpkg-deb -f "$deb" Version)" "$VERSION"
depends=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/^ *//')
echo "Depends: $(echo "$depends" | paste -sd' ')"
for pkg in libc6 libstdc++6 libgrpc++1.51 libprotobuf32 libabsl20220623 libgloo0 libssl3; do
  check_eq "Depends names $pkg" "$(awk -v p="$pkg" '$1 == p { print $1 }' <<<"$depends")" "$pkg"
done
check_has "Depends has versions from the shlibs files" "$depends" '^libgrpc\+\+1\.51 \(>= 1\.51'
check_eq "Depends names no 32-bit or unrelated package" \
  "$(grep -E '^(lib32|libc6-i386|libmuster)' <<<"$depends")" ""

contents=$(dpkg-deb -c "$deb")
check_eq "every entry is owned by root" "$(awk '$2 != "root/root"' <<<"$contents")" ""
for f in ./usr/bin/musterd ./usr/bin/musterctl ./usr/bin/muster-run \
  "./usr/lib/$MULTIARCH/libmuster.so.$API" ./usr/include/muster/muster.h \
  "./usr/lib/$MULTIARCH/pkgconfig/muster.pc" "./usr/lib/$MULTIARCH/cmake/muster/muster-config.cmake" \
  ./usr/lib/systemd/system/musterd.service ./usr/lib/python3/dist-packages/muster/__init__.py \
  ./usr/share/man/man1/musterd.1.gz ./usr/share/bash-completion/completions/musterctl; do
  check_has "the package holds $f" "$contents" " $f( -> .*)?$"
done
check_has "muster-run's completion links to musterctl's" "$contents" \
  " \./usr/share/bash-completion/completions/muster-run -> musterctl$"
check_eq "nothing under /etc (the unit is not enabled)" "$(grep -c ' \./etc/' <<<"$contents")" 0

# dpkg wants ldconfig and start-stop-daemon on PATH (Bazel's PATH lacks sbin).
export PATH=$PATH:/usr/sbin:/sbin
# A fresh root: an empty dpkg database, nothing else.
root=$TMP/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers" \
  "$root/var/log"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
dpkg_root=(dpkg --root="$root" --force-script-chrootless --log=/dev/null)
((EUID == 0)) || dpkg_root+=(--force-not-root)
out=$("${dpkg_root[@]}" --force-depends -i "$deb" 2>&1)
rc=$?
check_eq "dpkg --root -i" "$rc" 0
((rc == 0)) || echo "$out"
check_eq "dpkg sees it installed" "$(dpkg-query --root="$root" -W -f='${Status}' muster 2>&1)" \
  "install ok installed"

for prog in musterd musterctl muster-run; do
  check_eq "$prog --version from the fresh root" \
    "$(LD_LIBRARY_PATH=$root/usr/lib/$MULTIARCH "$root/usr/bin/$prog" --version 2>&1)" "$prog $VERSION"
done
check_has "the unit runs /usr/bin/musterd" "$(cat "$root/usr/lib/systemd/system/musterd.service")" \
  "^ExecStart=/usr/bin/musterd "
[[ -e $root/etc/systemd ]] && fail "the unit was enabled: $(find "$root/etc/systemd")" ||
  pass "the unit is in place, not enabled"
# The library and the Python package work from there (paths redirected to
# the fresh root; on a real install they are where _installed.py says).
if ((SANITIZED)); then
  echo "skipped: the Python package (libmuster.so is a sanitizer build)"
  # The bytecode an import would write, for the prerm to remove.
  mkdir -p "$root/usr/lib/python3/dist-packages/muster/__pycache__"
else
  probe=$(cd "$TMP" && env -u PYTHONDONTWRITEBYTECODE \
    MUSTER_LIBRARY="$root/usr/lib/$MULTIARCH/libmuster.so.$API" \
    PYTHONPATH="$root/usr/lib/python3/dist-packages" /usr/bin/python3 -c \
    'import muster, muster._installed as i; print(muster.version()); print(i.LIBRARY)' 2>&1)
  check_eq "python imports the packaged SDK" "$probe" \
    "$VERSION"$'\n'"/usr/lib/$MULTIARCH/libmuster.so.$API"
fi
[[ -d $root/usr/lib/python3/dist-packages/muster/__pycache__ ]] &&
  pass "python wrote bytecode beside the package" || fail "no __pycache__ after the import"

out=$("${dpkg_root[@]}" -r muster 2>&1)
rc=$?
check_eq "dpkg --root -r" "$rc" 0
((rc == 0)) || echo "$out"
# Removed, not purged: dpkg keeps the record until the postrm's purge ran.
check_eq "dpkg sees it removed" "$(dpkg-query --root="$root" -W -f='${Status}' muster 2>&1)" \
  "deinstall ok config-files"
left=$(cd "$root" && find . -mindepth 1 -not -path './var/lib/dpkg*' -not -path './var/log*' \
  -not -path ./var -not -path ./var/lib | sort)
check_eq "nothing is left outside dpkg's database" "$left" ""
# dpkg warns when it cannot remove a directory it installed (not empty).
check_eq "dpkg did not warn" "$(grep -i warning <<<"$out")" ""
out=$("${dpkg_root[@]}" -P muster 2>&1)
check_eq "dpkg --root -P" "$?" 0
if dpkg-query --root="$root" -W muster >/dev/null 2>&1; then
  fail "dpkg still knows muster after the purge"
else
  pass "after the purge dpkg knows no muster"
fi

finish deb_test
