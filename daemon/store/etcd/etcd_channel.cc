#include "daemon/store/etcd/etcd_channel.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace muster {

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenEtcdChannel(const std::string& endpoint,
                                                               const EtcdStoreOptions& options) {
  std::string target = endpoint;
  bool tls = false;
  if (absl::StartsWith(target, "https://")) {
    tls = true;
    target = target.substr(8);
  } else if (absl::StartsWith(target, "http://")) {
    target = target.substr(7);
  }
  while (!target.empty() && target.back() == '/') target.pop_back();
  if (target.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd endpoint '", endpoint, "' names no host"));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.ca_pem;
    ssl.pem_cert_chain = options.cert_pem;
    ssl.pem_private_key = options.key_pem;
    creds = grpc::SslCredentials(ssl);
  } else {
    if (!options.cert_pem.empty() || !options.ca_pem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint '", endpoint, "' is plain http but TLS files were given: use https://"));
    }
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  // Fail over quickly: a dead endpoint is retried at most every second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (options.private_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, creds, args);
}

absl::StatusOr<std::vector<std::unique_ptr<EtcdEndpoint>>> OpenEtcdEndpoints(
    const EtcdStoreOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints given");
  std::vector<std::unique_ptr<EtcdEndpoint>> endpoints;
  for (const std::string& e : options.endpoints) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenEtcdChannel(e, options);
    if (!channel.ok()) return channel.status();
    auto ep = std::make_unique<EtcdEndpoint>();
    ep->name = e;
    ep->channel = std::move(*channel);
    ep->kv = etcdserverpb::KV::NewStub(ep->channel);
    ep->lease = etcdserverpb::Lease::NewStub(ep->channel);
    ep->watch = etcdserverpb::Watch::NewStub(ep->channel);
    ep->auth = etcdserverpb::Auth::NewStub(ep->channel);
    endpoints.push_back(std::move(ep));
  }
  return endpoints;
}

absl::Status EtcdToken::AddTo(EtcdEndpoint& ep, grpc::ClientContext& ctx, absl::Time deadline,
                              const EtcdStoreOptions& options) {
  if (options.user.empty()) return absl::OkStatus();
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    token = token_;
  }
  if (token.empty()) {
    etcdserverpb::AuthenticateRequest req;
    req.set_name(options.user);
    req.set_password(options.password);
    etcdserverpb::AuthenticateResponse resp;
    grpc::ClientContext actx;
    actx.set_deadline(
        absl::ToChronoTime(std::min(deadline, absl::Now() + options.attempt_timeout)));
    grpc::Status s = ep.auth->Authenticate(&actx, req, &resp);
    if (!s.ok()) {
      absl::StatusCode code = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                  ? absl::StatusCode::kUnavailable
                                  : absl::StatusCode::kUnauthenticated;
      return absl::Status(code, absl::StrCat("etcd at ", ep.name, ": authenticating as '",
                                             options.user, "' failed: ", s.error_message()));
    }
    token = resp.token();
    absl::MutexLock lock(&mu_);
    token_ = token;
  }
  ctx.AddMetadata("token", token);
  return absl::OkStatus();
}

void EtcdToken::Drop() {
  absl::MutexLock lock(&mu_);
  token_.clear();
}

std::string EtcdPrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace muster
