# Sourced by bench/*/devcarry.sh: carry_binary TARGET BINARY builds TARGET in build/release
# (unless SKIP_BUILD=1; JOBS, default 2; ccache with this checkout as base), installs BINARY into
# .devcarry/, and copies into .devcarry/lib the shared libraries it needs beyond the C library, the
# Vulkan loader and libstdc++/libgcc (the GPU machine has those; the benchmarks link libstdc++
# statically anyway). Run from the checkout's root; needs a `log` function.
carry_binary() {
  local target=$1 bin=$2
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    CCACHE_BASEDIR=$(pwd) CCACHE_NOHASHDIR=1 nice -n 10 cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
    CCACHE_BASEDIR=$(pwd) CCACHE_NOHASHDIR=1 nice -n 10 cmake --build build/release -j "${JOBS:-2}" --target "$target"
  fi
  install -m 755 "$bin" ".devcarry/$(basename "$bin")"
  mkdir -p .devcarry/lib
  ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    case $name in
      libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|libvulkan.so.*|libstdc++.so.*|libgcc_s.so.*) ;;
      *) cp -L "$path" ".devcarry/lib/$name"; log "carried $name" ;;
    esac
  done
}
