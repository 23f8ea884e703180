#include "wire/messages.hpp"

#include <limits>
#include <new>

namespace mesh::msg {
namespace {

const char* const kind_names[] = {"hello", "heartbeat", "submit_job", "job_result", "run_stage",
                                  "activation", "stage_done", "status_request", "status_reply",
                                  "open_session", "infer", "close_session", "peer_exchange", "open_training",
                                  "train_setup", "train_step", "allreduce_piece", "train_reduced", "train_state",
                                  "train_progress", "job_progress", "train_resume", "train_checkpoint",
                                  "cancel_stages", "stage_accepted", "route_open", "train_ready", "ring_go", "generate_request",
                                  "generate_piece", "generate_done", "generate_cancel", "models_request", "models_reply", "stage_open", "stage_step",
                                  "stage_close", "stage_reply", "blob_get", "blob_chunk", "shared_region_offer",
                                  "shared_region_answer", "allreduce_piece_shared", "host_reduce_mark"};

expected<void> check_tensors(const std::vector<named_tensor>& ts) {
  for (const auto& t : ts)
    if (auto ok = t.value.check(); !ok) return make_error(ok.error().code, "tensor \"" + t.name + "\": " + ok.error().message);
  return {};
}

expected<void> check_spec(const train_spec& s) {
  if (auto ok = check_tensors(s.state); !ok) return ok;
  return check_tensors(s.dataset);
}

/// Semantic checks beyond parsing: every tensor's bytes match its dtype and shape.
expected<void> check(const message& m) {
  if (auto* r = std::get_if<job_result>(&m)) return check_tensors(r->outputs);
  if (auto* s = std::get_if<stage_done>(&m)) return check_tensors(s->outputs);
  if (auto* a = std::get_if<activation>(&m)) return check_tensors({a->value});
  if (auto* r = std::get_if<run_stage>(&m)) return check_tensors(r->inputs);
  if (auto* i = std::get_if<infer>(&m)) return check_tensors(i->inputs);
  if (auto* o = std::get_if<open_training>(&m)) return check_spec(o->spec);
  if (auto* t = std::get_if<train_setup>(&m)) return check_spec(t->spec);
  if (auto* t = std::get_if<train_state>(&m)) return check_tensors(t->state);
  if (auto* t = std::get_if<train_step>(&m))
    for (const auto& shard : t->shards)
      if (auto ok = check_tensors(shard.columns); !ok) return ok;
  if (auto* r = std::get_if<train_resume>(&m)) return check_tensors(r->dataset);
  if (auto* c = std::get_if<train_checkpoint>(&m)) return check_tensors(c->state);
  if (auto* s = std::get_if<stage_step>(&m)) return s->input.check();
  if (auto* r = std::get_if<stage_reply>(&m)) return r->output.check();
  if (auto* o = std::get_if<shared_region_offer>(&m); o && o->nonce.size() != 16)
    return make_error(error_code::decode_error, "shared_region_offer: a nonce of " + std::to_string(o->nonce.size()) + " bytes, not 16");
  if (auto* p = std::get_if<allreduce_piece_shared>(&m); p && p->nonce.size() != 16)
    return make_error(error_code::decode_error, "allreduce_piece_shared: a nonce of " + std::to_string(p->nonce.size()) + " bytes, not 16");
  if (auto* h = std::get_if<host_reduce_mark>(&m); h && h->nonce.size() != 16)
    return make_error(error_code::decode_error, "host_reduce_mark: a nonce of " + std::to_string(h->nonce.size()) + " bytes, not 16");
  return {};
}

template <size_t I = 0>
message decode_kind(size_t kind, wire::reader& src) {
  if constexpr (I < std::variant_size_v<message>) {
    if (kind == I) {
      std::variant_alternative_t<I, message> x;
      src(x);
      return message(std::move(x));
    }
    return decode_kind<I + 1>(kind, src);
  } else {
    return {};
  }
}

}  // namespace

static_assert(std::size(kind_names) == std::variant_size_v<message>, "one name per message kind");

const char* kind_name(const message& m) { return kind_names[m.index()]; }

expected<std::vector<uint8_t>> encode_message(const message& m) {
  std::vector<uint8_t> out;
  wire::writer w(out);
  w(protocol_version, static_cast<uint8_t>(m.index()));
  std::visit([&](const auto& x) { w(x); }, m);
  if (!w.fits()) return make_error(error_code::limit_exceeded, std::string(kind_name(m)) + ": a list has more than 2^32 elements");
  return out;
}

expected<message> decode_message(const uint8_t* data, size_t size, size_t budget, const graph_limits* limits) {
  wire::reader src(data, size, wire::decode_budget(size, budget), limits);
  uint16_t version = 0;
  src(version);
  if (!src.ok()) return make_error(error_code::decode_error, "message header: " + src.error().message);
  if (version != protocol_version)
    return make_error(error_code::version_mismatch, "a message of protocol version " + std::to_string(version) +
                                                        " (this node speaks version " + std::to_string(protocol_version) +
                                                        "): upgrade the older node");
  uint8_t kind = 0;
  src(kind);
  if (!src.ok()) return make_error(error_code::decode_error, "message header: " + src.error().message);
  if (kind >= std::variant_size_v<message>) return make_error(error_code::decode_error, "unknown message kind " + std::to_string(kind));
  message m;
  try {
    m = decode_kind(kind, src);
  } catch (const std::bad_alloc&) {  // within the budget, yet more than this process could get
    return make_error(error_code::limit_exceeded, std::string(kind_names[kind]) + ": out of memory while decoding " +
                                                      std::to_string(size) + " bytes");
  }
  if (!src.ok()) return make_error(src.error().code, std::string(kind_names[kind]) + ": " + src.error().message);
  if (src.remaining() != 0)
    return make_error(error_code::decode_error, std::string(kind_name(m)) + ": " + std::to_string(src.remaining()) + " trailing bytes");
  if (auto ok = check(m); !ok) return make_error(ok.error().code, std::string(kind_name(m)) + ": " + ok.error().message);
  return m;
}

}  // namespace mesh::msg
