#pragma once
/// A message an engine refused because its sender had no right to send it: a training setup whose
/// takeover grant is not the client's, an activation or all-reduce piece from a node that does
/// not produce it, a step's answer from a node outside its ring. The pure engines only collect
/// them (take_refused()); the node's shell logs each one and counts it against the peer
/// (refusal_log.hpp, shown by `meshctl peers`), and the node goes on.
#include <string>

#include "base/node_id.hpp"

namespace mesh {

struct refused_message {
  node_id from;
  std::string kind;  ///< the message kind (msg::kind_name)
  std::string why;   ///< a sentence naming the run, job or stage and what was wrong
};

}  // namespace mesh
