#include "common/flags.h"

#include <catch2/catch.hpp>

namespace muster {
namespace {

TEST_CASE("FlagSet parses dashed flags, both value spellings, bools and positionals") {
  std::string socket = "/default";
  int64_t port = 29510;
  double grace = 2;
  bool json = false;
  FlagSet flags("prog", "usage");
  flags.AddString("socket", &socket, "the socket");
  flags.AddInt("grpc-port", &port, "port");
  flags.AddDouble("grace", &grace, "grace");
  flags.AddBool("json", &json, "json");
  auto rest = flags.Parse({"status", "--socket", "/s", "--grpc-port=0", "--json", "--grace=0.5",
                           "x", "--", "--not-a-flag"});
  REQUIRE(rest.ok());
  CHECK(socket == "/s");
  CHECK(port == 0);
  CHECK(json);
  CHECK(grace == 0.5);
  CHECK(*rest == std::vector<std::string>{"status", "x", "--not-a-flag"});
}

TEST_CASE("FlagSet names the bad flag") {
  int64_t port = 1;
  bool json = true;
  FlagSet flags("prog", "usage");
  flags.AddInt("grpc-port", &port, "port");
  flags.AddBool("json", &json, "json");
  CHECK(flags.Parse({"--nope"}).status().message() == "unknown flag --nope (see prog --help)");
  CHECK(flags.Parse({"--grpc-port=abc"}).status().message() ==
        "flag --grpc-port: cannot parse 'abc'");
  CHECK(flags.Parse({"--grpc-port"}).status().message() == "flag --grpc-port needs a value");
  CHECK(flags.Parse({"--json=false"}).ok());
  CHECK_FALSE(json);
}

TEST_CASE("FlagSet --help lists every flag with its default") {
  std::string s = "d";
  FlagSet flags("prog", "prog: does things");
  flags.AddString("socket", &s, "where");
  REQUIRE(flags.Parse({"--help"}).ok());
  CHECK(flags.help_requested());
  std::string usage = flags.Usage();
  CHECK(usage.find("prog: does things") == 0);
  CHECK(usage.find("--socket VALUE") != std::string::npos);
  CHECK(usage.find("(default: \"d\")") != std::string::npos);
}

TEST_CASE("FlagSet in torchrun style: underscores, the program's own flags, aliases, environment") {
  int64_t nproc = 1;
  bool module = false;
  std::string redirects = "0";
  std::string role = "default";
  FlagSet flags("prog", "usage");
  flags.set_underscores_as_dashes(true);
  flags.set_stop_at_first_positional(true);
  flags.set_env_prefix("PET_TEST_");
  flags.AddInt("nproc-per-node", &nproc, "n");
  flags.AddBool("module", &module, "m");
  flags.AddString("redirects", &redirects, "r");
  flags.AddString("role", &role, "role");
  flags.AddAlias('m', "module");
  flags.AddAlias('r', "redirects");
  ::setenv("PET_TEST_ROLE", "trainer", 1);
  auto rest = flags.Parse(
      {"--nproc_per_node=4", "-r", "3", "-m", "pkg.train", "--nproc-per-node", "9", "-m"});
  ::unsetenv("PET_TEST_ROLE");
  REQUIRE(rest.ok());
  CHECK(nproc == 4);  // the second --nproc-per-node belongs to the program
  CHECK(module);
  CHECK(redirects == "3");
  CHECK(role == "trainer");
  CHECK(flags.IsSet("role"));
  CHECK(flags.IsSet("nproc-per-node"));
  CHECK(*rest == std::vector<std::string>{"pkg.train", "--nproc-per-node", "9", "-m"});
  CHECK(flags.Parse({"-x"}).status().message() == "unknown flag -x (see prog --help)");
  CHECK_FALSE(flags.IsSet("role"));
  ::setenv("PET_TEST_MODULE", "yes", 1);
  CHECK(flags.Parse({}).status().message() == "$PET_TEST_MODULE: cannot parse 'yes' (want 0 or 1)");
  ::unsetenv("PET_TEST_MODULE");
  CHECK(flags.Usage().find("-m, --module") != std::string::npos);
}

TEST_CASE("FlagSet has --version unless the program registers its own") {
  FlagSet flags("prog", "usage");
  auto rest = flags.Parse({"--version", "ignored"});
  REQUIRE(rest.ok());
  CHECK(flags.version_requested());
  CHECK(rest->empty());
  CHECK(flags.Usage().find("  --version\n") != std::string::npos);

  bool mine = false;
  FlagSet own("prog", "usage");
  own.AddBool("version", &mine, "mine");
  REQUIRE(own.Parse({"--version"}).ok());
  CHECK(mine);
  CHECK_FALSE(own.version_requested());
}

}  // namespace
}  // namespace muster
