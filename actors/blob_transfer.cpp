#include "actors/blob_transfer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include <fmt/format.h>

namespace mesh::blobs {

expected<offered> blob_offers::offer(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return make_error(error_code::invalid_argument, fmt::format("{} is a directory: only single-file checkpoints are offered to peers", path));
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return make_error(error_code::io_error, fmt::format("cannot offer {}: {}", path, ec.message()));
  const auto mtime = std::filesystem::last_write_time(path, ec);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = by_path_.find(path); it != by_path_.end() && it->second.size == size && it->second.mtime == mtime)
      return offered{it->second.id, size, it->second.chunk_list_id};
  }
  // Hashed outside the lock: a large file takes seconds, and peers' gets for other files go on.
  auto d = hash_file_chunks(path, chunk_bytes);
  if (!d) return tl::unexpected(d.error());
  auto list = std::make_shared<std::vector<uint8_t>>();
  for (const auto& c : d->chunks) list->insert(list->end(), c.begin(), c.end());
  std::lock_guard<std::mutex> lock(mutex_);
  file f{path, size, mtime, d->whole, std::move(list), hash_chunk_list(d->chunks)};
  by_path_[path] = f;
  by_digest_[d->whole] = f;
  return offered{d->whole, size, f.chunk_list_id};
}

expected<std::vector<msg::blob_file>> blob_offers::offer_checkpoint(const std::filesystem::path& checkpoint,
                                                                    const std::vector<std::filesystem::path>& files) {
  std::error_code ec;
  const bool directory = std::filesystem::is_directory(checkpoint, ec);
  std::vector<msg::blob_file> out;
  for (const auto& f : files) {
    msg::blob_file b;
    if (directory) {
      // A stage node recreates the directory from the names alone: a file elsewhere (a shard
      // the index names in a subdirectory) could not be placed.
      if (!std::filesystem::equivalent(f.parent_path(), checkpoint, ec))
        return make_error(error_code::invalid_argument,
                          fmt::format("{} is not a file of {} itself: a directory's files are offered to peers by name", f.string(),
                                      checkpoint.string()));
      b.name = f.filename().string();
    } else if (!std::filesystem::equivalent(f, checkpoint, ec)) {
      return make_error(error_code::invalid_argument, fmt::format("{} is not the checkpoint {}", f.string(), checkpoint.string()));
    }
    auto o = offer(f.string());
    if (!o) return tl::unexpected(o.error());
    b.id = o->id;
    b.size = o->size;
    b.chunk_list = o->chunk_list;
    out.push_back(std::move(b));
  }
  return out;
}

uint64_t blob_offers::served_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return served_;
}

msg::blob_chunk blob_offers::serve(const msg::blob_get& g) const {
  msg::blob_chunk c;
  c.call = g.call;
  c.offset = g.offset;
  const auto fail = [&](error_code code, std::string what) {
    c.code = code;
    c.error = fmt::format("node {}: {}", self_, what);
    return c;
  };
  file f;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_digest_.find(g.blob);
    if (it == by_digest_.end()) return fail(error_code::not_found, fmt::format("offers no blob {}", to_hex(g.blob)));
    f = it->second;
  }
  if (g.chunk_list) {  // the chunk list, from memory
    const auto& list = *f.chunk_list;
    if (auto ok = check_get(g, list.size()); !ok) return fail(ok.error().code, ok.error().message);
    c.bytes.assign(list.begin() + static_cast<std::ptrdiff_t>(g.offset), list.begin() + static_cast<std::ptrdiff_t>(g.offset + g.length));
    c.digest = hash_bytes(c.bytes);
    c.ok = true;
    return c;
  }
  if (auto ok = check_get(g, f.size); !ok) return fail(ok.error().code, ok.error().message);
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(error_code::io_error, fmt::format("cannot read {}: {}", f.path, std::strerror(errno)));
  c.bytes.resize(g.length);
  size_t got = 0;
  while (got < g.length) {
    const ssize_t n = ::pread(fd, c.bytes.data() + got, g.length - got, static_cast<off_t>(g.offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  // A file cut short since it was offered: the peer would fail on the whole digest anyway.
  if (got != g.length) {
    c.bytes.clear();
    return fail(error_code::io_error, fmt::format("{} changed since it was offered (a read at {} came short)", f.path, g.offset));
  }
  c.digest = hash_bytes(c.bytes);
  c.ok = true;
  std::lock_guard<std::mutex> lock(mutex_);
  served_ += got;
  return c;
}

uint64_t blob_fetcher::fetched_bytes() const {
  std::lock_guard<std::mutex> lock(m_);
  return fetched_;
}

void blob_fetcher::deliver(const node_id& from, msg::blob_chunk c) {
  {
    std::lock_guard<std::mutex> lock(m_);
    auto it = pending_.find(c.call);
    if (it == pending_.end() || it->second.to != from) return;  // late, or not from the node asked
    it->second.reply = std::move(c);
  }
  answered_.notify_all();
}

void blob_fetcher::peer_gone(const node_id& peer) {
  {
    std::lock_guard<std::mutex> lock(m_);
    for (auto& [call, p] : pending_)
      if (p.to == peer) p.gone = true;
  }
  answered_.notify_all();
}

void blob_fetcher::close() {
  {
    std::lock_guard<std::mutex> lock(m_);
    closed_ = true;
  }
  answered_.notify_all();
}

void blob_fetcher::forget(uint64_t call) {
  std::lock_guard<std::mutex> lock(m_);
  pending_.erase(call);
}

expected<msg::blob_chunk> blob_fetcher::await(uint64_t call) {
  std::unique_lock<std::mutex> lock(m_);
  auto& p = pending_.at(call);
  const node_id to = p.to;
  const bool done = answered_.wait_for(lock, chunk_timeout_, [&] { return closed_ || p.gone || p.reply.has_value(); });
  auto reply = std::move(p.reply);
  const bool gone = p.gone, closed = closed_;
  pending_.erase(call);
  if (reply) return std::move(*reply);
  if (closed) return make_error(error_code::unavailable, "the node is stopping");
  if (gone) return make_error(error_code::unavailable, fmt::format("node {} left", to.short_string()));
  (void)done;
  return make_error(error_code::timeout, fmt::format("node {} sent no chunk within {} ms", to.short_string(), chunk_timeout_.count()));
}

expected<void> blob_fetcher::request(const node_id& from, const std::vector<msg::blob_get>& gets,
                                     const std::function<expected<void>(const msg::blob_chunk&)>& take) {
  std::deque<uint64_t> calls;  // in the order sent: the peer answers in that order
  size_t next = 0;
  const auto send_more = [&]() -> expected<void> {
    while (next < gets.size() && calls.size() < window) {
      msg::blob_get g = gets[next];
      {
        std::lock_guard<std::mutex> lock(m_);
        if (closed_) return make_error(error_code::unavailable, "the node is stopping");
        g.call = next_call_++;
        pending_[g.call] = pending{from, std::nullopt, false};
      }
      if (!send_(from, g)) {
        forget(g.call);
        return make_error(error_code::unavailable, fmt::format("node {} is not connected", from.short_string()));
      }
      calls.push_back(g.call);
      ++next;
    }
    return {};
  };
  expected<void> outcome;
  while (outcome) {
    outcome = send_more();
    if (!outcome || calls.empty()) break;
    auto c = await(calls.front());
    calls.pop_front();
    if (!c) outcome = tl::unexpected(c.error());
    else if (!c->ok) outcome = make_error(c->code, c->error);
    else if (auto ok = check_chunk(*c); !ok) outcome = ok;
    else outcome = take(*c);
  }
  for (uint64_t call : calls) forget(call);  // answers still coming are ignored
  return outcome;
}

expected<uint64_t> blob_fetcher::fetch(const node_id& from, const offered& want, blob_store& store) {
  const std::string what = fmt::format("blob {} ({} bytes) from node {}", to_hex(want.id), want.size, from.short_string());
  const auto fail = [&](const error& e) { return make_error(e.code, fmt::format("fetching {}: {}", what, e.message)); };
  auto part = store.stage(want.id, want.size);
  if (!part) return fail(part.error());
  const int fd = ::open(part->c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    store.discard(want.id);
    return fail({error_code::io_error, fmt::format("cannot open {}: {}", part->string(), std::strerror(errno))});
  }
  std::vector<msg::blob_get> gets;
  for (const auto& c : plan_chunks(want.size)) {
    msg::blob_get g;
    g.blob = want.id;
    g.offset = c.offset;
    g.length = static_cast<uint32_t>(c.length);
    gets.push_back(g);
  }
  assembly whole(want.id, want.size);
  auto outcome = request(from, gets, [&](const msg::blob_chunk& c) -> expected<void> {
    if (auto ok = whole.accept(c.offset, c.bytes, c.digest); !ok) return ok;
    size_t put = 0;
    while (put < c.bytes.size()) {
      const ssize_t n = ::pwrite(fd, c.bytes.data() + put, c.bytes.size() - put, static_cast<off_t>(c.offset + put));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return make_error(error_code::io_error, fmt::format("cannot write {}: {}", part->string(), std::strerror(errno)));
      put += static_cast<size_t>(n);
    }
    std::lock_guard<std::mutex> lock(m_);
    fetched_ += c.bytes.size();
    return {};
  });
  ::close(fd);
  if (outcome) outcome = whole.finish();
  if (outcome) outcome = store.commit(want.id);
  else store.discard(want.id);
  if (!outcome) return fail(outcome.error());
  return want.size;
}

expected<std::vector<digest>> blob_fetcher::fetch_chunk_list(const node_id& from, const offered& want) {
  const auto fail = [&](const error& e) {
    return make_error(e.code, fmt::format("fetching the chunk list of blob {} from node {}: {}", to_hex(want.id), from.short_string(), e.message));
  };
  const uint64_t count = (want.size + chunk_bytes - 1) / chunk_bytes;
  const uint64_t bytes = count * sizeof(digest);
  std::vector<msg::blob_get> gets;
  for (const auto& c : plan_chunks(bytes)) {
    msg::blob_get g;
    g.blob = want.id;
    g.offset = c.offset;
    g.length = static_cast<uint32_t>(c.length);
    g.chunk_list = true;
    gets.push_back(g);
  }
  std::vector<uint8_t> list;
  auto outcome = request(from, gets, [&](const msg::blob_chunk& c) -> expected<void> {
    if (c.offset != list.size() || c.bytes.size() > bytes - list.size() || hash_bytes(c.bytes) != c.digest)
      return make_error(error_code::decode_error, fmt::format("a piece at offset {} of {} bytes does not follow the {} received", c.offset,
                                                              c.bytes.size(), list.size()));
    list.insert(list.end(), c.bytes.begin(), c.bytes.end());
    return {};
  });
  if (!outcome) return fail(outcome.error());
  if (list.size() != bytes) return fail({error_code::decode_error, fmt::format("{} of {} bytes came", list.size(), bytes)});
  std::vector<digest> out(count);
  for (uint64_t i = 0; i < count; ++i) std::memcpy(out[i].data(), list.data() + i * sizeof(digest), sizeof(digest));
  if (const auto got = hash_chunk_list(out); got != want.chunk_list)
    return fail({error_code::decode_error, fmt::format("it hashes to {}, not the {} the stage was opened with", to_hex(got), to_hex(want.chunk_list))});
  std::lock_guard<std::mutex> lock(m_);
  fetched_ += bytes;
  return out;
}

expected<uint64_t> blob_fetcher::fetch_chunks(const node_id& from, const offered& want, const std::vector<uint64_t>& chunks,
                                              blob_store& store) {
  const auto fail = [&](const error& e) {
    return make_error(e.code, fmt::format("fetching {} chunks of blob {} from node {}: {}", chunks.size(), to_hex(want.id),
                                          from.short_string(), e.message));
  };
  std::vector<msg::blob_get> gets;
  uint64_t total = 0;
  for (const uint64_t i : chunks) {
    msg::blob_get g;
    g.blob = want.id;
    g.offset = i * chunk_bytes;
    if (g.offset >= want.size) return fail({error_code::invalid_argument, fmt::format("chunk {} is past the end", i)});
    g.length = static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes, want.size - g.offset));
    total += g.length;
    gets.push_back(g);
  }
  if (auto ok = store.reserve(total); !ok) return fail(ok.error());
  uint64_t got = 0;
  auto outcome = request(from, gets, [&](const msg::blob_chunk& c) -> expected<void> {
    if (c.offset % chunk_bytes != 0) return make_error(error_code::decode_error, fmt::format("a chunk at offset {}", c.offset));
    if (auto ok = store.put_chunk(want.id, c.offset / chunk_bytes, c.bytes); !ok) return ok;
    store.unreserve(c.bytes.size());
    got += c.bytes.size();
    std::lock_guard<std::mutex> lock(m_);
    fetched_ += c.bytes.size();
    return {};
  });
  store.unreserve(total - got);
  if (auto ok = store.sync_partial(want.id); outcome && !ok) outcome = ok;
  if (!outcome) return fail(outcome.error());
  return got;
}

namespace {

/// remote_file's state: the verified chunks and the sparse file they are in.
struct remote_reader {
  std::shared_ptr<blob_fetcher> fetcher;
  std::shared_ptr<blob_store> store;
  node_id from;
  offered want;
  uint64_t read_ahead = 0;
  bool opened = false;
  std::vector<bool> verified;
  blob_store::pin pin;  ///< keeps the blob from eviction while it is read
  int fd = -1;
  ~remote_reader() {
    if (fd >= 0) ::close(fd);
  }

  expected<void> open() {
    if (opened) return {};
    auto list = store->chunk_list_of(want.id);
    if (!list.empty() && hash_chunk_list(list) != want.chunk_list) {
      return make_error(error_code::invalid_argument,
                        fmt::format("blob {} is here in part with another chunk list than node {} offers", to_hex(want.id),
                                    from.short_string()));
    }
    if (list.empty()) {
      auto fetched = fetcher->fetch_chunk_list(from, want);
      if (!fetched) return tl::unexpected(fetched.error());
      if (auto ok = store->open_partial(want.id, want.size, std::move(*fetched)); !ok) return ok;
    }
    auto pinned = store->get_chunks(want.id, {});
    if (!pinned) return tl::unexpected(pinned.error());
    pin = pinned->in_use;
    fd = ::open(pinned->path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return make_error(error_code::io_error, fmt::format("cannot open {}: {}", pinned->path.string(), std::strerror(errno)));
    verified.assign((want.size + chunk_bytes - 1) / chunk_bytes, false);
    opened = true;
    return {};
  }

  expected<size_t> read(uint64_t offset, std::span<char> into) {
    if (offset >= want.size || into.empty()) return size_t{0};
    if (auto ok = open(); !ok) return tl::unexpected(ok.error());
    const size_t n = static_cast<size_t>(std::min<uint64_t>(into.size(), want.size - offset));
    const uint64_t first = offset / chunk_bytes, last = (offset + n - 1) / chunk_bytes;
    std::vector<uint64_t> wanted;
    for (uint64_t c = first; c <= last; ++c)
      if (!verified[c]) wanted.push_back(c);
    if (!wanted.empty()) {
      auto missing = store->missing(want.id, wanted);
      if (!missing.empty()) {
        std::vector<uint64_t> ahead;
        for (uint64_t c = last + 1; c < verified.size() && c <= last + read_ahead; ++c) ahead.push_back(c);
        for (uint64_t c : store->missing(want.id, ahead)) missing.push_back(c);
        auto got = fetcher->fetch_chunks(from, want, missing, *store);
        if (!got) return tl::unexpected(got.error());
      }
      auto held = store->get_chunks(want.id, wanted);  // hashes them again: what is read is what was offered
      if (!held) return tl::unexpected(held.error());
      for (uint64_t c : wanted) verified[c] = true;
    }
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd, into.data() + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return make_error(error_code::io_error, fmt::format("reading blob {}: {}", to_hex(want.id), r < 0 ? std::strerror(errno) : "short file"));
      done += static_cast<size_t>(r);
    }
    return n;
  }
};

}  // namespace

std::function<expected<size_t>(uint64_t offset, std::span<char> into)> remote_file(std::shared_ptr<blob_fetcher> fetcher,
                                                                                    std::shared_ptr<blob_store> store, node_id from,
                                                                                    offered want, uint64_t read_ahead) {
  auto r = std::make_shared<remote_reader>();
  r->fetcher = std::move(fetcher);
  r->store = std::move(store);
  r->from = from;
  r->want = want;
  r->read_ahead = read_ahead;
  return [r](uint64_t offset, std::span<char> into) { return r->read(offset, into); };
}

}  // namespace mesh::blobs
