#pragma once
// A tiny random Llama written as a GGUF file, served by local_backend on the CPU executor behind
// an api_server on 127.0.0.1 (port 0), and the same checkpoint in a second session for what
// models::generate produces in process; curl and file helpers for the end-to-end tests.
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "gpu/executor.hpp"
#include "model_writer.hpp"
#include "models/chat_template.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/generate.hpp"
#include "models/session.hpp"
#include "run_command.hpp"
#include "serving/local_backend.hpp"
#include "serving/server.hpp"

namespace mesh::serving::test {

inline models::test::model_spec tiny_spec() {
  models::test::model_spec s;
  s.layers = 1;
  s.context = 256;
  return s;
}

/// The tiny model with a context long enough for a generation that outlasts any timeout the
/// tests set (thousands of tokens), whatever the machine's speed.
inline models::test::model_spec long_spec() {
  models::test::model_spec s = tiny_spec();
  s.context = 4096;
  return s;
}

/// A backend whose models each run on a CPU executor of one thread.
inline local_backend_options cpu_backend_options() {
  local_backend_options o;
  o.make_executor = [] { return expected<std::unique_ptr<gpu::executor>>(gpu::make_cpu_executor(1)); };
  return o;
}

/// The model file, the backend serving it as "tiny" (chat template ChatML), the server.
struct served_model {
  models::test::temp_dir dir;
  std::filesystem::path path;
  std::unique_ptr<local_backend> backend;
  std::unique_ptr<api_server> server;

  /// `parallel`: requests the model runs at once; `prefill_chunk`: prompt tokens a request reads
  /// per round (0: the backend's defaults).
  explicit served_model(server_options options = {}, size_t max_queued = 8,
                        const models::test::model_spec& spec = tiny_spec(), int64_t parallel = 0,
                        int64_t prefill_chunk = 0) {
    path = dir / "tiny.gguf";
    models::test::write_gguf_model(path, spec, models::tensor_type::f32);
    local_model_options m;
    m.path = path;
    m.chat_template = "chatml";
    m.max_queued = max_queued;
    m.parallel = parallel;
    m.prefill_chunk = prefill_chunk;
    auto b = local_backend::create(cpu_backend_options(), {m});
    REQUIRE(b);
    backend = std::move(*b);
    auto s = api_server::start(*backend, options);
    REQUIRE(s);
    server = std::move(*s);
  }

  std::string url(const std::string& path_part) const {
    return "http://127.0.0.1:" + std::to_string(server->port()) + path_part;
  }
};

/// What models::generate gives for the same checkpoint in this process: the reference the
/// API's text must equal.
struct reference_model {
  std::unique_ptr<gpu::executor> executor = gpu::make_cpu_executor(1);
  std::optional<models::checkpoint> ckpt;
  std::optional<models::session> sess;
  std::optional<models::tokenizer> tok;

  explicit reference_model(const std::filesystem::path& path) {
    auto c = models::checkpoint::open(path);
    REQUIRE(c);
    ckpt.emplace(std::move(*c));
    auto s = models::session::create(*executor, *ckpt);
    REQUIRE(s);
    sess.emplace(std::move(*s));
    auto v = models::load_tokenizer(*ckpt, sess->config());
    REQUIRE(v);
    auto t = models::tokenizer::create(v->vocab);
    REQUIRE(t);
    tok.emplace(std::move(*t));
  }

  models::generation run(const std::vector<int32_t>& prompt, const models::generate_options& o) {
    sess->reset();
    auto g = models::generate(*sess, *tok, prompt, o);
    REQUIRE(g);
    return *g;
  }

  /// A chat rendered with ChatML, encoded as a chat prompt is (special tokens parsed, no BOS).
  models::generation chat(const std::vector<models::chat_message>& messages, const models::generate_options& o) {
    models::chat_tokens special;
    const auto& v = tok->vocab();
    if (v.bos_id) special.bos = tok->piece(*v.bos_id);
    if (v.eos_id) special.eos = tok->piece(*v.eos_id);
    auto t = models::chat_template_by_name("chatml", special);
    REQUIRE(t);
    auto text = t->render(messages, true);
    REQUIRE(text);
    auto ids = tok->encode(*text, {.add_special = false, .parse_special = true});
    REQUIRE(ids);
    return run(*ids, o);
  }

  models::generation complete(const std::string& prompt, const models::generate_options& o) {
    auto ids = tok->encode(prompt, {.add_special = true, .parse_special = true});
    REQUIRE(ids);
    return run(*ids, o);
  }
};

struct http_reply {
  int status = 0;
  std::string body;
};

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A request made by the curl program: `extra` are more curl arguments (e.g. "-N", headers).
inline http_reply curl(const std::filesystem::path& scratch, const std::string& url, const std::string& body,
                       const std::string& extra = "") {
  const auto body_file = scratch / "request.json", out_file = scratch / "reply.txt";
  std::string cmd = "curl -sS --max-time 60 -o '" + out_file.string() + "' -w '%{http_code}' " + extra + " ";
  if (!body.empty()) {
    models::test::write_file(body_file, body);
    cmd += "-H 'Content-Type: application/json' --data-binary @'" + body_file.string() + "' ";
  }
  cmd += "'" + url + "'";
  auto r = mesh::test::run_command(cmd);
  INFO(cmd << "\n" << r.output);
  REQUIRE(r.status == 0);
  http_reply reply;
  reply.status = std::stoi(r.output);
  reply.body = read_text(out_file);
  return reply;
}

/// The JSON payloads of a server-sent event stream's `data:` lines, and whether it ended with
/// `data: [DONE]`. Comment lines (":") are skipped as clients skip them.
struct sse_stream {
  std::vector<nlohmann::json> events;
  bool done = false;
};

inline sse_stream parse_sse(const std::string& text) {
  sse_stream s;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string payload = line.substr(6);
    REQUIRE_FALSE(s.done);  // nothing after [DONE]
    if (payload == "[DONE]") {
      s.done = true;
      continue;
    }
    s.events.push_back(nlohmann::json::parse(payload));
  }
  return s;
}

}  // namespace mesh::serving::test
