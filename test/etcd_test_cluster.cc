#include "test/etcd_test_cluster.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace muster::testing {

const TestEtcdCluster& TestEtcdCluster::Get(int members) {
  static TestEtcdCluster* cluster = [members] {
    auto* c = new TestEtcdCluster;
    const char* tmp = std::getenv("TEST_TMPDIR");
    c->dir = absl::StrCat(tmp ? tmp : "/tmp", "/etcd-", ::getpid());
    if (::access("/usr/bin/etcd", X_OK) != 0) return c;
    std::string start =
        absl::StrCat("tools/etcd_cluster.sh start ", c->dir, " ", members, " >/dev/null");
    if (std::system(start.c_str()) != 0) return c;
    std::FILE* f = std::fopen((c->dir + "/endpoints").c_str(), "r");
    char line[4096] = {};
    if (f == nullptr || std::fgets(line, sizeof(line), f) == nullptr) {
      if (f != nullptr) std::fclose(f);
      return c;
    }
    std::fclose(f);
    std::string urls(line);
    while (!urls.empty() && urls.back() == '\n') urls.pop_back();
    c->endpoints = absl::StrSplit(urls, ',', absl::SkipEmpty());
    c->available = !c->endpoints.empty();
    std::atexit([] {
      std::string stop = absl::StrCat("tools/etcd_cluster.sh stop ", cluster->dir);
      (void)std::system(stop.c_str());
    });
    return c;
  }();
  return *cluster;
}

std::string FreshEtcdPrefix(absl::string_view label) {
  static std::atomic<int> n{0};
  return absl::StrCat("/", label, "-", ::getpid(), "-", n++, "/");
}

}  // namespace muster::testing
