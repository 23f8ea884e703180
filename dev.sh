#!/usr/bin/env bash
# meshnode developer script: one entry point for set-up, the demo and the tests.
#
#   ./dev.sh demo    install what is missing, build Release, run the demo (3 local meshnodes
#                    train a small transformer, then serve a model over HTTP; options after `demo`
#                    go to mesh-demo, see --help; `./dev.sh demo --serve` serves until Ctrl-C)
#   ./dev.sh test    install what is missing, build Debug (+ASan/UBSan, clang), run every test via ctest,
#                    build the libFuzzer targets with clang and run each briefly (it also unpacks
#                    Debian testing's spirv-val into ~/.cache/meshnode: tests/fetch_spirv_val.sh)
#   ./dev.sh build [Release|Debug]   just build
#   ./dev.sh deps    just install the Debian packages
#   ./dev.sh fuzz    only the fuzzers, the long run: 10 minutes each, two at a time
#                    (MESH_FUZZ_SECONDS overrides)
#
# Environment: MESH_JOBS (parallel jobs, default nproc), MESH_FUZZ_SECONDS (default 5 in `test`),
# MESH_SANITIZE (ON/OFF for the test build, default ON).
set -euo pipefail
cd "$(dirname "$0")"
root=$(pwd)
jobs=${MESH_JOBS:-$(nproc)}

# chromium and prometheus: the dashboard and /metrics tests (headless Chromium, promtool, which
# Debian ships only in the prometheus package; on a machine with systemd its install also starts
# a Prometheus service on :9090: `systemctl disable --now prometheus` if that is unwanted).
packages=(
  cmake ninja-build ccache g++ clang lld libclang-rt-14-dev pkg-config
  libexpected-dev catch2 libfmt-dev libspdlog-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libcaf-dev libsodium-dev libngtcp2-dev libngtcp2-crypto-gnutls-dev libgnutls28-dev
  libavahi-client-dev libavahi-compat-libdnssd-dev avahi-daemon avahi-utils dbus
  libvulkan-dev mesa-vulkan-drivers vulkan-tools vulkan-validationlayers
  libshaderc-dev glslc glslang-dev spirv-tools
  libpcre2-dev libcpp-httplib-dev curl xz-utils nodejs chromium prometheus
  iproute2 nftables iptables conntrack python3
  python3-numpy python3-torch python3-sentencepiece python3-regex python3-jinja2
)

log() { printf '\033[1m[dev.sh]\033[0m %s\n' "$*"; }

deps() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # npm: Debian's nodejs leaves it to the npm package, NodeSource's nodejs carries it (and then
  # conflicts with Debian's npm): ask for the package only when the command is missing.
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# build <dir> <type> [cmake args...]
build() {
  local dir=$1 type=$2
  shift 2
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
}

# Services the tests need (dbus + avahi-daemon for discovery). Started only when not running,
# and stopped after only if we started them.
started_services=()
start_services() {
  [ "$(id -u)" = 0 ] || { log "not root: leaving dbus/avahi alone (discovery tests will skip)"; return; }
  if ! avahi-daemon -c 2>/dev/null; then
    mkdir -p /run/dbus
    if [ ! -S /run/dbus/system_bus_socket ] || ! pgrep -x dbus-daemon >/dev/null; then
      rm -f /run/dbus/pid
      dbus-daemon --system --fork && started_services+=(dbus)
    fi
    ip link set lo up 2>/dev/null || true
    avahi-daemon -D && started_services+=(avahi)
    for _ in $(seq 50); do avahi-daemon -c 2>/dev/null && break; sleep 0.1; done
  fi
}
stop_services() {
  for s in "${started_services[@]}"; do
    case $s in
      avahi) avahi-daemon -k 2>/dev/null || true ;;
      dbus) [ -f /run/dbus/pid ] && kill "$(cat /run/dbus/pid)" 2>/dev/null || true ;;
    esac
  done
}

run_tests() {
  local san=${MESH_SANITIZE:-ON}
  # clang: it compiles this tree about twice as fast as g++ 12 with ASan+UBSan (CAF's templates
  # most of all), and CI's time is mostly the build. The Release build (demo, benchmarks) stays g++.
  # Line tables only (not full debug info): sanitizer reports keep file:line, and the build is
  # about a fifth faster; lld links the ASan executables faster than ld.bfd. The benchmarks are
  # not built here: no test runs them, and the demo's Release build compiles them.
  build build/test Debug -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DMESH_SANITIZE="$san" -DMESH_WERROR=ON \
    -DCMAKE_C_FLAGS_DEBUG=-gline-tables-only -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only -DMESH_BENCH=OFF \
    -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld
  start_services
  trap stop_services EXIT
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  # Leaks inside system libraries we do not own (Mesa's lavapipe, LLVM, Avahi) are listed there.
  [ -f "$root/tests/lsan.supp" ] && export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/lsan.supp:print_suppressions=0}
  # A SPIR-V validator that knows the KHR cooperative matrices and bf16 of the rewritten bf16
  # kernels (Debian 12's does not): the codegen tests check every such kernel with it.
  MESH_SPIRV_VAL=$("$root/tests/fetch_spirv_val.sh") || { log "FAILED: fetching a SPIR-V validator (tests/fetch_spirv_val.sh)"; return 1; }
  export MESH_SPIRV_VAL
  local rc=0
  # Fuzzers and the GPU tests (run once, under the Vulkan validation layers) first, so that the
  # summary of the other tests is the last thing printed.
  run_fuzzers || rc=$?
  run_vulkan_validation || rc=$?
  (cd build/test && ctest -LE gpu -j "$jobs" --output-on-failure --timeout 600) || rc=$?
  [ $rc = 0 ] || log "FAILED (exit $rc): see the failures above"
  return $rc
}

# The GPU tests (ctest label gpu) with VK_LAYER_KHRONOS_validation on: a failed test or any
# validation message fails. They run only here: the main ctest pass leaves them out.
run_vulkan_validation() {
  local out=build/test/vulkan-validation.log
  log "gpu tests with Vulkan validation layers"
  # -V: passing tests' output too (validation messages do not fail a test by themselves).
  (cd build/test && MESH_VK_VALIDATION=1 ctest -L gpu -j "$jobs" -V --timeout 600) >"$out" 2>&1 || {
    log "FAILED: gpu tests under validation (log: $out)"; tail -40 "$out"; return 1; }
  local n
  n=$(grep -c '\[vulkan validation\]' "$out" || true)
  log "vulkan validation: $n messages over $(grep -c 'Passed' "$out") gpu tests"
  [ "$n" = 0 ] || { grep '\[vulkan validation\]' "$out" | head -20; return 1; }
}

run_fuzzers() {
  local secs=${MESH_FUZZ_SECONDS:-5}
  # Only the fuzzers and the header check: the rest of the tree is built (and tested) by the
  # test build. Every library here is instrumented (see MESH_FUZZ in CMakeLists.txt).
  CC=clang CXX=clang++ cmake -S "$root" -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMESH_FUZZ=ON -DMESH_BENCH=OFF \
    -DCMAKE_C_FLAGS_DEBUG=-gline-tables-only -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld >/dev/null
  # shellcheck disable=SC2046
  # (Checked here: this function runs where `set -e` does not stop on a failed command.)
  if ! cmake --build build/fuzz -j "$jobs" --target mesh_header_check $(cat build/fuzz/fuzzers.txt); then
    log "the header check or a fuzzer does not build"
    return 1
  fi
  # One fuzzer per core at a time (each is single-threaded).
  local failed=0 n=0 f
  while read -r f; do
    [ -n "$f" ] || continue
    n=$((n + 1))
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    log "fuzzing $f for ${secs}s"
    (
      corpus="build/fuzz/corpus/$f"
      mkdir -p "$corpus"
      rc=0
      "build/fuzz/$(find build/fuzz -name "$f" -type f -executable -printf '%P\n' | head -1)" \
        -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=0 "$corpus" \
        >"build/fuzz/$f.log" 2>&1 || rc=$?
      echo "$rc" >"build/fuzz/$f.rc"
    ) &
  done <build/fuzz/fuzzers.txt
  wait
  while read -r f; do
    [ -n "$f" ] || continue
    if [ "$(cat "build/fuzz/$f.rc" 2>/dev/null)" != 0 ]; then
      log "FUZZER FAILED: $f (log: build/fuzz/$f.log)"
      tail -40 "build/fuzz/$f.log"
      failed=$((failed + 1))
    fi
  done <build/fuzz/fuzzers.txt
  log "fuzzers: $((n - failed)) passed, $failed failed"
  return $((failed > 0))
}

run_demo() {
  build build/release Release
  # The demo's nodes find each other by mDNS: start avahi-daemon when we can (and stop it after);
  # without it the demo says so and gives the nodes static peers.
  start_services
  local rc=0
  "$root/build/release/apps/mesh-demo" "$@" || rc=$?
  stop_services
  return $rc
}

cmd=${1:-help}
shift || true
case $cmd in
  deps) deps ;;
  build) deps; build "build/$(echo "${1:-Release}" | tr A-Z a-z)" "${1:-Release}" ;;
  test) deps; run_tests ;;
  demo) deps; run_demo "$@" ;;
  fuzz) deps; MESH_FUZZ_SECONDS=${MESH_FUZZ_SECONDS:-600} run_fuzzers ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
