// WriteDump writes a dump only the job's user reads, refusing a symlink in
// its way; PruneDumps keeps the newest dumps that fit, removes the oldest
// first, and leaves other files alone.
#include "daemon/registry/dump_files.h"

#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace muster {
namespace {

void Write(const std::string& path, size_t bytes, int age_s) {
  std::ofstream(path) << std::string(bytes, 'x');
  timeval times[2];
  ::gettimeofday(&times[0], nullptr);
  times[0].tv_sec -= age_s;
  times[1] = times[0];
  REQUIRE(::utimes(path.c_str(), times) == 0);
}

TEST_CASE("the oldest dumps go until the rest fit; other files stay") {
  char tmpl[] = "/tmp/muster-dumps-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  Write(dir + "/trace-a-e0-1.json", 1000, 30);  // oldest
  Write(dir + "/trace-b-e0-2.json", 1000, 20);
  Write(dir + "/trace-c-e0-3.json", 1000, 10);  // newest
  Write(dir + "/notes.txt", 5000, 40);          // not a dump
  CHECK(PruneDumps(dir, 10000) == 0);
  CHECK(PruneDumps(dir, 2500) == 1);
  CHECK_FALSE(std::filesystem::exists(dir + "/trace-a-e0-1.json"));
  CHECK(std::filesystem::exists(dir + "/trace-b-e0-2.json"));
  CHECK(PruneDumps(dir, 0) == 2);
  CHECK(std::filesystem::exists(dir + "/notes.txt"));
  CHECK(PruneDumps(dir + "/absent", 0) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a dump is the job's user's alone, and a symlink in its way is not followed") {
  char tmpl[] = "/tmp/muster-dumps-XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  const std::string dir = root + "/dumps";
  const std::string path = dir + "/trace-job-g-e0-1.json";
  REQUIRE(WriteDump(dir, path, "{}", 12345).ok());
  struct stat st;
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0711);
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  if (::geteuid() == 0) CHECK(st.st_uid == 12345u);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  // Someone who could write the folder left a symlink where the temporary
  // file goes: the dump fails instead of writing through it.
  const std::string victim = root + "/victim";
  std::ofstream(victim) << "keep";
  const std::string second = dir + "/trace-job-g-e0-2.json";
  REQUIRE(::symlink(victim.c_str(), (second + ".tmp").c_str()) == 0);
  absl::Status s = WriteDump(dir, second, "overwritten?", -1);
  CHECK_FALSE(s.ok());
  std::ifstream in(victim);
  std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(kept == "keep");
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace muster
