#include "common/store_auth.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "absl/strings/escaping.h"

namespace muster::store_auth {
namespace {

std::string Hex(const std::string& bytes) { return absl::BytesToHexString(bytes); }

TEST_CASE("HMAC-SHA256 matches the RFC 4231 test vectors") {
  // Test case 1: 20-byte key of 0x0b.
  CHECK(Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  CHECK(Hex(HmacSha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 3: 20-byte key of 0xaa, 50 bytes of 0xdd.
  CHECK(Hex(HmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Test case 6: a key longer than the block (hashed first), like a long token.
  CHECK(Hex(HmacSha256(std::string(131, '\xaa'),
                       "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST_CASE("nonces are 32 random bytes, different every time") {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    auto nonce = RandomNonce();
    REQUIRE(nonce.ok());
    CHECK(nonce->size() == kNonceBytes);
    seen.insert(*nonce);
  }
  CHECK(seen.size() == 100);
}

TEST_CASE("proofs bind the token, both nonces, their order and the direction") {
  const std::string client(kNonceBytes, 'c');
  const std::string server(kNonceBytes, 's');
  std::string server_proof = ServerProof("token", client, server);
  std::string client_proof = ClientProof("token", server, client);
  CHECK(server_proof.size() == kProofBytes);
  CHECK(client_proof.size() == kProofBytes);
  // Exactly the documented construction.
  CHECK(server_proof == HmacSha256("token", std::string(kServerProofLabel) + client + server));
  CHECK(client_proof == HmacSha256("token", std::string(kClientProofLabel) + server + client));
  // A server proof is never a valid client proof (no reflection).
  CHECK(server_proof != ClientProof("token", client, server));
  CHECK(server_proof != client_proof);
  CHECK(ServerProof("other", client, server) != server_proof);
  CHECK(ServerProof("token", server, client) != server_proof);
  CHECK(ServerProof("token", client, std::string(kNonceBytes, 't')) != server_proof);
  // The token does not appear in either proof.
  CHECK(server_proof.find("token") == std::string::npos);
}

TEST_CASE("proof comparison is exact and refuses other lengths") {
  std::string a = ServerProof("t", std::string(32, '1'), std::string(32, '2'));
  std::string b = a;
  CHECK(ProofEquals(a, b));
  b[31] ^= 1;
  CHECK_FALSE(ProofEquals(a, b));
  b = a;
  b[0] ^= 0x80;
  CHECK_FALSE(ProofEquals(a, b));
  CHECK_FALSE(ProofEquals(a.substr(0, 31), a));
  CHECK_FALSE(ProofEquals("", a));
  CHECK_FALSE(ProofEquals(a + "x", a));
}

}  // namespace
}  // namespace muster::store_auth
