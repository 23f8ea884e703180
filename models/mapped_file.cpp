#include "models/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <utility>

namespace mesh::models {
namespace {

tl::unexpected<error> io_failure(const std::filesystem::path& path, const char* what, int err) {
  return make_error(error_code::io_error, "cannot " + std::string(what) + " " + path.string() + ": " + std::strerror(err));
}

}  // namespace

expected<mapped_file> mapped_file::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_failure(path, "open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return io_failure(path, "stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(error_code::io_error, "cannot map " + path.string() + ": not a regular file");
  }
  mapped_file f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    // MAP_PRIVATE + PROT_READ: pages are shared with the page cache until written, and nothing
    // here writes. The descriptor can close at once: the mapping keeps the file open.
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      f.size_ = 0;
      return io_failure(path, "map", err);
    }
    f.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

mapped_file::mapped_file(mapped_file&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)), path_(std::move(other.path_)) {}

mapped_file& mapped_file::operator=(mapped_file&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

mapped_file::~mapped_file() { release(); }

void mapped_file::release() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

void mapped_file::advise(access_hint hint, std::span<const uint8_t> range) const {
  if (!data_) return;
  if (range.empty()) range = bytes();
  assert(range.data() >= data_ && range.data() + range.size() <= data_ + size_);
  advise_range(range, hint);
}

void advise_range(std::span<const uint8_t> range, access_hint hint) {
  if (range.empty()) return;
  // madvise wants a page-aligned start; widen the range down to its page. Dropping a neighbour's
  // page with dont_need is harmless: the mapping is private and never written, so the page is
  // read from the file again when touched.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(range.data());
  const uintptr_t aligned = begin - begin % page;
  const size_t length = range.size() + (begin - aligned);
  int advice = MADV_NORMAL;
  switch (hint) {
    case access_hint::normal: advice = MADV_NORMAL; break;
    case access_hint::sequential: advice = MADV_SEQUENTIAL; break;
    case access_hint::random: advice = MADV_RANDOM; break;
    case access_hint::will_need: advice = MADV_WILLNEED; break;
    case access_hint::dont_need: advice = MADV_DONTNEED; break;
  }
  (void)::madvise(reinterpret_cast<void*>(aligned), length, advice);
}

}  // namespace mesh::models
