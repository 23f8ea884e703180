#include "serving/api_error.hpp"

#include <nlohmann/json.hpp>

namespace mesh::serving {

const char* to_string(failure_kind k) {
  switch (k) {
    case failure_kind::invalid_request: return "invalid_request";
    case failure_kind::unauthorized: return "unauthorized";
    case failure_kind::model_not_found: return "model_not_found";
    case failure_kind::too_long: return "too_long";
    case failure_kind::queue_full: return "queue_full";
    case failure_kind::no_capacity: return "no_capacity";
    case failure_kind::timeout: return "timeout";
    case failure_kind::cancelled: return "cancelled";
    case failure_kind::internal: return "internal";
  }
  return "internal";
}

int http_status(failure_kind k) {
  switch (k) {
    case failure_kind::invalid_request: return 400;
    case failure_kind::unauthorized: return 401;
    case failure_kind::model_not_found: return 404;
    case failure_kind::too_long: return 413;
    case failure_kind::queue_full: return 429;
    case failure_kind::no_capacity: return 503;
    case failure_kind::timeout: return 504;
    case failure_kind::cancelled: return 499;
    case failure_kind::internal: return 500;
  }
  return 500;
}

std::string error_body(const failure& f) {
  // OpenAI's (type, code) pairs where it has them: clients map the status to an error class
  // and show the message; some branch on `code`.
  const char* type = "invalid_request_error";
  const char* code = nullptr;
  switch (f.kind) {
    case failure_kind::invalid_request: break;
    case failure_kind::unauthorized: code = "invalid_api_key"; break;
    case failure_kind::model_not_found: code = "model_not_found"; break;
    case failure_kind::too_long: code = "context_length_exceeded"; break;
    case failure_kind::queue_full: type = "rate_limit_error"; code = "queue_full"; break;
    case failure_kind::no_capacity: type = "server_error"; code = "no_capacity"; break;
    case failure_kind::timeout: type = "server_error"; code = "timeout"; break;
    case failure_kind::cancelled: type = "server_error"; code = "cancelled"; break;
    case failure_kind::internal: type = "server_error"; code = "internal_error"; break;
  }
  nlohmann::json e = {{"message", f.message},
                      {"type", type},
                      {"param", f.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.param)},
                      {"code", code ? nlohmann::json(code) : nlohmann::json(nullptr)}};
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace mesh::serving
