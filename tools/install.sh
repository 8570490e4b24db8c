#!/usr/bin/env bash
# Installs muster like system software: the three programs, libmuster.so (the
# C API) with its header, pkg-config and CMake files, the systemd unit (not
# enabled), the Python package, man pages and bash completion.
#
# Usage: tools/install.sh [--prefix P] [--destdir D] [--libdir DIR]
#                         [--python-dir DIR | --no-python] [--from DIR] [--strip]
#
#   --prefix P      where muster lives once installed (default /usr/local)
#   --destdir D     stage the tree under D instead of / (packaging); the files'
#                   contents still name P
#   --libdir DIR    libraries, pkgconfig/ and cmake/, relative to P (default
#                   lib; e.g. lib/x86_64-linux-gnu)
#   --python-dir DIR  the Python package's directory (absolute, under P as
#                   installed; default /usr/lib/python3/dist-packages for P=/usr,
#                   else P/lib/python3.X/dist-packages for /usr/bin/python3's X)
#   --no-python     leave the Python package out
#   --from DIR      install the binaries already built in DIR, laid out like
#                   bazel-bin (daemon/musterd, tools/musterctl, tools/muster-run,
#                   client/libmuster.so.1) instead of running
#                   `bazel build -c opt` in the source tree
#   --strip         strip the binaries and the library (what tools/package.sh does)
#
# What goes where (P = prefix, L = P/libdir):
#   P/bin/{musterd,musterctl,muster-run}
#   L/libmuster.so.1 (soname: the C API version), L/libmuster.so -> libmuster.so.1
#   P/include/muster/muster.h        the C API, the one public header of the library
#   L/pkgconfig/muster.pc            pkg-config --cflags --libs muster
#   L/cmake/muster/muster-config{,-version}.cmake   find_package(muster): muster::muster
#   P/lib/systemd/system/musterd.service   ExecStart=P/bin/musterd (not enabled)
#   python-dir/muster/               the Python SDK and muster.torch; muster/_installed.py
#                                    records where libmuster.so and muster.h are
#   P/share/man/man1/{musterd,musterctl,muster-run}.1.gz   from each program's --help
#   P/share/bash-completion/completions/{musterctl,muster-run,musterd}
#   P/share/doc/muster/{README.md,musterd.conf.example,...}
#
# The C++ SDK's headers (muster/world.h, ...) are not installed: libmuster.so
# exports the C API alone (client/libmuster.lds), so they would not link.
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=/usr/local
destdir=""
libdir=lib
python_dir=""
with_python=1
from=""
strip=0

usage() {
  sed -n '/^# Usage:/,/^# What goes/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}
die() {
  echo "install.sh: $*" >&2
  exit 1
}

while (($#)); do
  case $1 in
    --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --destdir) destdir=${2:?--destdir needs a value}; shift 2 ;;
    --destdir=*) destdir=${1#*=}; shift ;;
    --libdir) libdir=${2:?--libdir needs a value}; shift 2 ;;
    --libdir=*) libdir=${1#*=}; shift ;;
    --python-dir) python_dir=${2:?--python-dir needs a value}; shift 2 ;;
    --python-dir=*) python_dir=${1#*=}; shift ;;
    --no-python) with_python=0; shift ;;
    --from) from=${2:?--from needs a value}; shift 2 ;;
    --from=*) from=${1#*=}; shift ;;
    --strip) strip=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

[[ $prefix == /* ]] || die "--prefix must be an absolute path, not '$prefix'"
prefix=${prefix%/}
[[ $libdir != /* ]] || die "--libdir is relative to the prefix, not '$libdir'"
libdir=${libdir%/}
if [[ -n $destdir ]]; then
  mkdir -p "$destdir"
  destdir=$(cd "$destdir" && pwd)
fi

# The release version: one place, common/version.h.
version=$(sed -n 's/.*kVersion\[\] = "\([^"]*\)".*/\1/p' "$SRC/common/version.h")
[[ -n $version ]] || die "no kVersion in $SRC/common/version.h"
# The soname follows the C API version (client/BUILD.bazel's libmuster.so.1).
api=$(sed -n 's/^#define MUSTER_C_API_VERSION \([0-9]*\).*/\1/p' "$SRC/client/include/muster/muster.h")
soname=libmuster.so.$api

if [[ -z $from ]]; then
  command -v bazel >/dev/null || die "bazel not found: build first or give --from DIR"
  echo "install.sh: building with bazel -c opt (a few minutes the first time)"
  (cd "$SRC" && bazel build -c opt //daemon:musterd //tools:musterctl //tools:muster-run \
    "//client:$soname")
  from=$(cd "$SRC" && bazel info -c opt bazel-bin 2>/dev/null)
fi
for f in daemon/musterd tools/musterctl tools/muster-run "client/$soname"; do
  [[ -f $from/$f ]] || die "missing $from/$f (build //client:$soname and the programs)"
done

root=$destdir$prefix
bindir=$root/bin
lib=$root/$libdir

# install FILE MODE DEST: copies FILE to DEST (a file path), making its
# directory; prints the installed path (without the destdir).
put() {
  install -D -m "$2" "$1" "$3"
  echo "  ${3#"$destdir"}"
}

echo "install.sh: muster $version into ${destdir:+$destdir (destdir) + }${prefix:-/}"

for prog in daemon/musterd tools/musterctl tools/muster-run; do
  put "$from/$prog" 0755 "$bindir/$(basename "$prog")"
  ((strip)) && strip --strip-unneeded "$bindir/$(basename "$prog")"
done

put "$from/client/$soname" 0644 "$lib/$soname"
((strip)) && strip --strip-unneeded "$lib/$soname"
ln -sfn "$soname" "$lib/libmuster.so"
echo "  ${lib#"$destdir"}/libmuster.so -> $soname"

put "$SRC/client/include/muster/muster.h" 0644 "$root/include/muster/muster.h"

# substitute TEMPLATE DEST: fills the @VARS@ of a template under packaging/.
# The CMake files find the prefix from their own directory (relocatable).
cmake_to_prefix=$(echo "$libdir/cmake/muster" | sed 's#[^/][^/]*#..#g')
substitute() {
  local tmp
  tmp=$(mktemp)
  sed -e "s#@PREFIX@#$prefix#g" -e "s#@LIBDIR@#$libdir#g" -e "s#@VERSION@#$version#g" \
    -e "s#@SONAME@#$soname#g" -e "s#@CMAKE_TO_PREFIX@#$cmake_to_prefix#g" \
    "$SRC/packaging/$1" >"$tmp"
  put "$tmp" 0644 "$2"
  rm -f "$tmp"
}
substitute muster.pc.in "$lib/pkgconfig/muster.pc"
substitute muster-config.cmake.in "$lib/cmake/muster/muster-config.cmake"
substitute muster-config-version.cmake.in "$lib/cmake/muster/muster-config-version.cmake"

# The unit names the installed musterd and docs; installed, never enabled.
unit=$(mktemp)
sed -e "s#/usr/local/bin/musterd#$prefix/bin/musterd#g" \
  -e "s#file:///usr/share/doc/muster/#file://$prefix/share/doc/muster/#g" \
  "$SRC/deploy/systemd/musterd.service" >"$unit"
put "$unit" 0644 "$root/lib/systemd/system/musterd.service"
rm -f "$unit"

doc=$root/share/doc/muster
put "$SRC/README.md" 0644 "$doc/README.md"
put "$SRC/deploy/README.md" 0644 "$doc/deploy.md"
put "$SRC/deploy/musterd.conf.example" 0644 "$doc/musterd.conf.example"

# Man pages from each program's --help (packaging/gen_man.py).
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3) || die "python3 not found (man pages, Python package)"
man1=$root/share/man/man1
mkdir -p "$man1"
for prog in musterd musterctl muster-run; do
  "$py" "$SRC/packaging/gen_man.py" "$bindir/$prog" "$prog" "$version" >"$man1/$prog.1"
  gzip -9nf "$man1/$prog.1"
  echo "  ${man1#"$destdir"}/$prog.1.gz"
done

completions=$root/share/bash-completion/completions
put "$SRC/packaging/completions/muster.bash" 0644 "$completions/musterctl"
for prog in muster-run musterd; do
  ln -sfn musterctl "$completions/$prog"
  echo "  ${completions#"$destdir"}/$prog -> musterctl"
done

if ((with_python)); then
  if [[ -z $python_dir ]]; then
    if [[ $prefix == /usr ]]; then
      python_dir=/usr/lib/python3/dist-packages
    else
      pyver=$("$py" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
      python_dir=$prefix/lib/$pyver/dist-packages
    fi
  fi
  [[ $python_dir == /* ]] || die "--python-dir must be absolute, not '$python_dir'"
  pkg=$destdir$python_dir/muster
  rm -rf "$pkg"
  (cd "$SRC/python" && find -L muster -type f \( -name '*.py' -o -name '*.cpp' -o -name '*.h' \
    -o -name '*.md' \) -not -path '*/__pycache__/*' | sort) | while read -r f; do
    install -D -m 0644 "$SRC/python/$f" "$destdir$python_dir/$f"
  done
  cat >"$pkg/_installed.py" <<EOF
# Written by tools/install.sh: where this installation keeps what the Python
# package needs (muster._capi loads LIBRARY; muster.torch compiles against
# INCLUDE_DIR/muster/muster.h).
LIBRARY = "$prefix/$libdir/$soname"
INCLUDE_DIR = "$prefix/include"
EOF
  chmod 0644 "$pkg/_installed.py"
  echo "  $python_dir/muster/ ($(find "$pkg" -type f | wc -l) files)"
fi

echo "install.sh: done. The unit is installed, not enabled:"
echo "  systemctl daemon-reload && systemctl enable --now musterd"
