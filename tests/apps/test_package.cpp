// The installed CMake package: installs this build into a prefix, builds examples against it
// with a fresh CMake (find_package(meshnode), nothing of this tree), and runs the example against
// a real meshnode. Fails when any step fails, with that step's output.
#include <array>
#include <cstdio>
#include <cstdlib>

#include "node_harness.hpp"
#include "run_command.hpp"

using namespace mesh::test;

namespace {

std::string quoted(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

}  // namespace

TEST_CASE("the installed package builds examples, which runs a job on a meshnode", "[apps][package]") {
  // A fixed place under the build tree rather than a fresh temporary folder: the same paths on
  // every run let ccache serve the example's compilation.
  const std::filesystem::path root = std::filesystem::path(MESH_BINARY_DIR) / "package-test";
  std::filesystem::remove_all(root);
  const auto prefix = root / "prefix", example = root / "example";
  const std::string cmake = quoted(MESH_CMAKE_COMMAND);

  auto step = [](const std::string& what, const std::string& command) {
    INFO(what << ": " << command);
    const auto r = run_command(command);
    INFO(r.output);
    REQUIRE(r.status == 0);
    return r;
  };
  step("install", cmake + " --install " + quoted(MESH_BINARY_DIR) + " --prefix " + quoted(prefix));
  REQUIRE(std::filesystem::exists(prefix / "lib/cmake/meshnode/meshnodeConfig.cmake"));
  REQUIRE(std::filesystem::exists(prefix / "include/meshnode/client/client.hpp"));
  step("configure the example", cmake + " -S " + quoted(std::filesystem::path(MESH_SOURCE_DIR) / "examples") + " -B " +
                                    quoted(example) + " -G Ninja -DCMAKE_PREFIX_PATH=" + quoted(prefix));
  step("build the example", cmake + " --build " + quoted(example) + " -j2");

  temp_dir tmp;
  node_process node(tmp.path / "n");
  const std::string ep = node.endpoint();
  // The libraries may carry sanitizers (MESH_SANITIZE): the same leak suppressions as the tests.
  const char* lsan = std::getenv("LSAN_OPTIONS");
  const std::string env = lsan ? "" : "LSAN_OPTIONS=suppressions=" + std::string(MESH_SOURCE_DIR) + "/tests/lsan.supp ";
  const auto r = step("run the example", env + quoted(example / "mesh_example") + " " + ep + " --state-dir " + quoted(tmp.path / "n"));
  CHECK(r.output.find("ok\n") != std::string::npos);
  INFO("node log:\n" << node.log());
}
