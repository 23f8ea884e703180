#include "wire/takeover_grant.hpp"

#include <string>
#include <string_view>

namespace mesh::msg {
namespace {
constexpr std::string_view context = "meshnode train takeover grant v1";

template <class T>
void put(std::vector<uint8_t>& out, T x) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(x) >> (8 * i)));
}
}  // namespace

std::vector<uint8_t> takeover_statement(uint64_t client_train, uint32_t generation, const node_id& coordinator) {
  std::vector<uint8_t> out(context.begin(), context.end());
  out.push_back(0);  // the context ends here, whatever follows
  put(out, client_train);
  put(out, generation);
  out.insert(out.end(), coordinator.key.begin(), coordinator.key.end());
  return out;
}

takeover_grant sign_takeover(const std::array<uint8_t, 64>& client_secret_key, uint64_t client_train, uint32_t generation,
                             const node_id& coordinator) {
  return {generation, coordinator, sign_statement(client_secret_key, takeover_statement(client_train, generation, coordinator))};
}

expected<void> check_takeover(const takeover_grant& g, const node_id& client, uint64_t client_train, const node_id& coordinator) {
  const auto bad = [](const std::string& why) { return make_error(error_code::invalid_argument, why); };
  if (g.generation == 0) return bad("it carries no takeover grant from the client");
  if (g.coordinator != coordinator)
    return bad("its takeover grant is for node " + g.coordinator.short_string() + ", not " + coordinator.short_string());
  if (client.empty() || !verify_signature(client, takeover_statement(client_train, g.generation, g.coordinator), g.sig))
    return bad("its takeover grant (generation " + std::to_string(g.generation) + ") is not signed by the run's client " +
               client.short_string());
  return {};
}

}  // namespace mesh::msg
