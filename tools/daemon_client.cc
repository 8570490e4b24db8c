#include "tools/daemon_client.h"

#include "absl/strings/str_cat.h"

namespace muster {

std::string DaemonTarget::GrpcTarget() const {
  if (!address.empty()) return address;
  return absl::StrCat("unix:", socket_path);
}

std::string DaemonTarget::Describe() const {
  if (!address.empty()) return address;
  return absl::StrCat("unix socket ", socket_path);
}

std::shared_ptr<grpc::Channel> ConnectToDaemon(const DaemonTarget& target) {
  grpc::ChannelArguments args;
  // Fail fast instead of retrying a dead daemon for the whole deadline.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  return grpc::CreateCustomChannel(target.GrpcTarget(), grpc::InsecureChannelCredentials(), args);
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(context, ": ", status.error_message()));
}

std::unique_ptr<grpc::ClientContext> ContextWithTimeout(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

}  // namespace muster
