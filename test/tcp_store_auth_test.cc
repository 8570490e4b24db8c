// The native store handshake between TcpStore and a real in-process
// StoreServer over loopback TCP: who is admitted and who is refused (both
// ways), that the token never crosses the wire (a fake store and a
// recording relay capture every byte), the authentication deadline, and the
// separate bound on connections that have not authenticated yet.
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/store_auth.h"
#include "common/store_wire.h"
#include "daemon/store/store_server.h"
#include "muster/tcp_store.h"
#include "test/wire_capture.h"

namespace muster {
namespace {

using testing::CaptureServer;
using testing::ConnectToLoopback;
using testing::ReadsEof;
using testing::RecordingRelay;

// A token no byte sequence on the wire matches by chance.
std::string UniqueToken() { return "tok-" + absl::BytesToHexString(*store_auth::RandomNonce()); }

std::unique_ptr<StoreServer> StartServer(std::string token,
                                         void (*tweak)(StoreServerOptions&) = nullptr) {
  StoreServerOptions options;
  options.listen_address = "127.0.0.1";
  options.port = 0;
  options.token = std::move(token);
  if (tweak != nullptr) tweak(options);
  auto server = StoreServer::Start(options);
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  return *std::move(server);
}

absl::StatusOr<std::unique_ptr<TcpStore>> Open(int port, std::string token,
                                               absl::Duration connect_timeout = absl::Seconds(5)) {
  TcpStoreOptions options;
  options.port = port;
  options.token = std::move(token);
  options.connect_timeout = connect_timeout;
  options.timeout = absl::Seconds(10);
  return TcpStore::Connect(options);
}

// Checks that neither the token nor a 12-byte piece of it is in `bytes`.
void CheckNoToken(const std::string& bytes, const std::string& token) {
  INFO("captured " << bytes.size() << " bytes");
  CHECK_FALSE(absl::StrContains(bytes, token));
  for (size_t i = 0; i + 12 <= token.size(); i += 4) {
    CHECK_FALSE(absl::StrContains(bytes, token.substr(i, 12)));
  }
}

template <typename Pred>
bool Eventually(Pred pred, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

// A raw native client: sends AUTH and returns the challenge's server nonce
// and proof.
struct Challenge {
  std::string client_nonce, server_nonce, proof;
};
bool ReadExactly(int fd, size_t n, std::string* out) {
  out->clear();
  while (out->size() < n) {
    char buf[512];
    ssize_t got = ::recv(fd, buf, std::min(sizeof(buf), n - out->size()), 0);
    if (got <= 0) return false;
    out->append(buf, got);
  }
  return true;
}
Challenge RawHello(int fd) {
  Challenge c;
  c.client_nonce = *store_auth::RandomNonce();
  std::string hello;
  wire::PutU8(&hello, wire::kAuthByte);
  wire::PutU32(&hello, wire::kAuthMagic);
  hello += c.client_nonce;
  REQUIRE(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(hello.size()));
  std::string head;
  REQUIRE(ReadExactly(fd, 1 + wire::kAuthNonceBytes + 8, &head));
  REQUIRE(head[0] == static_cast<char>(wire::kReplyOk));
  c.server_nonce = head.substr(1, wire::kAuthNonceBytes);
  uint64_t len;
  std::memcpy(&len, head.data() + 1 + wire::kAuthNonceBytes, 8);
  REQUIRE((len == 0 || len == wire::kAuthProofBytes));
  REQUIRE(ReadExactly(fd, len, &c.proof));
  return c;
}
void RawSendProof(int fd, const std::string& proof) {
  std::string msg;
  wire::PutU8(&msg, wire::kAuthProofByte);
  wire::PutBytes(&msg, proof);
  REQUIRE(::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(msg.size()));
}
// Reads an error reply: returns its code and message.
std::pair<int, std::string> RawReadError(int fd) {
  std::string head;
  REQUIRE(ReadExactly(fd, 2 + 8, &head));
  REQUIRE(head[0] == static_cast<char>(wire::kReplyError));
  uint64_t len;
  std::memcpy(&len, head.data() + 2, 8);
  std::string message;
  REQUIRE(ReadExactly(fd, len, &message));
  return {static_cast<uint8_t>(head[1]), message};
}

TEST_CASE("a store with a token admits a client holding it, which learns the limits") {
  const std::string token = UniqueToken();
  auto server = StartServer(token, [](StoreServerOptions& o) { o.limits.max_value_bytes = 100; });
  auto store = Open(server->port(), token);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  REQUIRE((*store)->Set("k", "v").ok());
  CHECK(*(*store)->Get("k") == "v");
  absl::Status big = (*store)->Set("k", std::string(101, 'x'));
  CHECK(big.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(big.message(), "exceeds the store's limit of 100"));
  CHECK(server->stats().unauthenticated_connections == 0);
}

TEST_CASE("a client with a different token refuses the store: UNAUTHENTICATED naming it") {
  auto server = StartServer(UniqueToken());
  auto store = Open(server->port(), "not-the-token");
  REQUIRE_FALSE(store.ok());
  CHECK(store.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(absl::StrContains(store.status().message(),
                          absl::StrCat("store at 127.0.0.1:", server->port())));
  CHECK(absl::StrContains(store.status().message(),
                          "the server does not know this client's store token"));
}

TEST_CASE("a client without a token is refused by a store that has one") {
  auto server = StartServer(UniqueToken());
  auto store = Open(server->port(), "");
  REQUIRE_FALSE(store.ok());
  CHECK(store.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(absl::StrContains(store.status().message(), "this store requires a token"));
}

TEST_CASE("a client with a token refuses a store that has none; token-less both ways works") {
  auto server = StartServer("");
  auto refused = Open(server->port(), UniqueToken());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(absl::StrContains(refused.status().message(), "the server has no store token"));
  auto open = Open(server->port(), "");
  INFO(open.status().ToString());
  REQUIRE(open.ok());
  REQUIRE((*open)->Set("a", "1").ok());
  CHECK(*(*open)->Get("a") == "1");
}

TEST_CASE("the server proves the token as documented and checks the client's proof") {
  const std::string token = UniqueToken();
  auto server = StartServer(token);
  {
    // A correct proof computed from outside (the documented construction).
    int fd = ConnectToLoopback(server->port());
    REQUIRE(fd >= 0);
    Challenge c = RawHello(fd);
    CHECK(c.proof == store_auth::ServerProof(token, c.client_nonce, c.server_nonce));
    RawSendProof(fd, store_auth::ClientProof(token, c.server_nonce, c.client_nonce));
    std::string limits;
    REQUIRE(ReadExactly(fd, 1 + 32, &limits));
    CHECK(limits[0] == static_cast<char>(wire::kReplyOk));
    ::close(fd);
  }
  struct Bad {
    const char* name;
    std::string (*proof)(const std::string& token, const Challenge& c);
    const char* message;
  };
  const Bad bad[] = {
      {"a proof made with another token",
       [](const std::string&, const Challenge& c) {
         return store_auth::ClientProof("other", c.server_nonce, c.client_nonce);
       },
       "wrong store token"},
      {"the server's own proof reflected back",
       [](const std::string&, const Challenge& c) { return c.proof; }, "wrong store token"},
      {"nonces swapped",
       [](const std::string& t, const Challenge& c) {
         return store_auth::ClientProof(t, c.client_nonce, c.server_nonce);
       },
       "wrong store token"},
      {"no proof", [](const std::string&, const Challenge&) { return std::string(); },
       "this store requires a token"},
  };
  for (const Bad& b : bad) {
    INFO(b.name);
    int fd = ConnectToLoopback(server->port());
    REQUIRE(fd >= 0);
    Challenge c = RawHello(fd);
    RawSendProof(fd, b.proof(token, c));
    auto [code, message] = RawReadError(fd);
    CHECK(code == static_cast<int>(absl::StatusCode::kUnauthenticated));
    CHECK(absl::StrContains(message, b.message));
    CHECK_FALSE(absl::StrContains(message, token));
    CHECK(ReadsEof(fd, absl::Seconds(5)));
    ::close(fd);
  }
}

TEST_CASE("a client from before the challenge-response is told to upgrade") {
  auto server = StartServer(UniqueToken());
  int fd = ConnectToLoopback(server->port());
  REQUIRE(fd >= 0);
  std::string old_auth;  // AUTH, u64 length, the token in clear
  wire::PutU8(&old_auth, wire::kAuthByte);
  wire::PutBytes(&old_auth, "old-token");
  REQUIRE(::send(fd, old_auth.data(), old_auth.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(old_auth.size()));
  auto [code, message] = RawReadError(fd);
  CHECK(code == static_cast<int>(absl::StatusCode::kInvalidArgument));
  CHECK(absl::StrContains(message, "native AUTH without the challenge-response magic"));
  CHECK(absl::StrContains(message, "upgrade the client"));
  CHECK_FALSE(absl::StrContains(message, "old-token"));
  ::close(fd);
}

TEST_CASE("the token never crosses the wire to a store that does not know it") {
  const std::string token = UniqueToken();
  const size_t kHello = 1 + 4 + wire::kAuthNonceBytes;
  SECTION("a listener that never answers") {
    CaptureServer capture(CaptureServer::Mode::kSilent);
    auto store = Open(capture.port(), token, absl::Milliseconds(500));
    REQUIRE_FALSE(store.ok());
    CHECK(store.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(capture.Received().size() == kHello);  // the hello, nothing else
    CheckNoToken(capture.Received(), token);
  }
  SECTION("a listener that answers with a made-up proof") {
    CaptureServer capture(CaptureServer::Mode::kBogusProof);
    auto store = Open(capture.port(), token);
    REQUIRE_FALSE(store.ok());
    CHECK(store.status().code() == absl::StatusCode::kUnauthenticated);
    CHECK(absl::StrContains(store.status().message(),
                            absl::StrCat("store at 127.0.0.1:", capture.port(),
                                         ": the server does not know this client's store token")));
    CHECK(capture.connections() == 1);  // refused, not retried
    CHECK(capture.Received().size() == kHello);
    CheckNoToken(capture.Received(), token);
  }
  SECTION("a listener that claims to have no token") {
    CaptureServer capture(CaptureServer::Mode::kNoProof);
    auto store = Open(capture.port(), token);
    REQUIRE_FALSE(store.ok());
    CHECK(store.status().code() == absl::StatusCode::kUnauthenticated);
    CHECK(capture.Received().size() == kHello);
    CheckNoToken(capture.Received(), token);
  }
}

TEST_CASE("a full handshake and requests through a recording relay carry no token") {
  const std::string token = UniqueToken();
  auto server = StartServer(token);
  RecordingRelay relay(server->port());
  auto store = Open(relay.port(), token);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  REQUIRE((*store)->Set("relayed-key", "relayed-value").ok());
  CHECK(*(*store)->Get("relayed-key") == "relayed-value");
  CHECK(*(*store)->Add("relayed-counter", 5) == 5);
  store->reset();
  // The relay saw the whole conversation (so the check below means something).
  std::string up = relay.ClientToServer(), down = relay.ServerToClient();
  CHECK(absl::StrContains(up, "relayed-key"));
  CHECK(absl::StrContains(down, "relayed-value"));
  CHECK(up.size() > 1 + 4 + 32 + 1 + 8 + 32);
  CheckNoToken(up, token);
  CheckNoToken(down, token);
}

TEST_CASE("a connection that does not authenticate in time is closed; admitted ones are not") {
  const std::string token = UniqueToken();
  StoreServerOptions options;
  options.listen_address = "127.0.0.1";
  options.port = 0;
  options.token = token;
  options.auth_timeout = absl::Milliseconds(300);
  options.allow_unauthenticated = *CidrSet::Parse("127.0.0.0/8");
  auto started = StoreServer::Start(options);
  REQUIRE(started.ok());
  auto& server = *started;
  // Without the address exemption, in a second server.
  options.allow_unauthenticated = CidrSet();
  auto strict_started = StoreServer::Start(options);
  REQUIRE(strict_started.ok());
  auto& strict = *strict_started;

  // Idle: closed after the deadline, not before.
  absl::Time start = absl::Now();
  int idle = ConnectToLoopback(strict->port());
  REQUIRE(idle >= 0);
  // Stalled mid-handshake: also closed, after its challenge.
  int stalled = ConnectToLoopback(strict->port());
  REQUIRE(stalled >= 0);
  RawHello(stalled);
  CHECK(ReadsEof(idle, absl::Seconds(5)));
  absl::Duration took = absl::Now() - start;
  CHECK(took >= absl::Milliseconds(250));
  CHECK(took < absl::Seconds(3));
  auto [code, message] = RawReadError(stalled);  // told why, then closed
  CHECK(code == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  CHECK(absl::StrContains(message, "not authenticated within --store-auth-timeout-seconds=0.3"));
  CHECK(ReadsEof(stalled, absl::Seconds(5)));
  CHECK(strict->stats().auth_timeouts == 2);
  CHECK(Eventually([&] { return strict->stats().unauthenticated_connections == 0; },
                   absl::Seconds(2)));
  ::close(idle);
  ::close(stalled);

  // An authenticated native client and a torch client admitted by address
  // both outlive the deadline.
  auto native = Open(server->port(), token);
  REQUIRE(native.ok());
  TcpStoreOptions torch_options;
  torch_options.port = server->port();
  torch_options.protocol = TcpStoreOptions::Protocol::kTorch113;
  auto torch = TcpStore::Connect(torch_options);
  REQUIRE(torch.ok());
  absl::SleepFor(absl::Milliseconds(700));
  CHECK(*(*torch)->Add("n", 1) == 1);
  CHECK(*(*native)->Add("n", 1) == 2);
  CHECK(server->stats().auth_timeouts == 0);
}

TEST_CASE("1000 idle unauthenticated connections do not delay a token holder") {
  REQUIRE(testing::RaiseFileLimit() >= 2200);  // 1000 here + 1000 in the server
  const std::string token = UniqueToken();
  auto server = StartServer(token, [](StoreServerOptions& o) {
    o.auth_timeout = absl::Seconds(1);
    o.max_unauthenticated_connections = 2000;
    o.max_connections = 10;  // unauthenticated ones do not count here
  });
  absl::Time opened = absl::Now();
  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    int fd = ConnectToLoopback(server->port(), /*nonblocking=*/true);
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  REQUIRE(Eventually([&] { return server->stats().unauthenticated_connections == 1000; },
                     absl::Seconds(1)));
  absl::Time start = absl::Now();
  auto store = Open(server->port(), token);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  REQUIRE((*store)->Set("k", "v").ok());
  CHECK(*(*store)->Get("k") == "v");
  absl::Duration took = absl::Now() - start;
  INFO("token holder took " << absl::FormatDuration(took));
  CHECK(took < absl::Milliseconds(800));  // before the 1 s deadline freed anything
  // The idle ones are closed at the deadline (orderly: EOF).
  int eof = 0;
  for (int fd : idle) eof += ReadsEof(fd, opened + absl::Seconds(4) - absl::Now()) ? 1 : 0;
  CHECK(eof == 1000);
  CHECK(absl::Now() - opened >= absl::Milliseconds(900));
  CHECK(server->stats().auth_timeouts == 1000);
  CHECK(Eventually([&] { return server->stats().unauthenticated_connections == 0; },
                   absl::Seconds(2)));
  for (int fd : idle) ::close(fd);
  CHECK(*(*store)->Get("k") == "v");  // still connected
}

TEST_CASE(
    "past --store-max-unauthenticated-connections new ones are refused, yet a token "
    "holder gets in before the deadline") {
  REQUIRE(testing::RaiseFileLimit() >= 1200);
  const std::string token = UniqueToken();
  auto server = StartServer(token, [](StoreServerOptions& o) {
    o.auth_timeout = absl::Seconds(4);  // the oldest may be replaced after 1 s
    o.max_unauthenticated_connections = 16;
  });
  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    int fd = ConnectToLoopback(server->port(), /*nonblocking=*/true);
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  REQUIRE(
      Eventually([&] { return server->stats().refused_unauthenticated >= 984; }, absl::Seconds(2)));
  CHECK(server->stats().unauthenticated_connections == 16);
  // The refused ones were closed at once.
  int closed = 0;
  for (int fd : idle) closed += ReadsEof(fd, absl::Milliseconds(1)) ? 1 : 0;
  CHECK(closed >= 984);
  absl::Time start = absl::Now();
  auto store = Open(server->port(), token);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  REQUIRE((*store)->Set("k", "v").ok());
  absl::Duration took = absl::Now() - start;
  INFO("token holder took " << absl::FormatDuration(took));
  CHECK(took < absl::Seconds(3));  // replaced the oldest idle one, not after the 4 s deadline
  CHECK(server->stats().replaced_unauthenticated >= 1);
  for (int fd : idle) ::close(fd);
}

TEST_CASE("--store-max-connections counts authenticated connections only") {
  const std::string token = UniqueToken();
  auto server = StartServer(token, [](StoreServerOptions& o) { o.max_connections = 2; });
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(ConnectToLoopback(server->port()));
  REQUIRE(Eventually([&] { return server->stats().unauthenticated_connections == 20; },
                     absl::Seconds(2)));
  auto a = Open(server->port(), token);
  auto b = Open(server->port(), token);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto c = Open(server->port(), token);  // the third authenticated one
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(c.status().message(), "--store-max-connections=2 reached"));
  CHECK(*(*a)->Add("n", 1) == 1);
  for (int fd : idle) ::close(fd);
}

}  // namespace
}  // namespace muster
