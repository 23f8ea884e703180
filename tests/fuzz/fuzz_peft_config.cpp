// libFuzzer target for adapter_config.json (models/peft.hpp parse_lora_config): any bytes give an
// error naming the file, or a config meshnode can apply: a rank in range, a finite scale, and
// target modules that are all projections it adapts.
#include <algorithm>
#include <cmath>
#include <string_view>

#include "models/peft.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

using mesh::fuzz::check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mesh::models;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = parse_lora_config(text, "adapter_config.json");
  if (!c) {
    check(c.error().message.rfind("adapter_config.json: ", 0) == 0);
    return 0;
  }
  check(c->rank >= 1 && c->rank <= 4096);
  check(std::isfinite(c->scale()));
  check(!c->targets.empty());
  for (const auto& t : c->targets)
    check(is_lora_target_name(t));
  return 0;
}
