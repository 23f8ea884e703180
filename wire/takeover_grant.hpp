#pragma once
/// A client's permission for one node to take its training run over (docs/training.md, "The
/// coordinator dying"; docs/security.md).
///
/// A takeover ends the run everywhere else: workers drop what they kept of it, and a
/// coordinator that was only cut off from its client stops its own run. A node id alone cannot
/// say who may do that, since any member can name any client in a message. So the client signs
/// each takeover with its identity key (its node id is the public key): "node N coordinates my
/// run R from generation G on". The new coordinator gets the grant in train_resume and forwards
/// it in every train_setup it sends; each receiver checks it against the run's client and the
/// sender before it ends anything. A setup without a grant (generation 0, the run as the client
/// opened it) may start a run, never end or supersede another.
///
/// The generation orders takeovers: the client counts the grants it made for a run, so a later
/// grant always has a higher generation than every earlier one, and a node holding the run at a
/// higher generation refuses setups of a lower one. Client ids are throw-away keys and a client
/// numbers its runs once each, so a grant cannot be replayed onto another run.
#include <array>
#include <cstdint>
#include <vector>

#include "base/error.hpp"
#include "base/node_id.hpp"
#include "base/signature.hpp"

namespace mesh::msg {

struct takeover_grant {
  /// 0: no grant (the run as its client opened it; `coordinator` and `signature` unset).
  uint32_t generation = 0;
  node_id coordinator;   ///< the node the client asked to take the run over
  signature sig{};       ///< the client's, over takeover_statement()
  bool operator==(const takeover_grant&) const = default;
};

template <class F>
void fields(F& f, takeover_grant& x) {
  f(x.generation, x.coordinator, x.sig);
}

/// The bytes a grant signs: a fixed context string (so no other signed statement can pass for a
/// grant), the client's run id, the generation and the new coordinator's id.
std::vector<uint8_t> takeover_statement(uint64_t client_train, uint32_t generation, const node_id& coordinator);

/// The client's grant for `coordinator` to coordinate its run `client_train` from `generation`
/// (> 0) on, signed with the client's 64-byte Ed25519 secret key.
takeover_grant sign_takeover(const std::array<uint8_t, 64>& client_secret_key, uint64_t client_train, uint32_t generation,
                             const node_id& coordinator);

/// Checks that `g` is `client`'s grant for node `coordinator` to take run `client_train` over.
/// Errors (invalid_argument) say what is wrong: no grant, a grant for another node, a signature
/// that is not the client's.
expected<void> check_takeover(const takeover_grant& g, const node_id& client, uint64_t client_train, const node_id& coordinator);

}  // namespace mesh::msg
