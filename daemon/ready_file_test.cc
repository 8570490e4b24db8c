#include "daemon/ready_file.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "common/json.h"

namespace muster {
namespace {

TEST_CASE("the ready file holds exactly the documented JSON fields") {
  char dir[] = "/tmp/muster-ready-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  std::string path = std::string(dir) + "/ready.json";
  ReadyInfo info{42, 29510, 29500, "/run/muster/musterd.sock", "9.9"};
  REQUIRE(WriteReadyFile(path, info).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = ParseFlatJsonObject(text.str());
  REQUIRE(parsed.ok());
  CHECK(parsed->size() == 5);
  CHECK(parsed->at("pid") == "42");
  CHECK(parsed->at("grpc_port") == "29510");
  CHECK(parsed->at("store_port") == "29500");
  CHECK(parsed->at("socket") == "/run/muster/musterd.sock");
  CHECK(parsed->at("version") == "9.9");
  ::unlink(path.c_str());
  ::rmdir(dir);
}

TEST_CASE("an unwritable ready file is an error naming the path") {
  auto status = WriteReadyFile("/nonexistent-dir/ready.json", ReadyInfo{});
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(status.message()).find("/nonexistent-dir/ready.json") != std::string::npos);
}

}  // namespace
}  // namespace muster
