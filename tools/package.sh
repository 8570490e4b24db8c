#!/usr/bin/env bash
# Builds the Debian package of muster with dpkg-deb: muster_<version>_<arch>.deb.
#
# Usage: tools/package.sh [--from DIR] [--out DIR]
#
#   --from DIR  use the binaries already built in DIR (a bazel-bin layout; see
#               tools/install.sh --from) instead of `bazel build -c opt`
#   --out DIR   where the .deb goes (default: the current directory)
#
# The package is tools/install.sh's tree for prefix /usr (libraries in
# /usr/lib/<multiarch>, the Python package in /usr/lib/python3/dist-packages),
# stripped, owned by root. Depends lists the Debian packages that provide the
# shared libraries the programs and libmuster.so link (their NEEDED entries,
# looked up in dpkg's shlibs files, else with dpkg -S, as dpkg-shlibdeps
# would). The maintainer scripts (packaging/debian/) put the systemd unit in
# place without enabling or starting it, stop musterd before removal, and run
# `systemctl daemon-reload` only where systemd is running. Removing the
# package removes every file it installed.
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
from=""
out=$PWD

die() {
  echo "package.sh: $*" >&2
  exit 1
}
while (($#)); do
  case $1 in
    --from) from=${2:?--from needs a value}; shift 2 ;;
    --from=*) from=${1#*=}; shift ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --out=*) out=${1#*=}; shift ;;
    -h | --help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see tools/package.sh --help)" ;;
  esac
done
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"

version=$(sed -n 's/.*kVersion\[\] = "\([^"]*\)".*/\1/p' "$SRC/common/version.h")
arch=$(dpkg --print-architecture)
multiarch=$(gcc -print-multiarch 2>/dev/null || true)
[[ -n $multiarch ]] || multiarch=x86_64-linux-gnu

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/root
install_args=(--prefix /usr --libdir "lib/$multiarch" --destdir "$stage"
  --python-dir /usr/lib/python3/dist-packages --strip)
[[ -n $from ]] && install_args+=(--from "$from")
"$SRC/tools/install.sh" "${install_args[@]}" >"$work/install.log" ||
  { cat "$work/install.log" >&2; die "tools/install.sh failed"; }

# Depends: what provides each shared library our ELF files need.
shipped=" $(cd "$stage" && find . -name 'lib*.so*' -printf '%f ') "
declare -A deps=()
needed() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
shlibs_dep() {  # SONAME -> the dependency its shlibs entry names, or nothing
  local soname=$1 name ver
  if [[ $soname =~ ^(.*)\.so\.([0-9.]+)$ ]]; then
    name=${BASH_REMATCH[1]}
    ver=${BASH_REMATCH[2]}
  elif [[ $soname =~ ^(.*)-([0-9.]+)\.so$ ]]; then
    name=${BASH_REMATCH[1]}
    ver=${BASH_REMATCH[2]}
  else
    return 0
  fi
  # shlibs lines: "[type: ]library soversion dependencies"
  cat /var/lib/dpkg/info/*.shlibs 2>/dev/null |
    awk -v n="$name" -v v="$ver" '$1 == n && $2 == v { $1 = ""; $2 = ""; sub(/^ +/, ""); print; exit }'
}
dpkg_dep() {  # SONAME ELF -> the package owning the library ldd resolves it to
  local path p
  path=$(ldd "$2" 2>/dev/null | awk -v s="$1" '$1 == s && $3 ~ /^\// { print $3; exit }')
  [[ -n $path ]] || return 0
  for p in "$path" "$(readlink -f "$path")" "/usr$path" "${path#/usr}"; do
    dpkg -S "$p" 2>/dev/null | sed -n '1s/:.*//p' | grep . && return 0
  done
  return 0
}
while read -r elf; do
  while read -r soname; do
    [[ -z $soname || $shipped == *" $soname "* ]] && continue
    dep=$(shlibs_dep "$soname")
    [[ -n $dep ]] || dep=$(dpkg_dep "$soname" "$elf")
    if [[ -z $dep ]]; then
      echo "package.sh: warning: no Debian package provides $soname (needed by ${elf#"$stage"})" >&2
      continue
    fi
    deps[$dep]=1
  done < <(needed "$elf")
done < <(find "$stage/usr/bin" "$stage/usr/lib/$multiarch" -type f | while read -r f; do
  if readelf -h "$f" >/dev/null 2>&1; then echo "$f"; fi
done)
depends=$(printf '%s\n' "${!deps[@]}" | sort -u | paste -sd, | sed 's/,/, /g')
[[ -n $depends ]] || die "found no library dependencies (readelf/ldd missing?)"

mkdir -p "$stage/DEBIAN"
for script in postinst prerm postrm; do
  install -m 0755 "$SRC/packaging/debian/$script" "$stage/DEBIAN/$script"
done
# libmuster.so.1 is in a directory ld.so.cache covers: refresh it.
echo "activate-noawait ldconfig" >"$stage/DEBIAN/triggers"
chmod 0644 "$stage/DEBIAN/triggers"
installed_size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<EOF
Package: muster
Version: $version
Architecture: $arch
Maintainer: muster developers <muster@localhost>
Installed-Size: $installed_size
Depends: $depends
Recommends: python3
Suggests: python3-torch, python3-numpy
Section: net
Priority: optional
Homepage: file:///usr/share/doc/muster/README.md
Description: per-node rendezvous and collectives daemon for distributed training
 musterd is a long-lived per-node daemon that owns a training job's key-value
 store (wire compatible with PyTorch's TCPStore), its process groups and its
 communicators; ranks link the thin client library libmuster.so (C API,
 pkg-config and CMake files included) or use the Python package, which also
 provides the torch.distributed backend "muster". muster-run launches a job's
 ranks like torchrun, musterctl inspects a running job.
 .
 The systemd unit musterd.service is installed but not enabled.
EOF
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -print | sed 's#^\./##' | sort |
  xargs md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/md5sums"

mkdir -p "$out"
deb=$out/muster_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
