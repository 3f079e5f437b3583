#!/usr/bin/env bash
# fetch-debs.sh DIR - gathers, on a Debian machine with apt, the .deb files
# of the worker's build libraries (jansson, OpenBLAS, libcurl, protobuf-c
# with protoc-c for TensorBoard's event files, PCRE2's headers, utf8proc,
# pkg-config)
# and of what they need, for a GPU host that has the CUDA toolkit but not
# these (tests/gpu/run.sh unpacks them with TY_DEPS_DEBS=DIR into a private
# prefix; nothing is installed). The C runtime and the compiler's own
# libraries are left out: the host has its own, and they must not be shadowed.
# So are the libraries whose soname every glibc distribution of the same
# age shares; libunistring is not among them (Debian 12 has .so.2, Ubuntu
# 24.04 .so.5, and Debian's libpsl needs .so.2), so it travels.
set -euo pipefail
dir=${1:?usage: tests/gpu/fetch-debs.sh DIR}
mkdir -p "$dir"
want=(libjansson-dev libopenblas-dev libopenblas-pthread-dev libcurl4-openssl-dev libprotobuf-c-dev
      protobuf-c-compiler libpcre2-dev libutf8proc-dev pkgconf)
skip='^(libopenblas.*-(openmp|serial)(-dev)?|libc6|libc-dev-bin|libc6-dev|libgcc-s1|libstdc\+\+6|libcrypt1|libcrypt-dev|linux-libc-dev|gcc-.*|cpp.*|debconf.*|dpkg|perl.*|tar|zlib1g|libzstd1|liblzma5|libbz2-1.0|libselinux1|libpcre2-8-0|libssl3|libssl-dev|libgnutls30|libidn2-0|libp11-kit0|libffi8|libtasn1-6|libnettle8|libhogweed6|libgmp10)$'
pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances "${want[@]}" | grep -E '^[a-z0-9]' | sort -u | grep -Ev "$skip")
cd "$dir"
# shellcheck disable=SC2086
apt-get download $pkgs >/dev/null
echo "fetch-debs: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $dir"
