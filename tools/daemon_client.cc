#include "tools/daemon_client.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace muster {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& what, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

std::string DaemonTarget::GrpcTarget() const {
  if (!address.empty()) return address;
  return absl::StrCat("unix:", socket_path);
}

std::string DaemonTarget::Describe() const {
  if (!address.empty()) return address;
  return absl::StrCat("unix socket ", socket_path);
}

absl::Status LoadCredentials(const std::string& token_file, const std::string& tls_ca,
                             const std::string& tls_cert, const std::string& tls_key,
                             DaemonTarget* target) {
  std::string token_path = token_file.empty() ? Env("MUSTER_TOKEN_FILE") : token_file;
  if (!token_path.empty()) {
    absl::StatusOr<std::string> token = ReadFile("token file", token_path);
    if (!token.ok()) return token.status();
    target->token = std::string(absl::StripAsciiWhitespace(*token));
    if (target->token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("token file ", token_path, " is empty"));
    }
  } else {
    target->token = Env("MUSTER_TOKEN");
  }
  for (auto [what, flag, env, out] :
       {std::tuple<const char*, std::string, const char*, std::string*>{
            "TLS CA", tls_ca, "MUSTER_TLS_CA", &target->tls_ca_pem},
        {"TLS certificate", tls_cert, "MUSTER_TLS_CERT", &target->tls_cert_pem},
        {"TLS key", tls_key, "MUSTER_TLS_KEY", &target->tls_key_pem}}) {
    std::string path = flag.empty() ? Env(env) : flag;
    if (path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadFile(what, path);
    if (!pem.ok()) return pem.status();
    *out = *pem;
  }
  if (target->tls_cert_pem.empty() != target->tls_key_pem.empty()) {
    return absl::InvalidArgumentError("a TLS client certificate needs its key (and vice versa)");
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> ConnectToDaemon(const DaemonTarget& target) {
  grpc::ChannelArguments args;
  // Fail fast instead of retrying a dead daemon for the whole deadline.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!target.address.empty() && !target.tls_ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = target.tls_ca_pem;
    ssl.pem_cert_chain = target.tls_cert_pem;
    ssl.pem_private_key = target.tls_key_pem;
    credentials = grpc::SslCredentials(ssl);
  }
  return grpc::CreateCustomChannel(target.GrpcTarget(), credentials, args);
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(context, ": ", status.error_message()));
}

std::unique_ptr<grpc::ClientContext> ContextWithTimeout(const DaemonTarget& target,
                                                        absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!target.address.empty() && !target.token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", target.token));
  }
  return context;
}

}  // namespace muster
