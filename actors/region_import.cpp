#include "actors/region_import.hpp"

#include <utility>

namespace mesh {

std::string import_regions(gpu::executor& ex, const std::vector<std::shared_ptr<shared_region>>& regions) {
  int tried = 0, imported = 0;
  std::string refusal;
  for (const auto& r : regions) {
    if (!r || r->attached(&ex)) continue;
    ++tried;
    auto handle = ex.import_host_memory({std::as_const(*r).data(), r->data_bytes()});
    if (handle) ++imported;
    else if (refusal.empty()) refusal = handle.error().to_string();
    r->attach(&ex, handle ? std::move(*handle) : nullptr);
  }
  if (!tried) return {};
  const std::string n = std::to_string(tried) + (tried == 1 ? " shared region" : " shared regions");
  if (imported == tried) return "the device copies gradients and sums to and from " + n + " itself (imported host memory)";
  std::string note = imported ? "the device copies to and from " + std::to_string(imported) + " of " + n + " itself; the others' bytes go through the host: "
                              : "gradients and sums in " + n + " go through the host: ";
  note += refusal;
  return note;
}

}  // namespace mesh
