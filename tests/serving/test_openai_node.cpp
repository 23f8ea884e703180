// The official `openai` npm package under Node.js against the server: a non-streamed and a
// streamed chat, an unknown model, and log-probabilities, with the texts compared to
// models::generate in process.
// The package is installed once into the build tree (npm install); when the npm registry cannot
// be reached the test exits with 77, which ctest reports as skipped, with the reason printed.
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "npm_package.hpp"
#include "serving_fixture.hpp"

using namespace mesh;
using namespace mesh::serving;
using namespace mesh::serving::test;
using json = nlohmann::json;

namespace {

const char* client_script = R"JS(
const OpenAI = require('openai');
async function main() {
  const [baseURL, apiKey] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  const request = {
    model: 'tiny',
    messages: [{ role: 'system', content: 'you are terse' }, { role: 'user', content: 'hello there' }],
    max_tokens: 12, seed: 7, temperature: 0.9, top_p: 0.95,
  };
  const plain = await client.chat.completions.create(request);
  let streamed = '', finish = null, usage = null, role = null, chunks = 0;
  const stream = await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    ++chunks;
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) streamed += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  let missing = null;
  try {
    await client.chat.completions.create({ ...request, model: 'no-such-model' });
  } catch (e) {
    missing = { status: e.status, code: e.code, isNotFound: e instanceof OpenAI.NotFoundError };
  }
  // Log-probabilities, non-streamed and streamed (each chunk carries its tokens' entries).
  const scored = await client.chat.completions.create({ ...request, logprobs: true, top_logprobs: 2 });
  const streamedLogprobs = [];
  const scoredStream = await client.chat.completions.create({ ...request, logprobs: true, top_logprobs: 2, stream: true });
  for await (const chunk of scoredStream)
    if (chunk.choices.length && chunk.choices[0].logprobs) streamedLogprobs.push(...chunk.choices[0].logprobs.content);
  console.log(JSON.stringify({ plain, streamed, finish, usage, role, chunks, missing, scored, streamedLogprobs }));
}
main().catch((e) => { console.error('client failed:', e); process.exit(1); });
)JS";

/// The package's node_modules, installing it on first use. Exits 77 (skipped) only when the
/// registry cannot be reached; any other failure fails the test.
std::filesystem::path openai_package() {
  auto r = mesh::test::npm_package(MESH_SERVING_NPM_DIR, "openai", "4");
  if (r.unreachable) {
    std::cerr << "SKIPPED: the npm registry cannot be reached, so the openai package cannot be installed:\n" << r.error << std::endl;
    std::exit(77);
  }
  if (r.node_modules.empty()) FAIL(r.error);
  return r.node_modules;
}

}  // namespace

TEST_CASE("the openai npm package: a non-streamed and a streamed chat", "[serving][openai]") {
  const auto package_dir = openai_package();  // first: it may exit before anything is running
  server_options o;
  o.api_key = "sk-node";
  served_model served(o);
  reference_model ref(served.path);
  models::generate_options opts;
  opts.max_tokens = 12;
  opts.sampling = {.temperature = 0.9f, .top_p = 0.95f, .seed = 7};
  const auto expected_chat = ref.chat({{"system", "you are terse"}, {"user", "hello there"}}, opts);
  opts.logprobs = 2;
  const auto expected_scored = ref.chat({{"system", "you are terse"}, {"user", "hello there"}}, opts);

  models::test::write_file(served.dir / "client.cjs", std::string(client_script));
  auto r = mesh::test::run_command("NODE_PATH='" + package_dir.string() + "' node '" +
                                   (served.dir / "client.cjs").string() + "' " + served.url("/v1") + " sk-node");
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto line = r.output.substr(r.output.rfind('{', r.output.find("\"plain\"")));
  const auto j = json::parse(line);
  CHECK(j.at("plain").at("choices")[0].at("message").at("content") == expected_chat.text);
  CHECK(j.at("plain").at("usage").at("completion_tokens") == static_cast<int64_t>(expected_chat.tokens.size()));
  CHECK(j.at("streamed") == expected_chat.text);
  CHECK(j.at("role") == "assistant");
  CHECK(j.at("finish") == j.at("plain").at("choices")[0].at("finish_reason"));
  CHECK(j.at("usage") == j.at("plain").at("usage"));
  CHECK(j.at("chunks").get<int>() >= 4);
  CHECK(j.at("missing").at("status") == 404);
  CHECK(j.at("missing").at("code") == "model_not_found");
  CHECK(j.at("missing").at("isNotFound") == true);

  // The same text with log-probabilities, which are models::generate's, streamed or not.
  const auto& scored = j.at("scored").at("choices")[0];
  CHECK(scored.at("message").at("content") == expected_chat.text);
  const auto& content = scored.at("logprobs").at("content");
  REQUIRE(content.size() == expected_scored.logprobs.size());
  REQUIRE(j.at("streamedLogprobs").size() == content.size());
  for (size_t i = 0; i < content.size(); ++i) {
    INFO("token " << i << ": " << content[i].dump());
    CHECK(std::abs(content[i].at("logprob").get<double>() - expected_scored.logprobs[i].logprob) < 1e-6);
    CHECK(content[i].at("top_logprobs").size() == 2);
    CHECK(content[i].at("bytes").is_array());
    CHECK(j.at("streamedLogprobs")[i] == content[i]);
  }
}
