#include "common/store_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace muster::store_auth {
namespace {

std::string Proof(absl::string_view token, absl::string_view label, absl::string_view first,
                  absl::string_view second) {
  std::string message;
  message.reserve(label.size() + first.size() + second.size());
  absl::StrAppend(&message, label, first, second);  // public bytes only
  return HmacSha256(token, message);
}

}  // namespace

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  // HMAC() takes a NULL key only with length 0; give it a valid pointer.
  static const unsigned char kEmpty = 0;
  const void* key_data = key.empty() ? &kEmpty : static_cast<const void*>(key.data());
  unsigned char* done =
      HMAC(EVP_sha256(), key_data, static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &out_len);
  // SHA-256 is built into every libcrypto; a failure is a broken library.
  if (done == nullptr || out_len != kProofBytes) std::abort();
  std::string result(reinterpret_cast<const char*>(out), out_len);
  OPENSSL_cleanse(out, sizeof(out));
  return result;
}

absl::StatusOr<std::string> RandomNonce() {
  std::string nonce(kNonceBytes, '\0');
  size_t done = 0;
  while (done < nonce.size()) {
    ssize_t n = ::getrandom(nonce.data() + done, nonce.size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("getrandom for an authentication nonce: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return nonce;
}

std::string ServerProof(absl::string_view token, absl::string_view client_nonce,
                        absl::string_view server_nonce) {
  return Proof(token, kServerProofLabel, client_nonce, server_nonce);
}

std::string ClientProof(absl::string_view token, absl::string_view server_nonce,
                        absl::string_view client_nonce) {
  return Proof(token, kClientProofLabel, server_nonce, client_nonce);
}

bool ProofEquals(absl::string_view received, absl::string_view expected) {
  if (received.size() != expected.size()) return false;
  return CRYPTO_memcmp(received.data(), expected.data(), expected.size()) == 0;
}

}  // namespace muster::store_auth
