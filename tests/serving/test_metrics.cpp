// The metrics core: histograms, the Prometheus text writer (exact text, escaping, refusals), the
// requests/tokens series, what serving_stats exposes, and the dashboard's JSON.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "serving/mesh_json.hpp"
#include "serving/metrics.hpp"
#include "serving/rate_series.hpp"
#include "serving/serving_stats.hpp"

using namespace mesh::serving;
using namespace std::chrono_literals;
using json = nlohmann::json;

TEST_CASE("histogram: cumulative buckets by upper bound, sum and count", "[serving][metrics]") {
  auto h = histogram::create({0.5, 1});
  REQUIRE(h);
  for (double v : {0.25, 0.5, 0.75, 4.0}) h->observe(v);
  CHECK(h->cumulative(0) == 2);  // 0.25 and 0.5: a value equal to a bound is in its bucket (le)
  CHECK(h->cumulative(1) == 3);
  CHECK(h->cumulative(2) == 4);  // +Inf
  CHECK(h->count() == 4);
  CHECK(h->sum() == 5.5);
  h->observe(std::nan(""));
  CHECK(h->cumulative(1) == 3);
  CHECK(h->cumulative(2) == 5);
  CHECK(std::isnan(h->sum()));

  CHECK_FALSE(histogram::create({1, 1}));
  CHECK_FALSE(histogram::create({2, 1}));
  CHECK_FALSE(histogram::create({1, std::numeric_limits<double>::infinity()}));
  auto empty = histogram::create({});
  REQUIRE(empty);
  empty->observe(3);
  CHECK(empty->cumulative(0) == 1);
}

TEST_CASE("prometheus text: the exact exposition of a counter, a gauge and a histogram", "[serving][metrics]") {
  auto h = histogram::create({0.5, 1});
  REQUIRE(h);
  for (double v : {0.25, 0.5, 0.75, 4.0}) h->observe(v);
  std::vector<metric_family> fs;
  fs.push_back({"meshnode_things_total", "Things counted.\nA second line, a \\ and \"quotes\".", metric_type::counter,
                {{{{"route", "/a"}}, 3, nullptr}, {{{"route", "a \"b\"\\c\nd"}, {"status", "200"}}, 1.5, nullptr}}});
  fs.push_back({"meshnode_level", "A gauge.", metric_type::gauge, {{{}, 0.25, nullptr}}});
  fs.push_back({"meshnode_wait_seconds", "Waits.", metric_type::histogram, {{{{"model", "m"}}, 0, &*h}}});
  fs.push_back({"meshnode_none_total", "No samples yet.", metric_type::counter, {}});
  auto text = prometheus_text(fs);
  REQUIRE(text);
  CHECK(*text ==
        "# HELP meshnode_things_total Things counted.\\nA second line, a \\\\ and \"quotes\".\n"
        "# TYPE meshnode_things_total counter\n"
        "meshnode_things_total{route=\"/a\"} 3\n"
        "meshnode_things_total{route=\"a \\\"b\\\"\\\\c\\nd\",status=\"200\"} 1.5\n"
        "# HELP meshnode_level A gauge.\n"
        "# TYPE meshnode_level gauge\n"
        "meshnode_level 0.25\n"
        "# HELP meshnode_wait_seconds Waits.\n"
        "# TYPE meshnode_wait_seconds histogram\n"
        "meshnode_wait_seconds_bucket{model=\"m\",le=\"0.5\"} 2\n"
        "meshnode_wait_seconds_bucket{model=\"m\",le=\"1\"} 3\n"
        "meshnode_wait_seconds_bucket{model=\"m\",le=\"+Inf\"} 4\n"
        "meshnode_wait_seconds_sum{model=\"m\"} 5.5\n"
        "meshnode_wait_seconds_count{model=\"m\"} 4\n"
        "# HELP meshnode_none_total No samples yet.\n"
        "# TYPE meshnode_none_total counter\n");
}

TEST_CASE("prometheus text: values, names and what is refused", "[serving][metrics]") {
  CHECK(format_metric_value(0) == "0");
  CHECK(format_metric_value(-7) == "-7");
  CHECK(format_metric_value(123456789012.0) == "123456789012");
  CHECK(format_metric_value(0.1) == "0.1");
  CHECK(format_metric_value(1e-5) == "1e-05");
  CHECK(format_metric_value(1e300) == "1e+300");
  CHECK(format_metric_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_metric_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(format_metric_value(std::nan("")) == "NaN");
  CHECK(escape_label_value("plain") == "plain");
  CHECK(escape_label_value("a\\b\"c\nd") == "a\\\\b\\\"c\\nd");

  CHECK(valid_metric_name("meshnode_a:b_1"));
  CHECK_FALSE(valid_metric_name("1abc"));
  CHECK_FALSE(valid_metric_name("a-b"));
  CHECK_FALSE(valid_metric_name(""));
  CHECK(valid_label_name("peer_id"));
  CHECK_FALSE(valid_label_name("__reserved"));
  CHECK_FALSE(valid_label_name("a:b"));

  auto refused = [](std::vector<metric_family> fs) { return !prometheus_text(fs).has_value(); };
  CHECK(refused({{"bad-name", "", metric_type::gauge, {}}}));
  CHECK(refused({{"meshnode_a", "", metric_type::gauge, {}}, {"meshnode_a", "", metric_type::gauge, {}}}));
  CHECK(refused({{"meshnode_a", "", metric_type::gauge, {{{{"bad-label", "x"}}, 1, nullptr}}}}));
  CHECK(refused({{"meshnode_h", "", metric_type::histogram, {{{}, 0, nullptr}}}}));
  auto h = histogram::create({1});
  REQUIRE(h);
  CHECK(refused({{"meshnode_h", "", metric_type::histogram, {{{{"le", "1"}}, 0, &*h}}}}));
  CHECK_FALSE(refused({{"meshnode_h", "", metric_type::histogram, {{{}, 0, &*h}}}}));
}

TEST_CASE("rate series: requests and tokens per interval, spread and forgotten", "[serving][metrics]") {
  const auto t0 = rate_series::clock::time_point{} + 1000s;
  rate_series s(t0, 5s, 4);
  s.add_request(t0 + 1s);
  s.add_request(t0 + 6s);
  s.add_request(t0 + 7s);
  s.add_tokens(t0 + 2500ms, t0 + 7500ms, 10);  // half in interval 0, half in interval 1
  s.add_tokens(t0 + 8s, t0 + 8s, 3);           // no duration: all at its end
  s.add_request(t0 - 1s);                      // before the origin: dropped
  auto v = s.at(t0 + 12s);                     // in interval 2, which is left out
  CHECK(v.interval_s == 5);
  CHECK(v.requests == std::vector<double>{0, 0, 1, 2});
  REQUIRE(v.tokens.size() == 4);
  CHECK(v.tokens[2] == Approx(5));
  CHECK(v.tokens[3] == Approx(8));
  CHECK(s.at(t0 + 17s).requests == std::vector<double>{0, 1, 2, 0});

  s.add_request(t0 + 31s);  // interval 6: the window (4) no longer holds 0 and 1
  CHECK(s.at(t0 + 36s).requests == std::vector<double>{0, 0, 0, 1});
  s.add_request(t0 + 2s);   // older than the window kept: dropped
  CHECK(s.at(t0 + 36s).requests == std::vector<double>{0, 0, 0, 1});
  CHECK(s.at(t0 + 100s).requests == std::vector<double>{0, 0, 0, 0});
}

TEST_CASE("route labels are the server's routes or other", "[serving][metrics]") {
  CHECK(route_label("/v1/chat/completions") == "/v1/chat/completions");
  CHECK(route_label("/v1/models/tiny") == "/v1/models/{id}");
  CHECK(route_label("/metrics") == "/metrics");
  CHECK(route_label("/") == "/");
  CHECK(route_label("/v1/unknown/abc") == "other");
  CHECK(route_label("/favicon.ico") == "other");
}

namespace {

node_view node(std::string id, std::string device, std::string health, double rtt_ms = 0) {
  node_view n;
  n.id = std::move(id);
  n.device = std::move(device);
  n.self = health == "self";
  n.health = std::move(health);
  n.rtt_ms = rtt_ms;
  return n;
}

mesh_snapshot three_nodes() {
  mesh_snapshot m;
  m.uptime_s = 42.5;
  node_view b = node("bbbb", "gpu", "healthy", 12.5);
  b.address = "10.0.0.2:7000";
  b.bytes_sent = 1000;
  b.bytes_received = 2000;
  b.packets_lost = 3;
  m.nodes = {node("aaaa", "cpu", "self"), b, node("cccc", "gpu \xff", "suspect", 250)};
  model_view model;
  model.id = "llama";
  model.layers = 16;
  model.stages = {{"aaaa", 0, 8}, {"bbbb", 8, 16}};
  m.models = {model};
  training_view t;
  t.run = 18446744073709551615ull;  // beyond a JavaScript number's exact integers
  t.state = "running";
  t.step = 3;
  t.steps = 10;
  t.loss = {2.5, std::nan(""), 0.5};
  m.trainings = {t};
  return m;
}

}  // namespace

TEST_CASE("serving stats: what /metrics says of requests, tokens, the queue and the mesh", "[serving][metrics]") {
  const auto t0 = serving_stats::clock::now();
  serving_stats stats(t0);
  stats.http_request("/v1/completions", 200);
  stats.http_request("/v1/completions", 200);
  stats.http_request("/v1/chat/completions", 400);
  stats.first_piece("tiny", 0.02);
  stats.piece_gap("tiny", 0.003);
  stats.piece_gap("tiny", 0.004);
  generation_result r;
  r.prompt_tokens = 7;
  r.completion_tokens = 12;
  r.generate_seconds = 0.5;
  stats.generation_done("tiny", r, t0 + 1s);
  stats.request_duration("/v1/completions", 0.7);

  auto text = stats.prometheus(backend_queue{1, 2}, three_nodes());
  REQUIRE(text);
  INFO(*text);
  auto has = [&](const std::string& line) { return text->find("\n" + line + "\n") != std::string::npos; };
  CHECK(has("meshnode_http_requests_total{route=\"/v1/completions\",status=\"200\"} 2"));
  CHECK(has("meshnode_http_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1"));
  CHECK(has("meshnode_prompt_tokens_total{model=\"tiny\"} 7"));
  CHECK(has("meshnode_completion_tokens_total{model=\"tiny\"} 12"));
  CHECK(has("meshnode_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"0.01\"} 0"));
  CHECK(has("meshnode_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"0.025\"} 1"));
  CHECK(has("meshnode_time_to_first_token_seconds_count{model=\"tiny\"} 1"));
  CHECK(has("meshnode_inter_token_latency_seconds_count{model=\"tiny\"} 2"));
  CHECK(has("meshnode_inter_token_latency_seconds_sum{model=\"tiny\"} 0.007"));
  CHECK(has("meshnode_request_duration_seconds_count{route=\"/v1/completions\"} 1"));
  CHECK(has("meshnode_queue_requests{state=\"running\"} 1"));
  CHECK(has("meshnode_queue_requests{state=\"waiting\"} 2"));
  CHECK(has("meshnode_uptime_seconds 42.5"));
  CHECK(has("meshnode_peers{health=\"healthy\"} 1"));
  CHECK(has("meshnode_peers{health=\"suspect\"} 1"));
  CHECK(has("meshnode_peers{health=\"dead\"} 0"));
  CHECK_FALSE(has("meshnode_peers{health=\"self\"} 1"));
  CHECK(has("meshnode_peer_sent_bytes_total{peer=\"bbbb\"} 1000"));
  CHECK(has("meshnode_peer_received_bytes_total{peer=\"bbbb\"} 2000"));
  CHECK(has("meshnode_peer_packets_lost_total{peer=\"bbbb\"} 3"));
  CHECK(has("meshnode_peer_rtt_seconds{peer=\"bbbb\"} 0.0125"));
  CHECK(has("meshnode_peer_rtt_seconds{peer=\"cccc\"} 0.25"));
  CHECK(text->find("peer=\"aaaa\"") == std::string::npos);  // this node is not its own peer
  CHECK(has("meshnode_models_loaded 1"));
  CHECK(has("meshnode_training_steps_total{run=\"18446744073709551615\"} 3"));
  CHECK(has("meshnode_training_loss{run=\"18446744073709551615\"} 0.5"));

  const auto totals = stats.totals();
  CHECK(totals.requests == 3);
  CHECK(totals.completion_tokens == 12);
  const auto series = stats.series(t0 + 6s);  // interval 0 (0-5 s) is complete
  CHECK(series.requests.back() == 1);
  CHECK(series.tokens.back() == Approx(12));
}

TEST_CASE("mesh json: the snapshot and the serving figures the dashboard draws", "[serving][metrics]") {
  serving_view v;
  v.models = {{"tiny", 256, 1700000000, true, "", 0, false, {}}};
  v.queue = {1, 0};
  v.totals = {3, 10, 20};
  v.series.interval_s = 5;
  v.series.requests = {0, 1};
  v.series.tokens = {0, 20};
  const auto j = json::parse(mesh_json(three_nodes(), v));
  CHECK(j.at("uptime_s") == 42.5);
  REQUIRE(j.at("nodes").size() == 3);
  CHECK(j.at("nodes")[0].at("self") == true);
  CHECK(j.at("nodes")[1].at("rtt_ms") == 12.5);
  CHECK(j.at("nodes")[1].at("bytes_received") == 2000);
  CHECK(j.at("nodes")[1].at("address") == "10.0.0.2:7000");
  CHECK(j.at("nodes")[2].at("health") == "suspect");
  CHECK(j.at("nodes")[2].at("device") == "gpu \xef\xbf\xbd");  // invalid UTF-8 replaced, not thrown
  REQUIRE(j.at("models")[0].at("stages").size() == 2);
  CHECK(j.at("models")[0].at("stages")[1] == json{{"node", "bbbb"}, {"first_layer", 8}, {"end_layer", 16}});
  const auto& t = j.at("trainings")[0];
  CHECK(t.at("run") == "18446744073709551615");
  CHECK(t.at("loss") == json::parse("[2.5, null, 0.5]"));
  CHECK(j.at("serving").at("models")[0].at("id") == "tiny");
  CHECK(j.at("serving").at("queue").at("running") == 1);
  CHECK(j.at("serving").at("totals").at("completion_tokens") == 20);
  CHECK(j.at("serving").at("series").at("tokens") == json::parse("[0, 20]"));
}
