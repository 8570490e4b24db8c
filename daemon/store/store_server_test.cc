// StoreServer's memory accounting: what each connection is charged, and that
// every path gives it back (reply sent, wait satisfied or cancelled,
// connection closed).
#include "daemon/store/store_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/store_wire.h"
#include "muster/tcp_store.h"

namespace muster {
namespace {

class Raw {
 public:
  explicit Raw(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  }
  ~Raw() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void Send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      off += n;
    }
  }
  // Reads exactly `n` bytes (5 s at most).
  std::string Read(size_t n) {
    std::string out;
    char buf[65536];
    while (out.size() < n) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) break;
      ssize_t got = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, got);
    }
    return out;
  }

 private:
  int fd_ = -1;
};

bool Eventually(const std::function<bool()>& pred) {
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

std::string Set113(const std::string& key, const std::string& value) {
  std::string s;
  wire::PutU8(&s, 0);
  wire::PutBytes(&s, key);
  wire::PutBytes(&s, value);
  return s;
}

// A server on 127.0.0.1, on a free port.
StoreServerOptions Loopback() {
  StoreServerOptions options;
  options.listen_address = "127.0.0.1";
  options.port = 0;
  return options;
}

// Idle connections hold (almost) nothing.
constexpr uint64_t kIdle = 4096;

TEST_CASE("memory charged for a partial request, a pending reply and a parked wait is given back") {
  StoreServerOptions options = Loopback();
  auto server = StoreServer::Start(options);
  REQUIRE(server.ok());
  StoreServer& s = **server;
  auto memory = [&] { return s.stats().memory_bytes; };

  SECTION("a partial request is charged what it declared; completing or closing releases it") {
    Raw a(s.port());
    std::string set = Set113("k", std::string(1 << 20, 'v'));
    a.Send(set.substr(0, 100));
    REQUIRE(Eventually([&] { return memory() >= (1u << 20); }));
    a.Send(set.substr(100));
    REQUIRE(Eventually([&] { return memory() < kIdle; }));
    Raw b(s.port());
    b.Send(set.substr(0, 100));
    REQUIRE(Eventually([&] { return memory() >= (1u << 20); }));
    b.Close();
    CHECK(Eventually([&] { return memory() < kIdle; }));
  }

  SECTION("an unsent reply is charged until the client reads it") {
    Raw a(s.port());
    a.Send(Set113("big", std::string(8 << 20, 'b')));
    REQUIRE(Eventually([&] { return s.stats().keys == 1; }));
    std::string get;
    wire::PutU8(&get, *wire::CommandByte(wire::Dialect::kTorch113, wire::Op::kGet));
    wire::PutBytes(&get, "big");
    a.Send(get);
    REQUIRE(Eventually([&] { return memory() >= (1u << 20); }));  // not read yet
    CHECK(a.Read(8 + (8 << 20)).size() == 8 + (8u << 20));
    CHECK(Eventually([&] { return memory() < kIdle; }));
  }

  SECTION("a parked wait is charged until satisfied, cancelled or its connection closes") {
    std::string wait;
    wire::PutU8(&wait, *wire::CommandByte(wire::Dialect::kTorch113, wire::Op::kWait));
    wire::PutKeyList(&wait, {"w1", "w2"});
    Raw a(s.port());
    a.Send(wait);
    REQUIRE(Eventually([&] { return memory() >= 2 * 128; }));
    Raw writer(s.port());
    writer.Send(Set113("w1", "x") + Set113("w2", "x"));
    CHECK(a.Read(1) == std::string(1, wire::kStopWaiting));
    CHECK(Eventually([&] { return memory() < kIdle; }));

    // 2.x CANCEL_WAIT.
    Raw b(s.port());
    std::string validate;
    validate.push_back(0);
    wire::PutU32(&validate, wire::kValidateMagic);
    std::string wait2;
    wire::PutU8(&wait2, *wire::CommandByte(wire::Dialect::kTorch2, wire::Op::kWait));
    wire::PutKeyList(&wait2, {"never"});
    b.Send(validate + wait2);
    REQUIRE(Eventually([&] { return memory() >= 128; }));
    b.Send(std::string(1, *wire::CommandByte(wire::Dialect::kTorch2, wire::Op::kCancelWait)));
    CHECK(b.Read(1) == std::string(1, wire::kWaitCanceled));
    CHECK(Eventually([&] { return memory() < kIdle; }));

    // Closed while parked.
    Raw d(s.port());
    std::string wait3;
    wire::PutU8(&wait3, *wire::CommandByte(wire::Dialect::kTorch113, wire::Op::kWait));
    wire::PutKeyList(&wait3, {"absent"});
    d.Send(wait3);
    REQUIRE(Eventually([&] { return memory() >= 128; }));
    d.Close();
    CHECK(Eventually([&] { return memory() < kIdle; }));
  }

  SECTION("a reply over --store-max-reply-bytes fails without being built") {
    server->reset();
    options.max_reply_bytes = 1 << 20;
    auto small = StoreServer::Start(options);
    REQUIRE(small.ok());
    Raw a((*small)->port());
    a.Send(Set113("v", std::string(600 << 10, 'x')));
    std::string multi;
    wire::PutU8(&multi, *wire::CommandByte(wire::Dialect::kTorch113, wire::Op::kMultiGet));
    wire::PutKeyList(&multi, {"v", "v"});
    a.Send(multi);
    CHECK(a.Read(1).empty());  // closed, nothing sent
    CHECK((*small)->stats().refused_for_memory == 1);
    CHECK(Eventually([&] { return (*small)->stats().memory_bytes < kIdle; }));
  }
}

TEST_CASE("silent connections holding partial requests cannot keep the budget from others") {
  // Before: ~150 connections that declared large requests and went silent
  // held 7/8 of the budget for good; every other request over 64 KiB was
  // refused. A large request must now arrive at a minimum pace.
  StoreServerOptions options = Loopback();
  options.memory_budget_bytes = 8 << 20;
  options.max_connection_bytes = 2 << 20;
  options.request_grace = absl::Milliseconds(500);
  options.min_request_rate = 4 << 20;  // bytes a second
  auto server = StoreServer::Start(options);
  REQUIRE(server.ok());
  StoreServer& s = **server;
  const std::string big = Set113("big", std::string(1 << 20, 'v'));
  std::vector<std::unique_ptr<Raw>> silent;
  for (int i = 0; i < 6; ++i) {
    silent.push_back(std::make_unique<Raw>(s.port()));
    silent.back()->Send(big.substr(0, 100));  // declares 1 MiB, then nothing
  }
  REQUIRE(Eventually([&] { return s.stats().memory_bytes >= (6u << 20); }));
  // The budget's large part is full now: a client's 1 MiB request is refused.
  {
    Raw refused(s.port());
    refused.Send(big.substr(0, 100));
    CHECK(refused.Read(1).empty());  // closed
  }
  // Within the grace plus 1 MiB at 4 MiB/s, the silent ones are closed.
  for (auto& raw : silent) CHECK(raw->Read(1).empty());
  CHECK(Eventually([&] { return s.stats().memory_bytes < kIdle; }));
  // A client that sends at its pace is served, in pieces over ~0.2 s.
  Raw steady(s.port());
  for (size_t off = 0; off < big.size(); off += big.size() / 4) {
    steady.Send(big.substr(off, big.size() / 4));
    absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(Eventually([&] { return s.stats().keys == 1; }));
  CHECK(s.stats().refused_for_memory == 7);
}

std::string Get113(const std::string& key) {
  std::string s;
  wire::PutU8(&s, 2);
  wire::PutBytes(&s, key);
  return s;
}

std::string Value(const std::string& v) {
  std::string s;
  wire::PutBytes(&s, v);
  return s;
}

TEST_CASE(
    "a failed log flush fails its writers but not readers of durable keys in that iteration") {
  char dir[] = "/tmp/muster_flush_test_XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  StoreServerOptions options = Loopback();
  options.state_dir = dir;
  auto server = StoreServer::Start(options);
  REQUIRE(server.ok());
  int port = (*server)->port();
  Raw writer(port), reader(port);
  writer.Send(Set113("durable", "d") + Get113("durable"));
  REQUIRE(writer.Read(9) == Value("d"));  // the SET is in the log

  // RLIMIT_FSIZE at the log's size makes its next write fail (EFBIG; with
  // SIGXFSZ ignored it is an error, not a signal).
  struct stat st {};
  REQUIRE(::stat((std::string(dir) + "/store.log").c_str(), &st) == 0);
  ::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  rlimit tight = old;
  tight.rlim_cur = st.st_size;
  // Hold the loop so both clients' requests are handled in one iteration.
  std::atomic<bool> holding{false};
  REQUIRE((*server)->Post([&](StoreServer::Loop&) {
    holding = true;
    absl::SleepFor(absl::Milliseconds(300));
  }));
  REQUIRE(Eventually([&] { return holding.load(); }));
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &tight) == 0);
  writer.Send(Set113("fresh", "f") + Get113("fresh"));
  reader.Send(Get113("durable"));
  // The reader's reply read only durable state: it goes out. The writer's
  // write was rolled back: its connection is closed (torch clients raise).
  std::string read = reader.Read(9);
  std::string wrote = writer.Read(1);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  CHECK(read == Value("d"));
  CHECK(wrote.empty());
  CHECK_FALSE((*server)->stats().log_error.empty());
  // The reader's connection is still usable, and the rolled-back key is
  // absent (a missing key reads as an empty value).
  reader.Send(Get113("fresh"));
  CHECK(reader.Read(8) == Value(""));
  // Once the log can be written again, writes resume.
  CHECK(Eventually([&] { return (*server)->stats().log_error.empty(); }));
  (*server)->Stop();
  std::filesystem::remove_all(dir);
}

// The loop's own CPU per iteration is what the server controls: none may
// pass 10 ms (Stats::slow_iterations counts those), whatever one request
// asks of it.
std::unique_ptr<TcpStore> Native(int port) {
  TcpStoreOptions o;
  o.port = port;
  auto store = TcpStore::Connect(o);
  REQUIRE(store.ok());
  return std::move(*store);
}

// What one loop iteration may take in these tests: 10 ms of CPU in an
// optimized build (2.6 ms measured for the WAIT_FOR below). Unoptimized
// builds (CI's fastbuild) run the missing-key count's 131,072 hash lookups
// and a 16 MiB value's copies about 10x slower (40 ms and 3 iterations over
// 10 ms measured), so there the bound is 10x too.
#ifdef NDEBUG
constexpr absl::Duration kIterationBound = absl::Milliseconds(10);
#else
constexpr absl::Duration kIterationBound = absl::Milliseconds(100);
#endif

TEST_CASE("a timed-out native WAIT_FOR of 131072 keys names a few and counts them in bounded CPU") {
  StoreServerOptions options = Loopback();
  auto server = StoreServer::Start(options);
  REQUIRE(server.ok());
  std::vector<std::string> keys;
  for (int i = 0; i < 131072; ++i) keys.push_back(absl::StrCat("missing/", i));
  auto client = Native((*server)->port());
  REQUIRE(client->Set("missing/7", "present").ok());
  const uint64_t slow_before = (*server)->stats().slow_iterations;
  absl::Status waited = client->Wait(keys, absl::Milliseconds(300));
  StoreServer::Stats stats = (*server)->stats();
  std::printf("WAIT_FOR of 131072 keys timed out: message %zu bytes, max loop iteration %s\n",
              waited.message().size(), absl::FormatDuration(stats.max_iteration_cpu).c_str());
  CHECK(waited.code() == absl::StatusCode::kDeadlineExceeded);
  // The first keys and how many are missing, not 1.5 MB of key names.
  CHECK_THAT(std::string(waited.message()), Catch::Contains("131071 missing keys"));
  CHECK_THAT(std::string(waited.message()), Catch::Contains("missing/0, missing/1"));
  CHECK_THAT(std::string(waited.message()), !Catch::Contains("missing/7,"));
  CHECK(waited.message().size() < 4096);
  if (kIterationBound == absl::Milliseconds(10)) {
    CHECK(stats.slow_iterations == slow_before);
  } else {
    CHECK(stats.max_iteration_cpu < kIterationBound);
  }
  // The connection is in step: the next request gets its own reply.
  REQUIRE(client->Set("after", "x").ok());
  CHECK(*client->Get("after") == "x");
}

// A 16 MiB SET and a GET of it sent together: each has its own loop
// iteration and the log writes the record 1 MiB per iteration, so no
// iteration holds all of it (before: one iteration of 79-110 ms of CPU on
// the 2-vCPU VM; after: 28-56 ms for the SET, whose two copies of the value
// into fresh memory cost ~14 ms each there, and 10-16 ms for the GET). The
// numbers are printed; the 10 ms bound is not met for a 16 MiB value.
TEST_CASE("a 16 MiB SET and its GET sent together are handled in separate iterations") {
  char dir[] = "/tmp/muster_big_set_test_XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  StoreServerOptions options = Loopback();
  options.state_dir = dir;
  const std::string big(16 << 20, 'b');
  {
    auto server = StoreServer::Start(options);
    REQUIRE(server.ok());
    Raw client((*server)->port());
    for (int round = 0; round < 3; ++round) {
      const uint64_t slow_before = (*server)->stats().slow_iterations;
      std::string key = absl::StrCat("big", round);
      client.Send(Set113(key, big) + Get113(key));
      std::string reply = client.Read(8 + big.size());
      CHECK(reply == Value(big));
      StoreServer::Stats stats = (*server)->stats();
      std::printf("16 MiB SET+GET round %d: %llu iterations over 10 ms, longest so far %s\n", round,
                  static_cast<unsigned long long>(stats.slow_iterations - slow_before),
                  absl::FormatDuration(stats.max_iteration_cpu).c_str());
      if (kIterationBound == absl::Milliseconds(10)) {
        CHECK(stats.slow_iterations - slow_before <= 2);  // the SET's, the GET's
      } else {
        CHECK(stats.max_iteration_cpu < kIterationBound);
      }
    }
    (*server)->Stop();
  }
  // What was acknowledged is in the log.
  auto again = StoreServer::Start(options);
  REQUIRE(again.ok());
  std::atomic<int64_t> keys{-1};
  std::atomic<size_t> size{0};
  REQUIRE((*again)->Post([&](StoreServer::Loop& loop) {
    const std::string* v = loop.kv().Find("big2");
    size = v != nullptr ? v->size() : 0;
    keys = loop.kv().NumKeys();
  }));
  REQUIRE(Eventually([&] { return keys.load() >= 0; }));
  CHECK(keys.load() == 3);
  CHECK(size.load() == big.size());
  (*again)->Stop();
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "what a client sent before it closed is kept, also behind a request taking its own turn") {
  auto server = StoreServer::Start(Loopback());
  REQUIRE(server.ok());
  auto value_size = [&](const std::string& key) {
    auto size = std::make_shared<std::atomic<int64_t>>(-2);
    REQUIRE((*server)->Post([size, key](StoreServer::Loop& loop) {
      const std::string* v = loop.kv().Find(key);
      *size = v != nullptr ? static_cast<int64_t>(v->size()) : -1;
    }));
    REQUIRE(Eventually([&] { return size->load() != -2; }));
    return size->load();
  };
  {
    Raw writer((*server)->port());
    writer.Send(Set113("big", std::string(8 << 20, 'b')));
  }
  REQUIRE(Eventually([&] { return value_size("big") == (8 << 20); }));
  // While the loop is held, the client sends exactly one read chunk (64
  // KiB) and closes: the server reads it and the EOF in one go. The GET's
  // 8 MiB reply (more than a socket takes at once) makes it a large request,
  // which takes its own turn; the SET after it must not be dropped with the
  // connection, neither at the EOF nor when sending that reply fails.
  std::atomic<bool> holding{false};
  REQUIRE((*server)->Post([&](StoreServer::Loop&) {
    holding = true;
    absl::SleepFor(absl::Milliseconds(500));
  }));
  while (!holding.load()) absl::SleepFor(absl::Milliseconds(1));
  const std::string get = Get113("big");
  const size_t pad = (64 << 10) - get.size() - Set113("done", "").size();
  Raw client((*server)->port());
  client.Send(get + Set113("done", std::string(pad, 'd')));
  client.Close();
  CHECK(Eventually([&] { return value_size("done") == static_cast<int64_t>(pad); }));
  (*server)->Stop();
}

TEST_CASE("a long pipeline of WAITs met at once is answered in a loop, not a recursion") {
  // A 2.x client parked on a WAIT keeps what it sends next buffered; here
  // 60,000 more WAITs for the same key. When the key is set, the first wait
  // ends and each buffered one is met at once: they used to be answered one
  // nested call deeper each, and this many overflowed the loop's stack
  // (the daemon crashed). Every one gets its STOP_WAITING, and the server
  // goes on serving.
  StoreServerOptions options = Loopback();
  auto server = StoreServer::Start(options);
  REQUIRE(server.ok());
  StoreServer& s = **server;
  constexpr int kWaits = 60000;
  std::string validate;
  validate.push_back(0);
  wire::PutU32(&validate, wire::kValidateMagic);
  std::string wait;
  wire::PutU8(&wait, *wire::CommandByte(wire::Dialect::kTorch2, wire::Op::kWait));
  wire::PutKeyList(&wait, {"x"});
  Raw a(s.port());
  a.Send(validate + wait);
  REQUIRE(Eventually([&] { return s.stats().memory_bytes >= 128; }));  // parked
  std::string more;
  for (int i = 0; i < kWaits; ++i) more += wait;
  a.Send(more);
  // All of it buffered (charged) before the key is set: the old code then
  // answered every wait one call deeper.
  REQUIRE(Eventually([&] { return s.stats().memory_bytes >= more.size(); }));
  Raw writer(s.port());
  writer.Send(Set113("x", "1"));
  std::string replies = a.Read(kWaits + 1);
  REQUIRE(replies.size() == static_cast<size_t>(kWaits + 1));
  CHECK(replies == std::string(kWaits + 1, static_cast<char>(wire::kStopWaiting)));
  std::string get;
  wire::PutU8(&get, *wire::CommandByte(wire::Dialect::kTorch113, wire::Op::kGet));
  wire::PutBytes(&get, "x");
  writer.Send(get);
  CHECK(writer.Read(9) == std::string("\x01\0\0\0\0\0\0\0"
                                      "1",
                                      9));
}

TEST_CASE("with a token, a torch client not allowed in is refused at its first bytes, uncharged") {
  // A 1.13 SET declaring a 16 MiB value, 26 bytes of it sent, from a peer
  // that must authenticate: it used to be charged (and its buffer reserved)
  // 16 MiB until the auth timeout; now the connection closes at once.
  StoreServerOptions options = Loopback();
  options.token = "t0k3n";
  auto server = StoreServer::Start(options);
  REQUIRE(server.ok());
  StoreServer& s = **server;
  Raw a(s.port());
  a.Send(Set113("k", std::string(16 << 20, 'v')).substr(0, 26));
  absl::Time start = absl::Now();
  CHECK(a.Read(1).empty());  // closed: nothing sent to a torch client
  CHECK(absl::Now() - start < absl::Seconds(2));
  CHECK(s.stats().memory_bytes < kIdle);
  CHECK(s.stats().keys == 0);
}

}  // namespace
}  // namespace muster
