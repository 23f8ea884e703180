#include "wire/states.hpp"

namespace mesh {

const char* to_string(peer_health h) {
  switch (h) {
    case peer_health::healthy: return "healthy";
    case peer_health::suspect: return "suspect";
    case peer_health::dead: return "dead";
    case peer_health::unknown: return "unknown";
  }
  return "?";
}

const char* to_string(job_state s) {
  switch (s) {
    case job_state::planning: return "planning";
    case job_state::running: return "running";
    case job_state::done: return "done";
    case job_state::failed: return "failed";
    case job_state::moved: return "moved";
  }
  return "?";
}

const char* to_string(job_kind k) {
  switch (k) {
    case job_kind::pipeline: return "pipeline";
    case job_kind::data_parallel: return "data_parallel";
    case job_kind::tensor_parallel: return "tensor_parallel";
    case job_kind::inference: return "inference";
    case job_kind::training: return "training";
  }
  return "?";
}

const char* to_string(device_kind k) {
  switch (k) {
    case device_kind::discrete: return "discrete";
    case device_kind::integrated: return "integrated";
    case device_kind::virtual_gpu: return "virtual";
    case device_kind::cpu: return "cpu";
    case device_kind::other: return "other";
  }
  return "?";
}

device_kind device_kind_from(std::string_view name) {
  if (name == "discrete") return device_kind::discrete;
  if (name == "integrated") return device_kind::integrated;
  if (name == "virtual") return device_kind::virtual_gpu;
  if (name == "cpu") return device_kind::cpu;
  return device_kind::other;
}

const char* to_string(train_method m) {
  switch (m) {
    case train_method::data_parallel: return "data_parallel";
    case train_method::diloco: return "diloco";
  }
  return "?";
}

const char* to_string(wire_format f) {
  switch (f) {
    case wire_format::f32: return "f32";
    case wire_format::bf16: return "bf16";
    case wire_format::f16: return "f16";
    case wire_format::int8: return "int8";
    case wire_format::fp4: return "fp4";
  }
  return "?";
}

const char* to_string(finish_reason r) {
  switch (r) {
    case finish_reason::length: return "length";
    case finish_reason::stop: return "stop";
    case finish_reason::eos: return "eos";
    case finish_reason::context: return "context";
    case finish_reason::cancelled: return "cancelled";
  }
  return "?";
}

const char* to_string(models_action a) {
  switch (a) {
    case models_action::list: return "list";
    case models_action::load: return "load";
    case models_action::unload: return "unload";
    case models_action::replan: return "replan";
  }
  return "?";
}

}  // namespace mesh
