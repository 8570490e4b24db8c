// InitOptionsFromEnv: the environment a launcher gives a rank.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "muster/world.h"

namespace muster {
namespace {

void SetRankEnv() {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  ::unsetenv("MUSTER_STORE_TOKEN");
  ::unsetenv("MUSTER_STORE_TOKEN_FILE");
}

TEST_CASE("the store token comes from MUSTER_STORE_TOKEN, else from MUSTER_STORE_TOKEN_FILE") {
  SetRankEnv();
  std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  std::string path = dir + "/store.token";
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs("from-the-file\n", f);
  std::fclose(f);
  ::chmod(path.c_str(), 0600);

  ::setenv("MUSTER_STORE_TOKEN_FILE", path.c_str(), 1);
  auto from_file = InitOptionsFromEnv();
  REQUIRE(from_file.ok());
  CHECK(from_file->store_token == "from-the-file");

  ::setenv("MUSTER_STORE_TOKEN", "from-the-variable", 1);
  auto from_env = InitOptionsFromEnv();
  REQUIRE(from_env.ok());
  CHECK(from_env->store_token == "from-the-variable");

  ::unsetenv("MUSTER_STORE_TOKEN");
  ::setenv("MUSTER_STORE_TOKEN_FILE", "/nonexistent/token", 1);
  auto missing = InitOptionsFromEnv();
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(missing.status().message(), "/nonexistent/token"));
}

}  // namespace
}  // namespace muster
