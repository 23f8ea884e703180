#pragma once
/// Checkpoint files streamed between nodes for split models (docs/serving.md, "Split over the
/// mesh"): the serving node offers its file by digest (blob_offers) and answers blob_get; a
/// stage node without its own copy fetches the file chunk by chunk into its blob cache
/// (blob_fetcher). No CAF: the generator actor hands messages in; a fetch blocks the stage
/// host's thread, never an actor's.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/blob_chunks.hpp"
#include "actors/blob_store.hpp"
#include "base/node_id.hpp"
#include "wire/messages.hpp"

namespace mesh::blobs {

/// A file offered to peers: its digest and size, and the digest of its chunk list.
struct offered {
  digest id{};
  uint64_t size = 0;
  digest chunk_list{};
};

/// The serving node's files that its peers may fetch. Only offered files are served, by digest:
/// a peer cannot name a path.
class blob_offers {
 public:
  /// `self`: this node's name in error messages.
  explicit blob_offers(std::string self) : self_(std::move(self)) {}
  /// Offers the file at `path`: its digest and its chunks' (hashed once per path, size and
  /// modification time).
  /// Errors: io_error naming the file; invalid_argument for a directory (not offered).
  expected<offered> offer(const std::string& path);
  /// Offers the files of a checkpoint (models::checkpoint::files()), in that order: a single file
  /// under an empty name, a directory's files under their names (no ranges: the caller adds a
  /// stage's). Errors: offer()'s, and invalid_argument for a file outside the directory.
  expected<std::vector<msg::blob_file>> offer_checkpoint(const std::filesystem::path& checkpoint,
                                                         const std::vector<std::filesystem::path>& files);
  /// The answer to a peer's blob_get: the bytes (of the file, or of its chunk list) and their
  /// digest, or an error naming the blob. Reads the file (at most max_chunk_bytes) on the
  /// caller's thread.
  msg::blob_chunk serve(const msg::blob_get& g) const;
  /// Bytes served so far.
  uint64_t served_bytes() const;

 private:
  struct file {
    std::string path;
    uint64_t size = 0;
    std::filesystem::file_time_type mtime;
    digest id{};
    std::shared_ptr<const std::vector<uint8_t>> chunk_list;  ///< its chunks' digests, concatenated
    digest chunk_list_id{};
  };
  std::string self_;
  mutable std::mutex mutex_;
  std::map<std::string, file> by_path_;
  std::map<digest, file> by_digest_;
  mutable uint64_t served_ = 0;
};

/// A stage node's fetches from the serving node.
class blob_fetcher {
 public:
  /// Sends to a peer; false when it is not connected.
  using sender = std::function<bool(const node_id& to, const msg::message& m)>;
  /// Chunks asked for ahead of the one awaited: keeps the link busy while each round trip is
  /// small; the serving node answers them one by one, between its other messages.
  static constexpr size_t window = 4;

  explicit blob_fetcher(sender send, std::chrono::milliseconds chunk_timeout = std::chrono::seconds(60))
      : send_(std::move(send)), chunk_timeout_(chunk_timeout) {}

  /// Fetches blob `want` from `from` into `store` (staged, every chunk checked, the whole checked
  /// against `want`, then committed). Returns the bytes transferred. Errors name the node and the
  /// blob: not connected, left, a chunk not answered in time, the peer's own error, a bad chunk.
  expected<uint64_t> fetch(const node_id& from, const offered& want, blob_store& store);
  /// The chunk list of blob `want` (the digests of its chunks of chunk_bytes), checked against
  /// want.chunk_list. Errors as fetch()'s.
  expected<std::vector<digest>> fetch_chunk_list(const node_id& from, const offered& want);
  /// Fetches chunks `chunks` of blob `want` into its partial blob in `store` (opened with
  /// open_partial; each chunk checked against its list there), then syncs it. Returns the bytes
  /// transferred. Errors as fetch()'s.
  expected<uint64_t> fetch_chunks(const node_id& from, const offered& want, const std::vector<uint64_t>& chunks, blob_store& store);
  /// A blob_chunk from a peer: wakes the fetch it answers (others are ignored).
  void deliver(const node_id& from, msg::blob_chunk c);
  /// The peer left: its fetches fail now.
  void peer_gone(const node_id& peer);
  /// No more fetches: waiting ones fail, later ones fail at once.
  void close();
  /// Bytes fetched over this node's life (a cache hit adds nothing).
  uint64_t fetched_bytes() const;

 private:
  struct pending {
    node_id to;
    std::optional<msg::blob_chunk> reply;
    bool gone = false;
  };
  /// Sends `gets` (their calls filled in), at most `window` unanswered, and hands each answer
  /// that is ok and well formed, in order, to `take`; stops at the first error.
  expected<void> request(const node_id& from, const std::vector<msg::blob_get>& gets,
                         const std::function<expected<void>(const msg::blob_chunk&)>& take);
  expected<msg::blob_chunk> await(uint64_t call);
  void forget(uint64_t call);

  sender send_;
  std::chrono::milliseconds chunk_timeout_;
  mutable std::mutex m_;
  std::condition_variable answered_;
  std::map<uint64_t, pending> pending_;
  uint64_t next_call_ = 1, fetched_ = 0;
  bool closed_ = false;
};

/// Random access to a file a peer offers, for a reader that wants a few ranges of it (a training
/// worker's shards of a data file): each read fetches the chunks it touches that the partial
/// blob in `store` lacks (and up to `read_ahead` missing chunks after them, so a sequential
/// reader keeps the link busy), checks them against the chunk list, and reads the bytes from the
/// blob's sparse file. Reads block the calling thread. The result has models::byte_source's
/// signature: at most `into.size()` bytes at `offset`, fewer only at the end. Errors name the
/// node and the blob (fetch_chunks's, get_chunks's), or io_error reading the sparse file.
std::function<expected<size_t>(uint64_t offset, std::span<char> into)> remote_file(
    std::shared_ptr<blob_fetcher> fetcher, std::shared_ptr<blob_store> store, node_id from, offered want,
    uint64_t read_ahead = 8);

}  // namespace mesh::blobs
