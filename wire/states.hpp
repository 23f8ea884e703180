#pragma once
/// The enums that cross the wire: states, methods and kinds, each with its range (for the
/// decoder, wire/codec.hpp) and a short stable name (for logs, meshctl and JSON). Values are part
/// of the wire format: append only, never renumber.
#include <cstdint>
#include <optional>
#include <string_view>

#include "base/error.hpp"

namespace mesh {

/// A peer as the health monitor sees it (actors/health.hpp). `unknown` only in status replies:
/// a member the monitor is not tracking (yet).
enum class peer_health : uint8_t { healthy = 0, suspect = 1, dead = 2, unknown = 3 };
constexpr uint8_t enum_limit(peer_health) { return 4; }
const char* to_string(peer_health h);

/// Where a job or training run is. `moved`: a training run whose client moved it to another node
/// (coordinator failover), which coordinates it from then on.
enum class job_state : uint8_t { planning = 0, running = 1, done = 2, failed = 3, moved = 4 };
constexpr uint8_t enum_limit(job_state) { return 5; }
const char* to_string(job_state s);

/// What a job is: a one-shot job's plan, an inference session or a training run.
enum class job_kind : uint8_t { pipeline = 0, data_parallel = 1, tensor_parallel = 2, inference = 3, training = 4 };
constexpr uint8_t enum_limit(job_kind) { return 5; }
const char* to_string(job_kind k);

/// The kind of device a node computes on.
enum class device_kind : uint8_t { discrete = 0, integrated = 1, virtual_gpu = 2, cpu = 3, other = 4 };
constexpr uint8_t enum_limit(device_kind) { return 5; }
const char* to_string(device_kind k);
/// "discrete", "integrated", "virtual", "cpu" (as gpu/ reports them); anything else is `other`.
device_kind device_kind_from(std::string_view name);

/// How a training run spreads over the workers.
enum class train_method : uint8_t { data_parallel = 0, diloco = 1 };
constexpr uint8_t enum_limit(train_method) { return 2; }
const char* to_string(train_method m);

/// Element format of all-reduce payloads (actors/ring_allreduce.hpp): f32, or rounded to 16 bits
/// to halve the bytes on the wire (the sums are kept in f32).
/// How the all-reduce carries floats (actors/allreduce_codec.hpp): as they are, rounded to a
/// 16-bit float, or in blocks of 32 with one f32 scale and an 8-bit integer (int8) or a 4-bit
/// float (fp4, E3M0) per value.
enum class wire_format : uint8_t { f32 = 0, bf16 = 1, f16 = 2, int8 = 3, fp4 = 4 };
constexpr uint8_t enum_limit(wire_format) { return 5; }
const char* to_string(wire_format f);

/// Why a generation through a node ended (msg::generate_done): `length` after max_tokens,
/// `stop` at a stop string, `eos` at an end-of-sequence token, `context` when the session's
/// context was full (max_tokens was more than the context left after the prompt), `cancelled`
/// when the client withdrew the request or went away.
enum class finish_reason : uint8_t { length = 0, stop = 1, eos = 2, context = 3, cancelled = 4 };
constexpr uint8_t enum_limit(finish_reason) { return 5; }
const char* to_string(finish_reason r);

/// What a models_request asks of a node: the models it serves, loading one, unloading one.
enum class models_action : uint8_t { list = 0, load = 1, unload = 2, replan = 3 };
constexpr uint8_t enum_limit(models_action) { return 4; }
const char* to_string(models_action a);

/// Error codes travel as their value (base/error.hpp lists them).
constexpr uint8_t enum_limit(error_code) { return static_cast<uint8_t>(error_code_count); }

}  // namespace mesh
