// The blob store's partial blobs (actors/blob_store.hpp): a sparse data file and a chunk record.
#include "actors/blob_store.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "actors/blob_chunks.hpp"
#include "base/durable_file.hpp"

namespace mesh::blobs {
namespace {

// The record: magic, the file's size, the chunk size, the chunk count, then every chunk's digest
// and a byte per chunk (1: here). Host byte order: a store is read only where it was written.
constexpr char record_magic[8] = {'M', 'E', 'S', 'H', 'C', 'H', 'K', '1'};

template <class T>
void put_raw(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <class T>
bool get_raw(const std::string& in, size_t& at, T& v) {
  if (in.size() - at < sizeof v) return false;
  std::memcpy(&v, in.data() + at, sizeof v);
  at += sizeof v;
  return true;
}

uint64_t chunk_count(uint64_t size) { return (size + chunk_bytes - 1) / chunk_bytes; }
uint64_t chunk_length(uint64_t size, uint64_t index) { return std::min<uint64_t>(chunk_bytes, size - index * chunk_bytes); }

expected<void> write_all(int fd, std::span<const uint8_t> bytes, uint64_t at, const std::filesystem::path& path) {
  size_t put = 0;
  while (put < bytes.size()) {
    const ssize_t n = ::pwrite(fd, bytes.data() + put, bytes.size() - put, static_cast<off_t>(at + put));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return make_error(error_code::io_error, fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)));
    put += static_cast<size_t>(n);
  }
  return {};
}

expected<std::vector<uint8_t>> read_at(const std::filesystem::path& path, uint64_t at, uint64_t length) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return make_error(error_code::io_error, fmt::format("cannot read {}: {}", path.string(), std::strerror(errno)));
  std::vector<uint8_t> out(length);
  size_t got = 0;
  while (got < length) {
    const ssize_t n = ::pread(fd, out.data() + got, length - got, static_cast<off_t>(at + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != length) return make_error(error_code::io_error, fmt::format("{} is shorter than its record says", path.string()));
  return out;
}

}  // namespace

std::filesystem::path blob_store::sparse_of(const digest& d) const { return dir_ / (to_hex(d) + ".sparse"); }
std::filesystem::path blob_store::record_of(const digest& d) const { return dir_ / (to_hex(d) + ".chunks"); }

bool blob_store::load_partial(const digest& d, entry& e) const {
  std::ifstream f(record_of(d), std::ios::binary);
  if (!f) return false;
  const std::string in((std::istreambuf_iterator<char>(f)), {});
  size_t at = 0;
  char magic[8];
  uint64_t size = 0;
  uint32_t chunk = 0, n = 0;
  if (!get_raw(in, at, magic) || std::memcmp(magic, record_magic, sizeof magic) != 0 || !get_raw(in, at, size) ||
      !get_raw(in, at, chunk) || !get_raw(in, at, n) || chunk != chunk_bytes || n != chunk_count(size) ||
      in.size() - at != uint64_t{n} * (sizeof(digest) + 1))
    return false;
  std::error_code ec;
  if (std::filesystem::file_size(sparse_of(d), ec) != size || ec) return false;
  e = entry{};
  e.partial = true;
  e.file_size = size;
  e.list.resize(n);
  for (auto& c : e.list) get_raw(in, at, c);
  e.have.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    e.have[i] = in[at++] == 1;
    if (e.have[i]) e.size += chunk_length(size, i);
  }
  return true;
}

expected<void> blob_store::write_record(const digest& d, const entry& e) const {
  std::string out;
  out.append(record_magic, sizeof record_magic);
  put_raw(out, e.file_size);
  put_raw(out, chunk_bytes);
  put_raw(out, static_cast<uint32_t>(e.list.size()));
  for (const auto& c : e.list) out.append(reinterpret_cast<const char*>(c.data()), c.size());
  for (const bool h : e.have) out.push_back(h ? 1 : 0);
  return write_file_durably(record_of(d), std::span<const char>(out.data(), out.size()), 0600);
}

expected<void> blob_store::open_partial(const digest& d, uint64_t size, std::vector<digest> list) {
  if (list.size() != chunk_count(size))
    return make_error(error_code::invalid_argument, fmt::format("blob {}: {} chunk digests for {} bytes", to_hex(d), list.size(), size));
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = blobs_.find(d); it != blobs_.end()) {
    if (!it->second.partial) return make_error(error_code::invalid_argument, fmt::format("blob {} is whole here already", to_hex(d)));
    if (it->second.file_size != size || it->second.list != list)
      return make_error(error_code::invalid_argument,
                        fmt::format("blob {} is here in part with another chunk list than the one given", to_hex(d)));
    return {};
  }
  const auto path = sparse_of(d);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return make_error(error_code::io_error, fmt::format("cannot create {}: {}", path.string(), std::strerror(errno)));
  const bool sized = ::ftruncate(fd, static_cast<off_t>(size)) == 0;  // sparse: no blocks until chunks come
  const std::string why = std::strerror(errno);
  ::close(fd);
  if (!sized) return make_error(error_code::io_error, fmt::format("cannot size {}: {}", path.string(), why));
  entry e;
  e.partial = true;
  e.file_size = size;
  e.list = std::move(list);
  e.have.assign(e.list.size(), false);
  e.last_use = ++clock_;
  if (auto ok = write_record(d, e); !ok) return ok;
  blobs_[d] = std::move(e);
  return {};
}

std::vector<digest> blob_store::chunk_list_of(const digest& d) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blobs_.find(d);
  if (it == blobs_.end() || !it->second.partial) return {};
  return it->second.list;
}

std::vector<uint64_t> blob_store::missing(const digest& d, const std::vector<uint64_t>& wanted) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blobs_.find(d);
  if (it == blobs_.end() || !it->second.partial) return wanted;
  std::vector<uint64_t> out;
  for (const uint64_t i : wanted)
    if (i >= it->second.have.size() || !it->second.have[i]) out.push_back(i);
  return out;
}

expected<void> blob_store::reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto ok = make_room(bytes); !ok) return ok;
  reserved_ += bytes;
  return {};
}

void blob_store::unreserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= std::min(reserved_, bytes);
}

expected<void> blob_store::put_chunk(const digest& d, uint64_t index, std::span<const uint8_t> bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blobs_.find(d);
  if (it == blobs_.end() || !it->second.partial)
    return make_error(error_code::not_found, fmt::format("no partial blob {} in {}", to_hex(d), dir_.string()));
  entry& e = it->second;
  if (index >= e.list.size() || bytes.size() != chunk_length(e.file_size, index))
    return make_error(error_code::decode_error, fmt::format("blob {}: chunk {} of {} bytes does not fit its {} chunks of {} bytes",
                                                            to_hex(d), index, bytes.size(), e.list.size(), e.file_size));
  if (const auto got = hash_bytes(bytes); got != e.list[index])
    return make_error(error_code::decode_error, fmt::format("blob {}: chunk {} hashes to {}, not the {} of its chunk list", to_hex(d), index,
                                                            to_hex(got), to_hex(e.list[index])));
  if (e.have[index]) return {};
  const auto path = sparse_of(d);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return make_error(error_code::io_error, fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
  auto ok = write_all(fd, bytes, index * chunk_bytes, path);
  ::close(fd);
  if (!ok) return ok;
  e.have[index] = true;
  e.size += bytes.size();
  bytes_ += bytes.size();
  return {};
}

expected<void> blob_store::sync_partial(const digest& d) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blobs_.find(d);
  if (it == blobs_.end() || !it->second.partial)
    return make_error(error_code::not_found, fmt::format("no partial blob {} in {}", to_hex(d), dir_.string()));
  const auto path = sparse_of(d);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return make_error(error_code::io_error, fmt::format("cannot flush {}: {}", path.string(), why));
  }
  ::close(fd);
  // The data first, then the record that says it is there: a crash between them loses chunks,
  // never claims ones that are not on disk.
  return write_record(d, it->second);
}

expected<blob_store::held> blob_store::get_chunks(const digest& d, const std::vector<uint64_t>& wanted) {
  entry copy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blobs_.find(d);
    if (it == blobs_.end() || !it->second.partial)
      return make_error(error_code::not_found, fmt::format("no partial blob {} in {}", to_hex(d), dir_.string()));
    for (const uint64_t i : wanted)
      if (i >= it->second.have.size() || !it->second.have[i])
        return make_error(error_code::not_found, fmt::format("blob {} lacks chunk {}", to_hex(d), i));
    copy.file_size = it->second.file_size;
    copy.list = it->second.list;
  }
  // Verified on every read, outside the lock (reading takes a while), as whole blobs are.
  const auto path = sparse_of(d);
  for (const uint64_t i : wanted) {
    auto bytes = read_at(path, i * chunk_bytes, chunk_length(copy.file_size, i));
    if (!bytes) return tl::unexpected(bytes.error());
    if (const auto got = hash_bytes(*bytes); got != copy.list[i]) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = blobs_.find(d); it != blobs_.end() && it->second.partial && it->second.have[i]) {
        it->second.have[i] = false;
        it->second.size -= bytes->size();
        bytes_ -= bytes->size();
        (void)write_record(d, it->second);
      }
      return make_error(error_code::decode_error, fmt::format("blob {} in {} has a corrupt chunk {} (it hashes to {}): dropped",
                                                              to_hex(d), dir_.string(), i, to_hex(got)));
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blobs_.find(d);
  if (it == blobs_.end()) return make_error(error_code::not_found, fmt::format("no blob {} in {}", to_hex(d), dir_.string()));
  it->second.last_use = ++clock_;
  std::error_code ec;
  std::filesystem::last_write_time(path, std::filesystem::file_time_type::clock::now(), ec);
  return held{path, pin_of(d)};
}

}  // namespace mesh::blobs
