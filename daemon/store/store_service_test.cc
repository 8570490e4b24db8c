// StoreService over a real StoreServer: reads of a key without a value are
// NOT_FOUND; with a durability log, after a failed log flush, only the gRPC
// calls whose result depended on it fail.
#include "daemon/store/store_service.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

// A StoreService over `server`, served on a loopback port, and a stub to it.
struct ServedStore {
  explicit ServedStore(StoreServer* server, const StoreServerOptions& options)
      : service(server, options.limits, /*access=*/nullptr) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    grpc_server = builder.BuildAndStart();
    REQUIRE(grpc_server != nullptr);
    stub = v1::Store::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  ~ServedStore() { grpc_server->Shutdown(); }
  StoreService service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<v1::Store::Stub> stub;
};

TEST_CASE("Get and MultiGet of a key that holds only a queue answer NOT_FOUND, naming it") {
  StoreServerOptions options;
  options.listen_address = "127.0.0.1";
  options.port = 0;
  auto server = StoreServer::Start(options);
  REQUIRE(server.ok());
  ServedStore served(server->get(), options);
  std::atomic<bool> pushed{false};
  REQUIRE((*server)->Post([&](StoreServer::Loop& loop) {
    REQUIRE(loop.kv().QueuePush("q", "item").ok());
    pushed = true;
  }));
  while (!pushed.load()) absl::SleepFor(absl::Milliseconds(1));
  {
    grpc::ClientContext ctx;
    v1::GetRequest req;
    req.set_key("q");
    v1::GetResponse resp;
    grpc::Status got = served.stub->Get(&ctx, req, &resp);
    CHECK(got.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK_THAT(got.error_message(), Catch::Contains("store key 'q' has no value"));
  }
  {
    grpc::ClientContext ctx;
    v1::MultiGetRequest req;
    req.add_keys("q");
    v1::MultiGetResponse resp;
    grpc::Status got = served.stub->MultiGet(&ctx, req, &resp);
    CHECK(got.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(resp.values_size() == 0);
  }
  (*server)->Stop();
}

TEST_CASE(
    "a failed log flush fails the gRPC calls that depended on it, not reads of durable keys") {
  char dir[] = "/tmp/muster_service_flush_test_XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  StoreServerOptions options;
  options.listen_address = "127.0.0.1";
  options.port = 0;
  options.state_dir = dir;
  auto server = StoreServer::Start(options);
  REQUIRE(server.ok());
  ServedStore served(server->get(), options);
  auto& stub = served.stub;

  auto set = [&](const std::string& key) {
    grpc::ClientContext ctx;
    v1::SetRequest req;
    req.set_key(key);
    req.set_value(key + "-value");
    v1::SetResponse resp;
    return stub->Set(&ctx, req, &resp);
  };
  REQUIRE(set("durable").ok());  // in the log
  v1::NumKeysResponse num_keys_before;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->NumKeys(&ctx, v1::NumKeysRequest(), &num_keys_before).ok());
  }

  // RLIMIT_FSIZE at the log's size makes its next write fail (EFBIG; with
  // SIGXFSZ ignored it is an error, not a signal).
  struct stat st {};
  REQUIRE(::stat((std::string(dir) + "/store.log").c_str(), &st) == 0);
  ::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  rlimit tight = old;
  tight.rlim_cur = st.st_size;
  // Hold the loop so every call below is posted, and runs, in one
  // iteration, in the order sent (each is sent once the one before is in).
  std::atomic<bool> holding{false};
  REQUIRE((*server)->Post([&](StoreServer::Loop&) {
    holding = true;
    absl::SleepFor(absl::Milliseconds(1500));
  }));
  while (!holding.load()) absl::SleepFor(absl::Milliseconds(1));
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &tight) == 0);

  grpc::Status wrote, read_durable, read_fresh, counted, checked_durable;
  v1::GetResponse durable_value;
  v1::NumKeysResponse num_keys;
  v1::CheckResponse check;
  std::vector<std::thread> calls;
  calls.emplace_back([&] { wrote = set("fresh"); });
  absl::SleepFor(absl::Milliseconds(200));
  calls.emplace_back([&] {
    grpc::ClientContext ctx;
    v1::GetRequest req;
    req.set_key("durable");
    read_durable = stub->Get(&ctx, req, &durable_value);
  });
  calls.emplace_back([&] {
    grpc::ClientContext ctx;
    v1::CheckRequest req;
    req.add_keys("durable");
    checked_durable = stub->Check(&ctx, req, &check);
  });
  absl::SleepFor(absl::Milliseconds(200));
  calls.emplace_back([&] {
    grpc::ClientContext ctx;
    v1::GetRequest req;
    req.set_key("fresh");  // present only through the unlogged SET
    v1::GetResponse resp;
    req.mutable_timeout()->set_millis(200);
    read_fresh = stub->Get(&ctx, req, &resp);
  });
  calls.emplace_back([&] {
    grpc::ClientContext ctx;
    counted = stub->NumKeys(&ctx, v1::NumKeysRequest(), &num_keys);
  });
  for (std::thread& t : calls) t.join();
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);

  // The write and every read that saw it were rolled back with the batch.
  CHECK(wrote.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(read_fresh.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(counted.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK_THAT(wrote.error_message(), Catch::Contains("durability log"));
  // Reads of durable state keep their answers.
  CHECK(read_durable.ok());
  CHECK(durable_value.value() == "durable-value");
  CHECK(checked_durable.ok());
  CHECK(check.all_present());
  CHECK_FALSE((*server)->stats().log_error.empty());
  {
    grpc::ClientContext ctx;
    v1::NumKeysResponse after;
    REQUIRE(stub->NumKeys(&ctx, v1::NumKeysRequest(), &after).ok());
    CHECK(after.num_keys() == num_keys_before.num_keys());  // "fresh" is gone
  }
  served.grpc_server->Shutdown();
  (*server)->Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace muster
