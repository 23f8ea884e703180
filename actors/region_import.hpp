#pragma once
/// The host all-reduce's shared regions (host_reduce.hpp) as host memory the device copies to
/// and from itself (gpu::executor::import_host_memory): each bucket's read-back lands in this
/// node's region and each sum is written from the members' regions with copy commands alone,
/// no staging memory and no copy on the host (docs/training.md, "Peers on one host").
#include <memory>
#include <string>
#include <vector>

#include "actors/shared_region.hpp"
#include "gpu/executor.hpp"

namespace mesh {

/// Imports each of `regions` (null entries skipped) into `ex`'s device, once per region and
/// executor (the region keeps the import, or the refusal, attached under the executor's address:
/// shared_region::attach; an executor made after a device restart at the same address finds that
/// entry and imports nothing, its copies of those regions going through staging).
/// Returns, when it tried a region it had not
/// tried before, a sentence for the node's log saying what the device copies itself and, for a
/// refusal, why (the copies then go through staging as before); else an empty string.
std::string import_regions(gpu::executor& ex, const std::vector<std::shared_ptr<shared_region>>& regions);

}  // namespace mesh
