#include "gpu/vk_transfer.hpp"

#include <algorithm>
#include <cstring>

#include "gpu/host_copy.hpp"

namespace mesh::gpu {

void memory_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                    VkAccessFlags dst_access) {
  auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = src_access;
  mb.dstAccessMask = dst_access;
  vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

void after_transfer_barrier(VkCommandBuffer cmd) {
  memory_barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                 VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_ACCESS_HOST_READ_BIT | VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
}

vk_transfers::vk_transfers(vk_device& d, memory_pool& host_pool, VkCommandPool cmd_pool, const vk_host_imports* imports)
    : d_(d), host_pool_(host_pool), cmd_pool_(cmd_pool), copy_pool_(copy_threads()), imports_(imports) {}

vk_transfers::~vk_transfers() {
  for (auto& f : flights_)
    if (f.fence) vkDestroyFence(d_.device, f.fence, nullptr);
}

expected<void> vk_transfers::make_flights() {
  for (auto& f : flights_) {
    if (f.fence) continue;
    auto ai = vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    ai.commandPool = cmd_pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    if (!f.cmd)
      if (VkResult r = vkAllocateCommandBuffers(d_.device, &ai, &f.cmd); r != VK_SUCCESS) {
        f.cmd = VK_NULL_HANDLE;
        return tl::unexpected(vk_error(r, "vkAllocateCommandBuffers"));
      }
    auto fci = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    if (VkResult r = vkCreateFence(d_.device, &fci, nullptr, &f.fence); r != VK_SUCCESS) {
      f.fence = VK_NULL_HANDLE;
      return tl::unexpected(vk_error(r, "vkCreateFence"));
    }
  }
  return {};
}

VkResult record_and_submit(VkQueue q, VkCommandBuffer cmd, VkFence fence, const std::function<void(VkCommandBuffer)>& record) {
  vkResetCommandBuffer(cmd, 0);
  auto bi = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vkBeginCommandBuffer(cmd, &bi);
  record(cmd);
  vkEndCommandBuffer(cmd);
  auto si = vk_struct<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  return vkQueueSubmit(q, 1, &si, fence);
}

template <class F>
expected<void> vk_transfers::submit(size_t h, F record) {
  flight& f = flights_[h];
  vkResetFences(d_.device, 1, &f.fence);
  if (VkResult r = record_and_submit(d_.queue, f.cmd, f.fence,
                                     [&](VkCommandBuffer cmd) {
                                       record(cmd);
                                       after_transfer_barrier(cmd);
                                     });
      r != VK_SUCCESS) {
    if (r == VK_ERROR_DEVICE_LOST) lost_ = true;
    return tl::unexpected(vk_error(r, "vkQueueSubmit"));
  }
  f.busy = true;
  return {};
}

expected<void> vk_transfers::wait(size_t h) {
  flight& f = flights_[h];
  if (!f.busy) return {};
  const VkResult r = vkWaitForFences(d_.device, 1, &f.fence, VK_TRUE, 120ull * 1000 * 1000 * 1000);
  if (r == VK_TIMEOUT) {
    lost_ = true;
    return make_error(error_code::timeout, "a GPU submission did not finish in 120 s: the device is considered lost");
  }
  if (r == VK_ERROR_DEVICE_LOST) lost_ = true;
  if (r != VK_SUCCESS) return tl::unexpected(vk_error(r, "vkWaitForFences"));
  f.busy = false;
  return {};
}

expected<void> vk_transfers::upload(const allocation& dst, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return {};
  if (dst.mapped) {
    parallel_copy(dst.mapped, bytes.data(), bytes.size(), &copy_pool_);
    return {};
  }
  if (auto made = make_flights(); !made) return made;
  auto st = host_pool_.allocate(std::min<uint64_t>(bytes.size(), upload_chunk));
  if (!st) return tl::unexpected(st.error());
  expected<void> ok;
  for (uint64_t off = 0; off < bytes.size() && ok; off += upload_chunk) {
    const uint64_t len = std::min<uint64_t>(bytes.size() - off, upload_chunk);
    parallel_copy(st->mapped, bytes.data() + off, len, &copy_pool_);
    ok = submit(0, [&](VkCommandBuffer cmd) {
      VkBufferCopy c{st->range.offset, dst.range.offset + off, len};
      vkCmdCopyBuffer(cmd, st->buffer, dst.buffer, 1, &c);
    });
    if (ok) ok = wait(0);
  }
  host_pool_.release(*st);
  return ok;
}

expected<void> vk_transfers::download(const allocation& src, std::vector<uint8_t>& bytes) {
  if (bytes.empty()) return {};
  if (auto made = make_flights(); !made) return tl::unexpected(made.error());
  auto st = host_pool_.allocate(bytes.size());
  if (!st) return tl::unexpected(st.error());
  auto ok = submit(0, [&](VkCommandBuffer cmd) {
    VkBufferCopy c{src.range.offset, st->range.offset, bytes.size()};
    vkCmdCopyBuffer(cmd, src.buffer, st->buffer, 1, &c);
  });
  if (ok) ok = wait(0);
  if (ok) parallel_copy(bytes.data(), st->mapped, bytes.size(), &copy_pool_);
  host_pool_.release(*st);
  return ok;
}

namespace {

/// Copies bytes [at, at + n) of `host`'s pieces, end to end, to `other` (to_device: from the
/// pieces into `other`, else from `other` into the pieces), each piece's part on `pool`.
void copy_pieces(std::span<const std::span<uint8_t>> host, uint64_t at, uint8_t* other, uint64_t n, bool to_device, thread_pool* pool) {
  uint64_t start = 0;  // of the current piece
  for (const auto& piece : host) {
    if (n == 0) break;
    const uint64_t end = start + piece.size();
    if (at < end) {
      const uint64_t len = std::min<uint64_t>(n, end - at);
      uint8_t* p = piece.data() + (at - start);
      if (to_device) parallel_copy(other, p, len, pool);
      else parallel_copy(p, other, len, pool);
      other += len;
      at += len;
      n -= len;
    }
    start = end;
  }
}

}  // namespace

expected<void> vk_transfers::move(const std::vector<std::pair<const allocation*, uint64_t>>& list, std::span<const std::span<uint8_t>> host,
                                  bool to_device) {
  uint64_t total = 0;
  bool mapped = true;
  for (const auto& [a, n] : list) {
    total += n;
    mapped = mapped && a->mapped;
  }
  if (mapped) {
    uint64_t at = 0;
    for (const auto& [a, n] : list) {
      copy_pieces(host, at, a->mapped, n, to_device, &copy_pool_);
      at += n;
    }
    return {};
  }
  if (total == 0) return {};
  if (auto direct = move_imported(list, host, to_device); !direct || *direct) return direct ? expected<void>{} : tl::unexpected(direct.error());
  // The chunks, each a half's fill: its place in `host` and the buffer pieces it holds.
  struct piece {
    const allocation* a;
    uint64_t offset, staged, len;  // in the buffer, in the half, bytes
  };
  struct chunk {
    uint64_t at = 0, fill = 0;
    std::vector<piece> pieces;
  };
  const uint64_t half = std::min<uint64_t>(total, transfer_chunk / 2);
  std::vector<chunk> chunks;
  for (size_t i = 0, in_buffer = 0; i < list.size();) {
    if (in_buffer == list[i].second) {  // an empty buffer, or the end of one
      ++i;
      in_buffer = 0;
      continue;
    }
    if (chunks.empty() || chunks.back().fill == half) chunks.push_back({chunks.empty() ? 0 : chunks.back().at + half, 0, {}});
    chunk& c = chunks.back();
    const uint64_t len = std::min(list[i].second - in_buffer, half - c.fill);
    c.pieces.push_back({list[i].first, in_buffer, c.fill, len});
    c.fill += len;
    in_buffer += len;
  }
  auto st = host_pool_.allocate(chunks.size() > 1 ? 2 * half : half);
  if (!st) return tl::unexpected(st.error());
  if (auto made = make_flights(); !made) {
    host_pool_.release(*st);
    return made;
  }
  const auto staged = [&](size_t k) { return st->mapped + (k % 2) * half; };
  const auto send = [&](size_t k) {
    const chunk& c = chunks[k];
    const uint64_t base = st->range.offset + (k % 2) * half;
    return submit(k % 2, [&](VkCommandBuffer cmd) {
      for (const auto& p : c.pieces) {
        VkBufferCopy bc{base + p.staged, p.a->range.offset + p.offset, p.len};
        if (!to_device) std::swap(bc.srcOffset, bc.dstOffset);
        vkCmdCopyBuffer(cmd, to_device ? st->buffer : p.a->buffer, to_device ? p.a->buffer : st->buffer, 1, &bc);
      }
    });
  };
  expected<void> ok;
  if (to_device) {
    // Fill a half once the device is done with it, then hand it to the device.
    for (size_t k = 0; k < chunks.size() && ok; ++k) {
      ok = wait(k % 2);
      if (ok) copy_pieces(host, chunks[k].at, staged(k), chunks[k].fill, true, &copy_pool_);
      if (ok) ok = send(k);
    }
  } else {
    // The device fills both halves ahead; each is emptied, then refilled with the chunk after next.
    for (size_t k = 0; k < std::min<size_t>(2, chunks.size()) && ok; ++k) ok = send(k);
    for (size_t k = 0; k < chunks.size() && ok; ++k) {
      ok = wait(k % 2);
      if (ok) copy_pieces(host, chunks[k].at, staged(k), chunks[k].fill, false, &copy_pool_);
      if (ok && k + 2 < chunks.size()) ok = send(k + 2);
    }
  }
  // Nothing may still write the staging memory when it goes back to the pool.
  for (size_t h = 0; h < 2; ++h)
    if (auto done = wait(h); !done && ok) ok = done;
  host_pool_.release(*st);
  return ok;
}

std::optional<std::vector<vk_host_imports::place>> imported_places(const vk_host_imports& imports, std::span<const std::span<uint8_t>> host) {
  std::vector<vk_host_imports::place> places;  // each piece's
  for (const auto& piece : host) {
    if (piece.empty()) {
      places.push_back({});
      continue;
    }
    auto at = imports.find(piece.data(), piece.size());
    if (!at) return std::nullopt;
    places.push_back(std::move(*at));
  }
  return places;
}

uint64_t record_imported_copies(VkCommandBuffer cmd, const std::vector<std::pair<const memory_pool::allocation*, uint64_t>>& list,
                                std::span<const std::span<uint8_t>> host, const std::vector<vk_host_imports::place>& places,
                                bool to_device) {
  // Buffers and pieces in step: each overlap of a buffer and a piece is one copy.
  uint64_t moved = 0;
  size_t p = 0;
  uint64_t in_piece = 0;
  for (const auto& [a, n] : list) {
    for (uint64_t in_buffer = 0; in_buffer < n;) {
      while (in_piece == host[p].size()) ++p, in_piece = 0;  // the pieces hold as many bytes as the buffers
      const uint64_t len = std::min(n - in_buffer, host[p].size() - in_piece);
      VkBufferCopy c{a->range.offset + in_buffer, places[p].offset + in_piece, len};
      if (to_device) std::swap(c.srcOffset, c.dstOffset);
      vkCmdCopyBuffer(cmd, to_device ? places[p].buffer : a->buffer, to_device ? a->buffer : places[p].buffer, 1, &c);
      in_buffer += len;
      in_piece += len;
      moved += len;
    }
  }
  return moved;
}

expected<bool> vk_transfers::move_imported(const std::vector<std::pair<const allocation*, uint64_t>>& list,
                                           std::span<const std::span<uint8_t>> host, bool to_device) {
  if (!imports_) return false;
  auto places = imported_places(*imports_, host);
  if (!places) return false;
  if (auto made = make_flights(); !made) return tl::unexpected(made.error());
  uint64_t moved = 0;
  auto ok = submit(0, [&](VkCommandBuffer cmd) { moved = record_imported_copies(cmd, list, host, *places, to_device); });
  if (ok) ok = wait(0);
  if (!ok) return tl::unexpected(ok.error());
  imported_bytes_ += moved;
  return true;
}

}  // namespace mesh::gpu
