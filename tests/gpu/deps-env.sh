# deps-env.sh DEBS PREFIX - sourced by tests/gpu/run.sh: unpacks every
# DEBS/*.deb into PREFIX (dpkg -x: nothing is installed) and points
# pkg-config, the compiler, the linker and the loader at it.
_debs=$1 _pre=$2
rm -rf "$_pre" && mkdir -p "$_pre" || return 1
for _f in "$_debs"/*.deb; do dpkg -x "$_f" "$_pre" || return 1; done
_lib=$_pre/usr/lib/x86_64-linux-gnu
# Debian points openblas.pc and libopenblas.so at a variant through
# alternatives, which dpkg -x does not create: name the pthread one.
mkdir -p "$_lib/pkgconfig"
if [ ! -e "$_lib/pkgconfig/openblas.pc" ]; then
  cp "$_lib/openblas-pthread/pkgconfig/openblas.pc" "$_lib/pkgconfig/openblas.pc" || return 1
fi
# libpcre2-8-0 stays the host's (fetch-debs.sh leaves it out, as every
# distribution has it and the host's programs use it): the link name that
# libpcre2-dev brings points at the host's library instead.
if [ ! -e "$_lib/libpcre2-8.so" ]; then
  _pcre=$(/sbin/ldconfig -p 2>/dev/null | awk '/libpcre2-8\.so\.0 .*x86-64/ {print $NF; exit}')
  [ -n "$_pcre" ] && ln -sf "$_pcre" "$_lib/libpcre2-8.so"
fi
# Programs that are not ours (python3 with torch) run with the loader path
# the host had: tests/gpu/bench.sh restores it from here.
export TY_HOST_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export PATH=$_pre/usr/bin:$PATH
export PKG_CONFIG_LIBDIR=$_lib/pkgconfig:$_pre/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$_pre
export LD_LIBRARY_PATH=$_lib:$_lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CPATH=$_pre/usr/include:$_pre/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
# CMake's find_library (behind pkg_check_modules) searches these first.
export CMAKE_PREFIX_PATH=$_pre/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
export CMAKE_LIBRARY_PATH=$_lib/openblas-pthread${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}
export LIBRARY_PATH=$_lib:$_lib/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}
