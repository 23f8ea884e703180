#include "base/error.hpp"

namespace mesh {

const char* to_string(error_code code) {
  switch (code) {
    case error_code::invalid_argument: return "invalid_argument";
    case error_code::shape_mismatch: return "shape_mismatch";
    case error_code::dtype_mismatch: return "dtype_mismatch";
    case error_code::invalid_graph: return "invalid_graph";
    case error_code::limit_exceeded: return "limit_exceeded";
    case error_code::decode_error: return "decode_error";
    case error_code::version_mismatch: return "version_mismatch";
    case error_code::not_found: return "not_found";
    case error_code::unsupported: return "unsupported";
    case error_code::io_error: return "io_error";
    case error_code::network: return "network";
    case error_code::device: return "device";
    case error_code::timeout: return "timeout";
    case error_code::internal: return "internal";
    case error_code::evicted: return "evicted";
    case error_code::unavailable: return "unavailable";
  }
  return "unknown";
}

std::string error::to_string() const { return std::string(mesh::to_string(code)) + ": " + message; }

}  // namespace mesh
