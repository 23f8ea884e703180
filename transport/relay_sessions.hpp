#pragma once
/// End-to-end sessions between two nodes that talk through a relay, without I/O.
///
/// The boxes are sealed with the two nodes' keys (traversal.hpp), so the relay can neither read
/// nor forge them; this adds what sealing alone does not give:
/// - membership, end to end: the opener's hello and the answer each carry a tag keyed by the
///   mesh secret over both node ids and the session's nonces, so a relayed peer proves it holds
///   the secret to the node it reaches, not only to the relay (which might admit anyone);
/// - freshness: a session's id is made of a nonce from each side, and every message carries it
///   with a sequence number that must grow, so a box recorded from this or an earlier session
///   and replayed by the relay is refused. The hello of the open session, replayed, gets the
///   same answer again and changes nothing; a hello of an earlier session gets a new answer
///   with a new nonce: it opens a session nobody can send in (a relay can always cut a session
///   off; it cannot make one accept a box twice).
///
///   A                        relay                      B
///   hello{nA, tag(A,B,nA)}  ------------------------->   checks the tag; session nA|nB
///   <-------------------------  hello_ack{nA, nB, tag(B,A,nA,nB)}
///   checks the tag; session nA|nB
///   message{id, seq 1, 2, ...} both ways; the receiver keeps the last seq
#include <array>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "base/error.hpp"
#include "base/node_id.hpp"
#include "transport/traversal.hpp"

namespace mesh::transport {

class relay_sessions {
 public:
  /// `mesh_secret` empty: the open mesh, whose tags anyone can make.
  relay_sessions(node_id self, std::vector<uint8_t> mesh_secret) : self_(self), secret_(std::move(mesh_secret)) {}

  /// The hello that opens (or reopens) a session with `peer`.
  relay_plain hello(const node_id& peer);
  /// A hello from `peer`: its tag checked, a new session made (replacing any earlier one);
  /// returns the answer to send back.
  expected<relay_plain> on_hello(const node_id& peer, const relay_plain& hello);
  /// The answer to our hello: checked against the nonce we sent; the session is open.
  expected<void> on_ack(const node_id& peer, const relay_plain& ack);
  /// A message for `peer` in the open session (false: none is open).
  std::optional<relay_plain> seal(const node_id& peer, uint8_t channel, std::vector<uint8_t> payload);
  /// A message from `peer`: of the open session, with a sequence number past the last one.
  expected<void> accept(const node_id& peer, const relay_plain& message);
  /// Forgets the session with `peer` (it went down).
  void forget(const node_id& peer) { sessions_.erase(peer); }
  bool open(const node_id& peer) const;

 private:
  struct session {
    std::optional<relay_nonce> sent_hello;  ///< our nonce, until the answer comes
    std::optional<relay_nonce> id;          ///< the open session's id
    relay_nonce opener{}, answer{};         ///< the nonces of a session we answered (a replayed hello gets the same answer)
    bool answered = false;
    uint64_t sent = 0, received = 0;        ///< the last sequence numbers each way
  };
  std::array<uint8_t, 32> tag(const char* label, const node_id& from, const node_id& to, std::span<const uint8_t> nonces) const;

  node_id self_;
  std::vector<uint8_t> secret_;
  std::map<node_id, session> sessions_;
};

}  // namespace mesh::transport
