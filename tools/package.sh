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

# Depends: what provides each shared library our ELF files need (NEEDED):
# the package owning the file the dynamic linker resolves it to (ldd), and the
# dependency that package's shlibs file declares for it, as dpkg-shlibdeps
# does. One dpkg -S for all files (it is slow per call).
shipped=" $(cd "$stage" && find . -name 'lib*.so*' -printf '%f ') "
declare -A resolved=() owner=() deps=()
elves=()
while read -r f; do
  readelf -h "$f" >/dev/null 2>&1 && elves+=("$f")
done < <(find "$stage/usr/bin" "$stage/usr/lib/$multiarch" -type f)
((${#elves[@]})) || die "no ELF files in the staged tree"
needed=()
for elf in "${elves[@]}"; do
  while read -r soname; do
    # The dynamic linker itself comes with libc6, which libc.so.6 brings in.
    [[ -z $soname || $soname == ld-linux* || $shipped == *" $soname "* ]] && continue
    needed+=("$soname")
  done < <(readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  while read -r soname path; do
    [[ -n ${resolved[$soname]:-} ]] || resolved[$soname]=$path
  done < <(ldd "$elf" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
done
# Debian 12 merged /lib into /usr/lib; dpkg knows each file by one spelling.
candidates=()
for soname in "${!resolved[@]}"; do
  path=${resolved[$soname]}
  candidates+=("$path" "$(readlink -f "$path")" "/usr$path" "${path#/usr}")
done
while IFS= read -r line; do
  pkg=${line%%: *}
  owner[${line#*: }]=$pkg
done < <(dpkg -S "${candidates[@]}" 2>/dev/null || true)
# shlibs_dep SONAME PACKAGE: the dependency PACKAGE's shlibs file declares
# for SONAME (e.g. "libgrpc++1.51 (>= 1.51.1)"), or nothing.
shlibs_dep() {
  local name ver f
  if [[ $1 =~ ^(.*)\.so\.([0-9.]+)$ ]]; then
    name=${BASH_REMATCH[1]}
    ver=${BASH_REMATCH[2]}
  elif [[ $1 =~ ^(.*)-([0-9.]+)\.so$ ]]; then
    name=${BASH_REMATCH[1]}
    ver=${BASH_REMATCH[2]}
  else
    return 0
  fi
  for f in "/var/lib/dpkg/info/$2.shlibs" "/var/lib/dpkg/info/${2%%:*}.shlibs"; do
    [[ -f $f ]] || continue
    # Lines: "[type:] library soversion dependencies"; udeb lines are not ours.
    awk -v n="$name" -v v="$ver" '$1 == n && $2 == v && !found {
      $1 = ""; $2 = ""; sub(/^ +/, ""); print; found = 1 }' "$f"
    return 0
  done
}
for soname in $(printf '%s\n' "${needed[@]}" | sort -u); do
  path=${resolved[$soname]:-}
  pkg=""
  if [[ -n $path ]]; then
    for p in "$path" "$(readlink -f "$path")" "/usr$path" "${path#/usr}"; do
      pkg=${owner[$p]:-}
      [[ -n $pkg ]] && break
    done
  fi
  if [[ -z $pkg ]]; then
    echo "package.sh: warning: no Debian package provides $soname${path:+ ($path)}" >&2
    continue
  fi
  dep=$(shlibs_dep "$soname" "$pkg")
  deps[${dep:-${pkg%%:*}}]=1
done
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
