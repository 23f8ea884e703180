#include <catch2/catch.hpp>

#include "discovery/txt_record.hpp"
#include "test_util.hpp"

using namespace mesh::discovery;
using mesh::error_code;

TEST_CASE("txt: encode then decode gives the announcement back", "[discovery][txt]") {
  announcement a = test::make_announcement('3', 51820);
  a.device_summary = "NVIDIA H100 80GB HBM3, 2 GPUs";
  auto entries = encode_txt(a);
  REQUIRE(entries);
  CHECK(entries->front() == "txtvers=1");
  auto wire = txt_to_wire(*entries);
  REQUIRE(wire);
  auto back_entries = txt_from_wire(*wire);
  REQUIRE(back_entries);
  CHECK(*back_entries == *entries);
  auto back = decode_txt(*back_entries);
  REQUIRE(back);
  CHECK(back->node_id == a.node_id);
  CHECK(back->mesh_id == a.mesh_id);
  CHECK(back->protocol_version == 1);
  CHECK(back->port == 51820);
  CHECK(back->device_summary == a.device_summary);
}

TEST_CASE("txt: invalid own announcements are refused before announcing", "[discovery][txt]") {
  announcement a = test::make_announcement('a');
  a.node_id = std::string(64, 'A');  // uppercase hex is not the canonical form
  CHECK(!encode_txt(a));
  a = test::make_announcement('a');
  a.node_id.pop_back();
  CHECK(!encode_txt(a));
  a = test::make_announcement('a');
  a.mesh_id = "has space";
  CHECK(!encode_txt(a));
  a = test::make_announcement('a');
  a.mesh_id = "";
  CHECK(!encode_txt(a));
  a = test::make_announcement('a');
  a.port = 0;
  CHECK(!encode_txt(a));
  a = test::make_announcement('a');
  a.device_summary = std::string(200, 'x');
  CHECK(!encode_txt(a));
  a.device_summary = sanitize_device_summary(std::string("GPU\n\x01\xff", 6) + std::string(200, 'x'));
  CHECK(a.device_summary.substr(0, 6) == "GPU???");
  CHECK(a.device_summary.size() == max_device_summary_size);
  CHECK(encode_txt(a));
}

TEST_CASE("txt: hostile records are rejected with a reason", "[discovery][txt]") {
  const std::string id = "id=" + test::node_id('b');
  auto reason = [](const std::vector<std::string>& e) {
    auto r = decode_txt(e);
    REQUIRE(!r);
    return r.error();
  };
  CHECK(reason({"mesh=m", "v=1", "port=9"}).message.find("'id'") != std::string::npos);
  CHECK(reason({id, "v=1", "port=9"}).message.find("'mesh'") != std::string::npos);
  CHECK(reason({id, "mesh=m", "port=9"}).message.find("'v'") != std::string::npos);
  CHECK(reason({id, "mesh=m", "v=1"}).message.find("'port'") != std::string::npos);
  CHECK(reason({"id=xyz", "mesh=m", "v=1", "port=9"}).message.find("node id") != std::string::npos);
  CHECK(reason({"id=" + std::string(64, 'B'), "mesh=m", "v=1", "port=9"}).code == error_code::decode_error);
  CHECK(reason({id, "mesh=m", "v=1", "port=0"}).message.find("port") != std::string::npos);
  CHECK(reason({id, "mesh=m", "v=1", "port=65536"}).message.find("port") != std::string::npos);
  CHECK(reason({id, "mesh=m", "v=1", "port=+80"}).message.find("port") != std::string::npos);
  CHECK(reason({id, "mesh=m", "v=01", "port=80"}).message.find("version") != std::string::npos);
  CHECK(reason({id, "mesh=m", "v=99999999999", "port=80"}).message.find("version") != std::string::npos);
  CHECK(reason({id, "mesh=m\x01", "v=1", "port=80"}).message.find("mesh id") != std::string::npos);
  CHECK(reason({id, "mesh=m", "v=1", "port=80", "dev=\x7f"}).message.find("device") != std::string::npos);
  CHECK(reason({"txtvers=2", id, "mesh=m", "v=1", "port=80"}).code == error_code::version_mismatch);
  CHECK(reason({id, "mesh=" + std::string(300, 'm'), "v=1", "port=80"}).code == error_code::limit_exceeded);
  std::vector<std::string> many(40, "x=1");
  CHECK(reason(many).code == error_code::limit_exceeded);
  std::vector<std::string> big(8, "pad=" + std::string(200, 'p'));
  big.insert(big.begin(), {id, "mesh=m", "v=1", "port=80"});
  CHECK(reason(big).message.find("oversized") != std::string::npos);
}

TEST_CASE("txt: RFC 6763 rules: first key wins, case-insensitive keys, unknown keys ignored",
          "[discovery][txt]") {
  auto a = decode_txt({"ID=" + test::node_id('c'), "id=" + test::node_id('d'), "Mesh=m1", "v=7",
                       "port=1234", "future=whatever", "flag", "=novalue"});
  REQUIRE(a);
  CHECK(a->node_id == test::node_id('c'));
  CHECK(a->mesh_id == "m1");
  CHECK(a->protocol_version == 7);
  CHECK(a->device_summary.empty());
}

TEST_CASE("txt: wire form rejects truncation, empty strings and oversize", "[discovery][txt]") {
  const std::vector<uint8_t> empty_record{0};
  auto none = txt_from_wire(empty_record);
  REQUIRE(none);
  CHECK(none->empty());
  const std::vector<uint8_t> truncated{5, 'a', 'b'};
  CHECK(!txt_from_wire(truncated));
  const std::vector<uint8_t> inner_zero{1, 'a', 0, 1, 'b'};
  CHECK(!txt_from_wire(inner_zero));
  const std::vector<uint8_t> huge(2000, 3);
  CHECK(txt_from_wire(huge).error().code == error_code::limit_exceeded);
  CHECK(!txt_to_wire({std::string(256, 'x')}));
  CHECK(!txt_to_wire({""}));
  auto zero = txt_to_wire({});
  REQUIRE(zero);
  CHECK(*zero == empty_record);
}
