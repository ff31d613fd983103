# Sourced on the GPU machine (which lacks some Debian dev packages): unpacks the .deb files carried in
# .carry/debs (made here with `apt-get download`, see docs/GPU.md) into /opt/fern-deps and points CMake,
# pkg-config and the loader at them. Usage: `source tools/gpu-env.sh` (with carry: [".carry"]).
FERN_DEPS=/opt/fern-deps
if [ ! -d "$FERN_DEPS" ]; then
  mkdir -p "$FERN_DEPS"
  for f in .carry/debs/*.deb; do dpkg -x "$f" "$FERN_DEPS"; done
fi
export CMAKE_PREFIX_PATH="$FERN_DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$FERN_DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$FERN_DEPS/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$FERN_DEPS"
export LD_LIBRARY_PATH="$FERN_DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CPATH="$FERN_DEPS/usr/include${CPATH:+:$CPATH}"
