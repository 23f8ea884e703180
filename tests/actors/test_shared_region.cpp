// Shared regions (actors/shared_region.hpp): what a writer puts in its region a reader on the same
// host maps and reads, also from another process after the writer is gone; a locator that names
// anything else (another file, the wrong nonce or size, an unsealed memfd, no such process) is
// refused with the reason, before anything is mapped where that matters.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "actors/shared_region.hpp"

using namespace mesh;

namespace {

void fill(uint8_t* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
}
bool holds(const uint8_t* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != static_cast<uint8_t>(seed + i * 7)) return false;
  return true;
}

}  // namespace

TEST_CASE("a region's writer and a reader of its locator see the same bytes", "[actors][shm]") {
  auto w = shared_region::create(1 << 20);
  REQUIRE(w);
  CHECK(w->data_bytes() == 1 << 20);
  CHECK(w->locator().pid == static_cast<uint32_t>(getpid()));
  fill(w->data(), 1 << 20, 3);
  auto r = shared_region::open(w->locator());
  REQUIRE(r);
  CHECK(r->data() == nullptr);  // read-only: no writable view
  CHECK(holds(std::as_const(*r).data(), 1 << 20, 3));
  w->data()[5] = 99;  // later writes show through
  CHECK(std::as_const(*r).data()[5] == 99);
  // Moved, the region stays mapped once.
  shared_region moved = std::move(*r);
  CHECK(std::as_const(moved).data()[5] == 99);
}

TEST_CASE("a region written by another process is read after that process is gone", "[actors][shm]") {
  int to_parent[2], to_child[2];
  REQUIRE(pipe(to_parent) == 0);
  REQUIRE(pipe(to_child) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto w = shared_region::create(4096);
    if (!w) _exit(1);
    fill(w->data(), 4096, 42);
    const region_locator at = w->locator();
    if (write(to_parent[1], &at, sizeof at) != sizeof at) _exit(2);
    char go;
    if (read(to_child[0], &go, 1) != 1) _exit(3);
    _exit(0);
  }
  region_locator at;
  REQUIRE(read(to_parent[0], &at, sizeof at) == sizeof at);
  CHECK(at.pid == static_cast<uint32_t>(child));
  auto r = shared_region::open(at);
  REQUIRE(r);
  REQUIRE(write(to_child[1], "x", 1) == 1);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(holds(std::as_const(*r).data(), 4096, 42));  // the mapping keeps the memory
  // The process is gone: its locator names nothing any more.
  auto gone = shared_region::open(at);
  REQUIRE_FALSE(gone);
  CHECK(gone.error().code == error_code::not_found);
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) close(fd);
}

TEST_CASE("a locator that names anything but that region is refused, saying what it names", "[actors][shm][security]") {
  auto w = shared_region::create(4096);
  REQUIRE(w);
  const auto refused = [](region_locator at, error_code code, const std::string& why) {
    auto r = shared_region::open(at);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == code);
    CHECK_THAT(r.error().message, Catch::Contains(why));
  };
  region_locator at = w->locator();
  at.nonce[3] ^= 1;
  refused(at, error_code::invalid_argument, "its header is not the one named");
  at = w->locator();
  at.size += 4096;
  refused(at, error_code::invalid_argument, "bytes, not");
  at.size = 10;
  refused(at, error_code::invalid_argument, "not a size a region has");
  at.size = shared_region::max_bytes + 1;
  refused(at, error_code::invalid_argument, "not a size a region has");
  // Another file of this process: named, not mapped.
  const int status = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  REQUIRE(status >= 0);
  at = w->locator();
  at.fd = static_cast<uint32_t>(status);
  refused(at, error_code::invalid_argument, "not a shared region");
  close(status);
  // A memfd of the right name that its writer could still shrink under the reader.
  const int unsealed = memfd_create("meshnode-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(unsealed >= 0);
  REQUIRE(ftruncate(unsealed, 4096 + shared_region::header_bytes) == 0);
  at.fd = static_cast<uint32_t>(unsealed);
  at.size = 4096 + shared_region::header_bytes;
  refused(at, error_code::invalid_argument, "not sealed against shrinking");
  close(unsealed);
  // No such descriptor, no such process (on another host the pid names nothing, or another process).
  at = w->locator();
  at.fd = 100000;
  refused(at, error_code::not_found, "no shared region");
  at = w->locator();
  at.pid = 0x3ffffff0;
  refused(at, error_code::not_found, "no shared region");
  CHECK(shared_region::open(w->locator()));  // and the region itself still opens
}
