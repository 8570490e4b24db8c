// The NCCL unique-id exchange through a store.
#include "daemon/gpu/uid_rendezvous.h"

#include <catch2/catch.hpp>
#include <thread>

#include "muster/hash_store.h"

namespace muster {
namespace {

const auto kNever = [] { return std::string(); };

TEST_CASE("the key carries job, generation, group and epoch") {
  CHECK(UniqueIdKey("job", 3, "g1", 0) == "muster/job/3/nccl/g1/0/uid");
}

TEST_CASE("rank 0 publishes the id and every other rank reads the same bytes") {
  HashStore store;
  const std::string key = UniqueIdKey("j", 0, "world", 0);
  std::string id(128, '\0');
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7);
  std::vector<absl::StatusOr<std::string>> got(3, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 2; r >= 0; --r) {  // readers start first
    ranks.emplace_back([&, r] {
      got[r] = ExchangeUniqueId(
          store, key, r == 0, 128, [&]() -> absl::StatusOr<std::string> { return id; },
          absl::Now() + absl::Seconds(10), kNever);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    REQUIRE(got[r].ok());
    CHECK(*got[r] == id);
  }
}

TEST_CASE("a rank 0 that never publishes is a DeadlineExceeded naming the key") {
  HashStore store;
  auto got = ExchangeUniqueId(
      store, "muster/j/0/nccl/g/0/uid", false, 128,
      []() -> absl::StatusOr<std::string> { return std::string(128, 'a'); },
      absl::Now() + absl::Milliseconds(300), kNever);
  CHECK(absl::IsDeadlineExceeded(got.status()));
  CHECK(got.status().message().find("muster/j/0/nccl/g/0/uid") != std::string::npos);
}

TEST_CASE("a broken group stops the wait at once with its reason") {
  HashStore store;
  absl::Time start = absl::Now();
  auto got = ExchangeUniqueId(
      store, "k", false, 128, []() -> absl::StatusOr<std::string> { return std::string(); },
      absl::Now() + absl::Seconds(30), [] { return std::string("rank 2 (host a, pid 7) died"); });
  CHECK(absl::IsAborted(got.status()));
  CHECK(got.status().message() == "rank 2 (host a, pid 7) died");
  CHECK(absl::Now() - start < absl::Seconds(5));
}

TEST_CASE("ids of the wrong size are rejected on both sides") {
  HashStore store;
  auto bad_root = ExchangeUniqueId(
      store, "k", true, 128, []() -> absl::StatusOr<std::string> { return std::string(5, 'a'); },
      absl::Now() + absl::Seconds(1), kNever);
  CHECK(absl::IsInternal(bad_root.status()));
  REQUIRE(store.Set("k2", "short").ok());
  auto bad_reader = ExchangeUniqueId(
      store, "k2", false, 128, []() -> absl::StatusOr<std::string> { return std::string(); },
      absl::Now() + absl::Seconds(1), kNever);
  CHECK(absl::IsDataLoss(bad_reader.status()));
  CHECK(bad_reader.status().message().find("5 bytes") != std::string::npos);
}

}  // namespace
}  // namespace muster
