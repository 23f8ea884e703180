#include "actors/blob_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/durable_file.hpp"

namespace mesh::blobs {
namespace {

std::string human(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

expected<std::shared_ptr<blob_store>> blob_store::open(const std::filesystem::path& dir, uint64_t max_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(error_code::io_error, fmt::format("cannot create the blob cache {}: {}", dir.string(), ec.message()));
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
  auto s = std::shared_ptr<blob_store>(new blob_store(dir, max_bytes));
  std::vector<std::pair<std::filesystem::file_time_type, digest>> found;
  std::vector<std::filesystem::path> records;  // partial blobs' chunk records, taken with their data
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = f.path().filename().string();
    if (name.size() == 64 + 7 && name.ends_with(".chunks") && f.is_regular_file()) {
      records.push_back(f.path());
      continue;
    }
    const bool sparse = name.size() == 64 + 7 && name.ends_with(".sparse");
    auto d = parse_digest(sparse ? name.substr(0, 64) : name);
    entry e;
    if (!d || !f.is_regular_file() || (sparse && !s->load_partial(*d, e))) {
      // A staging file of a fetch the process did not finish, a partial blob without its
      // record, or something that is no blob.
      std::filesystem::remove_all(f.path(), ec);
      continue;
    }
    if (!sparse) e.size = f.file_size(ec);
    if (auto it = s->blobs_.find(*d); it != s->blobs_.end()) {  // both whole and partial: the whole one stays
      if (sparse) {
        std::filesystem::remove(f.path(), ec);  // its record goes below
        continue;
      }
      s->drop(*d);
    }
    s->bytes_ += e.size;
    s->blobs_[*d] = std::move(e);
    found.emplace_back(f.last_write_time(ec), *d);
  }
  for (const auto& r : records) {  // a record whose data is gone
    auto d = parse_digest(r.filename().string().substr(0, 64));
    if (!d || !s->blobs_.count(*d) || !s->blobs_[*d].partial) std::filesystem::remove(r, ec);
  }
  if (ec) return make_error(error_code::io_error, fmt::format("cannot read the blob cache {}: {}", dir.string(), ec.message()));
  // Uses survive restarts as modification times (get() touches the file).
  std::sort(found.begin(), found.end());
  for (const auto& [t, d] : found) s->blobs_[d].last_use = ++s->clock_;
  return s;
}

std::filesystem::path blob_store::path_of(const digest& d) const { return dir_ / to_hex(d); }

expected<blob_store::held> blob_store::view(const std::vector<std::pair<std::string, held>>& files) {
  std::string listing;
  for (const auto& [name, blob] : files) {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos)
      return make_error(error_code::invalid_argument, fmt::format("\"{}\" is not a file name (a view of the blob cache {})", name, dir_.string()));
    listing += name + '\0' + blob.path.string() + '\n';
  }
  const auto key = hash_bytes({reinterpret_cast<const uint8_t*>(listing.data()), listing.size()});
  const auto at = dir_ / "views" / to_hex(key);
  std::error_code ec;
  std::filesystem::remove_all(at, ec);  // a view left by an earlier load: made again, the same
  std::filesystem::create_directories(at, ec);
  if (ec) return make_error(error_code::io_error, fmt::format("cannot make the view {}: {}", at.string(), ec.message()));
  auto pins = std::make_shared<std::vector<pin>>();
  for (const auto& [name, blob] : files) {
    std::filesystem::create_symlink(std::filesystem::absolute(blob.path), at / name, ec);
    if (ec) return make_error(error_code::io_error, fmt::format("cannot link {} in the view {}: {}", name, at.string(), ec.message()));
    pins->push_back(blob.in_use);
  }
  return held{at, pin(pins, pins.get())};
}

bool blob_store::contains(const digest& d) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blobs_.find(d);
  return it != blobs_.end() && !it->second.partial;
}

uint64_t blob_store::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

std::vector<digest> blob_store::by_last_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<uint64_t, digest>> v;
  for (const auto& [d, e] : blobs_) v.emplace_back(e.last_use, d);
  std::sort(v.begin(), v.end());
  std::vector<digest> out;
  for (const auto& [t, d] : v) out.push_back(d);
  return out;
}

blob_store::pin blob_store::pin_of(const digest& d) {
  ++blobs_[d].pins;
  std::weak_ptr<blob_store> self = weak_from_this();
  // The deleter runs wherever the last user lets go (a stage closing on the host's thread).
  return pin(static_cast<void*>(nullptr), [self, d](void*) {
    if (auto s = self.lock()) {
      std::lock_guard<std::mutex> lock(s->mutex_);
      if (auto it = s->blobs_.find(d); it != s->blobs_.end() && it->second.pins > 0) --it->second.pins;
    }
  });
}

void blob_store::drop(const digest& d) {
  auto it = blobs_.find(d);
  if (it == blobs_.end()) return;
  std::error_code ec;
  if (it->second.partial) {
    std::filesystem::remove(sparse_of(d), ec);
    std::filesystem::remove(record_of(d), ec);
  } else {
    std::filesystem::remove(path_of(d), ec);
  }
  bytes_ -= it->second.size;
  blobs_.erase(it);
}

expected<void> blob_store::make_room(uint64_t need) {
  if (need > max_bytes_)
    return make_error(error_code::limit_exceeded, fmt::format("a blob of {} does not fit the blob cache {} bounded at {} (--blob-cache-bytes)",
                                                              human(need), dir_.string(), human(max_bytes_)));
  while (bytes_ + reserved_ + need > max_bytes_) {
    const digest* oldest = nullptr;
    uint64_t when = UINT64_MAX;
    for (const auto& [d, e] : blobs_)
      if (e.pins == 0 && e.last_use < when) {
        oldest = &d;
        when = e.last_use;
      }
    if (!oldest)
      return make_error(error_code::limit_exceeded,
                        fmt::format("the blob cache {} holds {} in use of its bound of {} (--blob-cache-bytes): no room for {} more",
                                    dir_.string(), human(bytes_ + reserved_), human(max_bytes_), human(need)));
    drop(digest(*oldest));
  }
  return {};
}

expected<blob_store::held> blob_store::get(const digest& d) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blobs_.find(d);
    if (it == blobs_.end() || it->second.partial)
      return make_error(error_code::not_found, fmt::format("no blob {} in {}", to_hex(d), dir_.string()));
  }
  // Verified on every read: a disk that flipped a bit must not feed a model wrong weights. The
  // hash runs outside the lock (it reads the whole file).
  const auto path = path_of(d);
  auto got = hash_file(path);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!got || *got != d) {
    if (blobs_.count(d) && blobs_[d].pins == 0) drop(d);
    if (!got) return tl::unexpected(got.error());
    return make_error(error_code::decode_error, fmt::format("blob {} in {} is corrupt (its content hashes to {}): dropped", to_hex(d),
                                                            dir_.string(), to_hex(*got)));
  }
  auto it = blobs_.find(d);
  if (it == blobs_.end()) return make_error(error_code::not_found, fmt::format("no blob {} in {}", to_hex(d), dir_.string()));
  it->second.last_use = ++clock_;
  std::error_code ec;
  std::filesystem::last_write_time(path, std::filesystem::file_time_type::clock::now(), ec);  // the use outlives the process
  return held{path, pin_of(d)};
}

expected<blob_store::held> blob_store::put(std::span<const uint8_t> bytes) {
  const digest d = hash_bytes(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = blobs_.find(d); it != blobs_.end()) {
    if (!it->second.partial) {
      it->second.last_use = ++clock_;
      return held{path_of(d), pin_of(d)};
    }
    if (it->second.pins == 0) drop(d);  // the whole content replaces its part
  }
  if (auto ok = make_room(bytes.size()); !ok) return tl::unexpected(ok.error());
  auto ok = write_file_durably(path_of(d), std::span<const char>(reinterpret_cast<const char*>(bytes.data()), bytes.size()), 0600);
  if (!ok) return tl::unexpected(ok.error());
  blobs_[d] = entry{bytes.size(), ++clock_, 0};
  bytes_ += bytes.size();
  return held{path_of(d), pin_of(d)};
}

expected<std::filesystem::path> blob_store::stage(const digest& d, uint64_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (staged_.count(d)) return make_error(error_code::unavailable, fmt::format("blob {} is being written already", to_hex(d)));
  if (auto ok = make_room(size); !ok) return tl::unexpected(ok.error());
  auto path = path_of(d);
  path += ".part";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return make_error(error_code::io_error, fmt::format("cannot create {}: {}", path.string(), std::strerror(errno)));
  ::close(fd);
  staged_[d] = size;
  reserved_ += size;
  return path;
}

void blob_store::discard(const digest& d) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = staged_.find(d);
  if (it == staged_.end()) return;
  reserved_ -= it->second;
  staged_.erase(it);
  auto path = path_of(d);
  path += ".part";
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

expected<void> blob_store::commit(const digest& d) {
  uint64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = staged_.find(d);
    if (it == staged_.end()) return make_error(error_code::invalid_argument, fmt::format("blob {} was not staged", to_hex(d)));
    size = it->second;
  }
  auto part = path_of(d);
  part += ".part";
  const auto fail = [&](error_code code, std::string what) {
    discard(d);
    return make_error(code, std::move(what));
  };
  std::error_code ec;
  if (std::filesystem::file_size(part, ec) != size || ec)
    return fail(error_code::invalid_argument, fmt::format("{} holds {} bytes, not the {} of blob {}", part.string(),
                                                          std::filesystem::file_size(part, ec), size, to_hex(d)));
  const int fd = ::open(part.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return fail(error_code::io_error, fmt::format("cannot flush {}: {}", part.string(), why));
  }
  ::close(fd);
  if (::rename(part.c_str(), path_of(d).c_str()) != 0)
    return fail(error_code::io_error, fmt::format("cannot rename {} into place: {}", part.string(), std::strerror(errno)));
  if (auto ok = sync_directory(dir_); !ok) return ok;
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= size;
  staged_.erase(d);
  int pins = 0;
  if (auto it = blobs_.find(d); it != blobs_.end()) {  // written twice, or over its part: the same content, its users kept
    bytes_ -= it->second.size;
    pins = it->second.pins;
    if (it->second.partial) {
      std::filesystem::remove(sparse_of(d), ec);  // mappings of it stay valid
      std::filesystem::remove(record_of(d), ec);
    }
  }
  blobs_[d] = entry{size, ++clock_, pins};
  bytes_ += size;
  return {};
}

}  // namespace mesh::blobs
