#include "actors/messages.hpp"

#include "graph/caf_codec.hpp"

namespace mesh::msg {
namespace {

const char* const kind_names[] = {"hello", "heartbeat", "submit_job", "job_result", "run_stage",
                                  "activation", "stage_done", "status_request", "status_reply",
                                  "open_session", "infer", "close_session", "peer_exchange", "open_training",
                                  "train_setup", "train_step", "allreduce_piece", "train_reduced", "train_state",
                                  "train_progress", "job_progress", "train_resume", "train_checkpoint",
                                  "cancel_stages"};

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
  return {};
}

template <size_t I = 0>
expected<message> decode_kind(size_t kind, bounded_deserializer& src, size_t total) {
  if constexpr (I < std::variant_size_v<message>) {
    if (kind == I) {
      std::variant_alternative_t<I, message> x;
      if (auto ok = caf_decode(src, total, kind_names[I], x); !ok) return tl::unexpected(ok.error());
      return message(std::move(x));
    }
    return decode_kind<I + 1>(kind, src, total);
  } else {
    return make_error(error_code::decode_error, "unknown message kind " + std::to_string(kind));
  }
}

}  // namespace

static_assert(std::size(kind_names) == std::variant_size_v<message>, "one name per message kind");

const char* kind_name(const message& m) { return kind_names[m.index()]; }

expected<std::vector<uint8_t>> encode_message(const message& m) {
  auto body = std::visit([](auto x) { return caf_encode(x); }, m);
  if (!body) return tl::unexpected(body.error());
  std::vector<uint8_t> out;
  out.reserve(body->size() + 1);
  out.push_back(static_cast<uint8_t>(m.index()));
  out.insert(out.end(), body->begin(), body->end());
  return out;
}

expected<message> decode_message(const uint8_t* data, size_t size) {
  if (size == 0) return make_error(error_code::decode_error, "empty message");
  bounded_deserializer src(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto m = decode_kind(data[0], src, size - 1);
  if (!m) return m;
  if (src.remaining() != 0)
    return make_error(error_code::decode_error, std::string(kind_name(*m)) + ": " + std::to_string(src.remaining()) + " trailing bytes");
  if (auto ok = check(*m); !ok) return make_error(ok.error().code, std::string(kind_name(*m)) + ": " + ok.error().message);
  return m;
}

}  // namespace mesh::msg
