#include "actors/stage_host.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "actors/blob_chunks.hpp"
#include "models/checkpoint.hpp"
#include "models/pipeline.hpp"
#include "models/session.hpp"

namespace mesh::generation {

/// One stage: members go in reverse order, the session before the file it reads and the
/// executor it runs on.
struct stage_host::held {
  blobs::blob_store::pin blob;  ///< the cached file the checkpoint maps, if it is one
  std::unique_ptr<gpu::executor> ex;
  std::unique_ptr<models::checkpoint> ckpt;
  std::optional<models::local_stage> stage;
};

stage_host::stage_host(stage_host_options options, sender send) : options_(std::move(options)), send_(std::move(send)) {
  thread_ = std::thread([this] { run(); });
}

stage_host::~stage_host() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  stages_.clear();  // the thread is gone: only for form
}

void stage_host::post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    work_.push_back(std::move(work));
  }
  wake_.notify_one();
}

void stage_host::run() {
  for (;;) {
    std::function<void()> w;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !work_.empty(); });
      if (stopping_) return;
      w = std::move(work_.front());
      work_.pop_front();
    }
    w();
  }
}

msg::stage_reply stage_host::failed(uint64_t call, const error& e) const {
  msg::stage_reply r;
  r.call = call;
  r.code = e.code;
  r.error = e.message;
  return r;
}

void stage_host::open(const node_id& from, msg::stage_open m) {
  post([this, from, m = std::move(m)] { send_(from, do_open(from, m)); });
}

void stage_host::step(const node_id& from, msg::stage_step m) {
  post([this, from, m = std::move(m)] { send_(from, do_step(from, m)); });
}

void stage_host::close(const node_id& from, const msg::stage_close& m) {
  post([this, k = key{from, m.stage}] {
    std::unique_ptr<held> gone;
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = stages_.find(k); it != stages_.end()) {
      gone = std::move(it->second);
      stages_.erase(it);
    }
  });
}

void stage_host::owner_gone(const node_id& owner) {
  post([this, owner] {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(stages_, [&](const auto& s) { return s.first.first == owner; });
  });
}

size_t stage_host::stages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stages_.size();
}

msg::stage_reply stage_host::do_open(const node_id& from, const msg::stage_open& m) {
  const auto fail = [&](error_code code, const std::string& what) {
    return failed(m.call, {code, fmt::format("node {}: {}", options_.self, what)});
  };
  auto range = check_open(m, options_.limits);
  if (!range) return fail(range.error().code, range.error().message);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stages_.count({from, m.stage})) return fail(error_code::invalid_argument, fmt::format("stage {} of {} is already open", m.stage, from.short_string()));
    if (stages_.size() >= options_.max_stages)
      return fail(error_code::limit_exceeded, fmt::format("it holds {} stages for peers, its limit", stages_.size()));
  }
  // A node reads its own copy of the file; without one, the cached or fetched blob the opener
  // offered; without an offer, it says which path it lacks.
  const std::string what = fmt::format("layers {} of {}", models::to_string(*range), m.path);
  auto h = std::make_unique<held>();
  auto file = checkpoint_file(from, m);
  if (!file) return fail(file.error().code, fmt::format("cannot load {}: {}", what, file.error().message));
  h->blob = std::move(file->in_use);
  auto ckpt = models::checkpoint::open(file->path);
  if (!ckpt) return fail(ckpt.error().code, fmt::format("cannot load {}: {}", what, ckpt.error().message));
  h->ckpt = std::make_unique<models::checkpoint>(std::move(*ckpt));
  auto ex = options_.make_executor();
  if (!ex) return fail(ex.error().code, fmt::format("cannot load {}: {}", what, ex.error().message));
  h->ex = std::move(*ex);
  models::session_options so;
  so.context = m.context;
  so.layers = *range;
  so.slots = m.slots;
  so.prepare_decode = true;
  auto s = models::session::create(*h->ex, *h->ckpt, so);
  if (!s) return fail(s.error().code, fmt::format("cannot load {}: {}", what, s.error().message));
  h->stage.emplace(std::move(*s));
  std::lock_guard<std::mutex> lock(mutex_);
  // Checked again: the limit holds even if opens raced (they do not: one thread), and an owner
  // that left meanwhile has its own close queued after this.
  if (stages_.size() >= options_.max_stages)
    return fail(error_code::limit_exceeded, fmt::format("it holds {} stages for peers, its limit", stages_.size()));
  stages_.emplace(key{from, m.stage}, std::move(h));
  msg::stage_reply r;
  r.call = m.call;
  r.ok = true;
  return r;
}

expected<blobs::blob_store::held> stage_host::checkpoint_file(const node_id& from, const msg::stage_open& m) {
  std::error_code ec;
  if (std::filesystem::exists(m.path, ec) || m.files.empty() || !options_.blobs || !options_.fetcher)
    return blobs::blob_store::held{m.path, nullptr};
  const auto say = [&](const std::string& line) {
    if (options_.log) options_.log(line);
  };
  std::vector<std::pair<std::string, blobs::blob_store::held>> got;
  for (const auto& f : m.files) {
    const auto name = blobs::to_hex(f.id);
    const std::string what = f.name.empty() ? m.path : m.path + "/" + f.name;
    auto cached = options_.blobs->get(f.id);
    if (cached) {
      say(fmt::format("{}: blob {} from the cache (no transfer)", what, name));
      got.emplace_back(f.name, std::move(*cached));
      continue;
    }
    if (cached.error().code != error_code::not_found) say(cached.error().message);  // corrupt: dropped, fetched again
    if (!f.ranges.empty() && !blobs::is_zero(f.chunk_list)) {  // only the chunks this stage reads
      auto part = partial_file(from, f, what);
      if (!part) return tl::unexpected(part.error());
      got.emplace_back(f.name, std::move(*part));
      continue;
    }
    say(fmt::format("{}: no copy here; fetching blob {} ({} bytes) from {}", what, name, f.size, from.short_string()));
    auto fetched = options_.fetcher->fetch(from, {f.id, f.size}, *options_.blobs);
    if (!fetched) return tl::unexpected(fetched.error());
    say(fmt::format("{}: fetched blob {} ({} bytes) from {}", what, name, *fetched, from.short_string()));
    auto held = options_.blobs->get(f.id);
    if (!held) return tl::unexpected(held.error());
    got.emplace_back(f.name, std::move(*held));
  }
  if (got.size() == 1 && got.front().first.empty()) return std::move(got.front().second);
  // A directory checkpoint: its files under their names, linked to the blobs.
  return options_.blobs->view(got);
}

expected<blobs::blob_store::held> stage_host::partial_file(const node_id& from, const msg::blob_file& f, const std::string& what) {
  auto& store = *options_.blobs;
  const blobs::offered want{f.id, f.size, f.chunk_list};
  const auto name = blobs::to_hex(f.id);
  const auto say = [&](const std::string& line) {
    if (options_.log) options_.log(line);
  };
  // The chunk list: kept with the partial blob, else fetched (and checked against the open's).
  auto list = store.chunk_list_of(f.id);
  if (!list.empty() && blobs::hash_chunk_list(list) != f.chunk_list)
    return make_error(error_code::invalid_argument, fmt::format("blob {} is here in part with another chunk list than the one offered", name));
  if (list.empty()) {
    auto fetched = options_.fetcher->fetch_chunk_list(from, want);
    if (!fetched) return tl::unexpected(fetched.error());
    if (auto ok = store.open_partial(f.id, f.size, std::move(*fetched)); !ok) return tl::unexpected(ok.error());
  }
  std::vector<uint64_t> needed;
  for (const auto& r : f.ranges)
    for (uint64_t c = r.offset / blobs::chunk_bytes; c * blobs::chunk_bytes < r.offset + r.length; ++c)
      if (needed.empty() || needed.back() < c) needed.push_back(c);
  std::sort(needed.begin(), needed.end());
  needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
  // Pinned while its chunks come: making room for them must not evict it.
  auto pinned = store.get_chunks(f.id, {});
  if (!pinned) return tl::unexpected(pinned.error());
  const auto missing = store.missing(f.id, needed);
  const uint64_t chunks = (f.size + blobs::chunk_bytes - 1) / blobs::chunk_bytes;
  if (missing.empty()) {
    say(fmt::format("{}: blob {} from the cache (no transfer): the {} of its {} chunks this stage reads", what, name, needed.size(), chunks));
  } else {
    say(fmt::format("{}: no copy here; fetching {} of blob {}'s {} chunks ({} bytes in all) from {}", what, missing.size(), name, chunks,
                    f.size, from.short_string()));
    auto got = options_.fetcher->fetch_chunks(from, want, missing, store);
    if (!got) return tl::unexpected(got.error());
    say(fmt::format("{}: fetched blob {} in part: {} chunks, {} bytes from {}", what, name, missing.size(), *got, from.short_string()));
  }
  return store.get_chunks(f.id, needed);
}

msg::stage_reply stage_host::do_step(const node_id& from, const msg::stage_step& m) {
  held* h = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Keyed by owner: a stage another node opened is not found, so only its owner steps it.
    if (auto it = stages_.find({from, m.stage}); it != stages_.end()) h = it->second.get();
  }
  if (!h)
    return failed(m.call, {error_code::not_found, fmt::format("node {} holds no stage {} of node {}", options_.self, m.stage,
                                                              from.short_string())});
  const auto& sess = h->stage->stage();
  auto in = check_step(m, sess.takes_tokens(), sess.config().hidden_size, sess.context(), sess.slots(), options_.limits);
  if (!in) return failed(m.call, {in.error().code, fmt::format("node {}: {}", options_.self, in.error().message)});
  auto out = in->rows.empty() ? h->stage->forward(m.slot, m.start, in->tokens, in->hidden)
                              : h->stage->forward(in->rows, in->tokens, in->hidden);
  if (!out) return failed(m.call, {out.error().code, fmt::format("node {}: {}", options_.self, out.error().message)});
  msg::stage_reply r;
  r.call = m.call;
  r.ok = true;
  const auto n = static_cast<int64_t>(out->size());
  const int64_t hidden = sess.config().hidden_size;
  const int64_t width = sess.returns_logits() ? sess.config().vocab_size : hidden;
  r.output = sess.returns_logits() && in->rows.empty() ? tensor::from_floats({n}, *out)
                                                       : tensor::from_floats({n / width, width}, *out);
  return r;
}

}  // namespace mesh::generation
