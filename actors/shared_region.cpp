#include "actors/shared_region.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace mesh {
namespace {

constexpr char memfd_name[] = "meshnode-region";
constexpr char magic[16] = "meshnode-region";  // 15 characters and the terminating zero

tl::unexpected<error> sys_error(const std::string& what) {
  return make_error(error_code::io_error, what + ": " + std::strerror(errno));
}

}  // namespace

expected<shared_region> shared_region::create(uint64_t data_bytes) {
  if (data_bytes > max_bytes - header_bytes) return make_error(error_code::invalid_argument, "shared region of " + std::to_string(data_bytes) + " bytes: too large");
  shared_region r;
  r.fd_ = memfd_create(memfd_name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (r.fd_ < 0) return sys_error("memfd_create");
  r.where_.size = header_bytes + data_bytes;
  if (ftruncate(r.fd_, static_cast<off_t>(r.where_.size)) != 0) return sys_error("ftruncate of a shared region");
  // Fixed size from now on: a reader's mapping can never point past the file's end.
  if (fcntl(r.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return sys_error("sealing a shared region");
  void* p = mmap(nullptr, r.where_.size, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd_, 0);
  if (p == MAP_FAILED) return sys_error("mapping a shared region");
  r.map_ = static_cast<uint8_t*>(p);
  r.writable_ = true;
  if (getrandom(r.where_.nonce.data(), r.where_.nonce.size(), 0) != static_cast<ssize_t>(r.where_.nonce.size()))
    return sys_error("getrandom");
  std::memcpy(r.map_, magic, sizeof magic);
  std::memcpy(r.map_ + sizeof magic, r.where_.nonce.data(), r.where_.nonce.size());
  r.where_.pid = static_cast<uint32_t>(getpid());
  r.where_.fd = static_cast<uint32_t>(r.fd_);
  return r;
}

expected<shared_region> shared_region::open(const region_locator& where) {
  if (where.size <= header_bytes || where.size > max_bytes)
    return make_error(error_code::invalid_argument, "shared region of " + std::to_string(where.size) + " bytes: not a size a region has");
  const std::string path = "/proc/" + std::to_string(where.pid) + "/fd/" + std::to_string(where.fd);
  // What the descriptor is, before opening it: opening a named pipe or a device may block or
  // have effects of its own. The writer could swap the descriptor in between; fstat below checks
  // what was opened.
  char link[256];
  const ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
  if (n < 0) {
    if (errno == ENOENT || errno == ESRCH) return make_error(error_code::not_found, "no shared region at " + path + " on this host");
    return sys_error("reading the link " + path);
  }
  link[n] = 0;
  const std::string expected_link = std::string("/memfd:") + memfd_name + " (deleted)";
  if (expected_link != link) return make_error(error_code::invalid_argument, path + " is \"" + link + "\", not a shared region");
  shared_region r;
  // Read-write where this process may (the file is this user's): a device imports only memory
  // it may pin for writing (NVIDIA's driver), and a training's device copies the members' sums
  // straight out of their regions (region_import.hpp). Through this class a reader still has
  // const access only, and its device only reads.
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
  const bool read_write = fd >= 0;
  if (fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS)) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return make_error(error_code::not_found, "no shared region at " + path + " on this host");
    return sys_error("opening " + path);
  }
  struct stat st {};
  const bool stat_ok = fstat(fd, &st) == 0;
  const int seals = fcntl(fd, F_GET_SEALS);
  std::string wrong;
  if (!stat_ok) wrong = std::string("fstat failed: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) wrong = "not a regular file";
  else if (st.st_uid != geteuid()) wrong = "owned by another user";
  else if (static_cast<uint64_t>(st.st_size) != where.size) wrong = std::to_string(st.st_size) + " bytes, not " + std::to_string(where.size);
  else if (seals < 0 || !(seals & F_SEAL_SHRINK)) wrong = "not sealed against shrinking";
  if (!wrong.empty()) {
    ::close(fd);
    return make_error(error_code::invalid_argument, "shared region " + path + ": " + wrong);
  }
  void* p = mmap(nullptr, where.size, PROT_READ | (read_write ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return sys_error("mapping the shared region " + path);
  r.map_ = static_cast<uint8_t*>(p);
  r.where_ = where;
  if (std::memcmp(r.map_, magic, sizeof magic) != 0 || std::memcmp(r.map_ + sizeof magic, where.nonce.data(), where.nonce.size()) != 0)
    return make_error(error_code::invalid_argument, "shared region " + path + ": its header is not the one named");
  return r;
}

shared_region::shared_region(shared_region&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      map_(std::exchange(o.map_, nullptr)),
      writable_(o.writable_),
      where_(o.where_),
      attached_(std::move(o.attached_)) {}

shared_region& shared_region::operator=(shared_region&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
    map_ = std::exchange(o.map_, nullptr);
    writable_ = o.writable_;
    where_ = o.where_;
    attached_ = std::move(o.attached_);
  }
  return *this;
}

shared_region::~shared_region() { release(); }

void shared_region::release() {
  attached_.clear();  // a device's import of the pages goes before them
  if (map_) munmap(map_, where_.size);
  if (fd_ >= 0) ::close(fd_);
  map_ = nullptr;
  fd_ = -1;
}

}  // namespace mesh
