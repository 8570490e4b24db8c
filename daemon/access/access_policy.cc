#include "daemon/access/access_policy.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"

namespace muster {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr absl::string_view kBearer = "Bearer ";

size_t LimitFor(const FieldDescriptor& field, const FieldLimits& limits) {
  const std::string& name = field.name();
  if (name == "host" || name == "hostname") return limits.max_host_bytes;
  if (name == "job_id") return limits.max_job_id_bytes;
  if (name == "name" || name == "group") return limits.max_name_bytes;
  return limits.max_string_bytes;
}

absl::Status CheckString(const FieldDescriptor& field, const std::string& value,
                         const FieldLimits& limits) {
  size_t limit = LimitFor(field, limits);
  if (value.size() <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field.full_name(), " is ", value.size(), " bytes (limit ", limit, ")"));
}

// Whether the process `pid` has `gid` among its supplementary groups.
bool ProcessInGroup(int64_t pid, int64_t gid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, "Groups:")) continue;
    for (absl::string_view g : absl::StrSplit(line.substr(7), ' ', absl::SkipWhitespace())) {
      int64_t value;
      if (absl::SimpleAtoi(g, &value) && value == gid) return true;
    }
    return false;
  }
  return false;
}

}  // namespace

absl::Status CheckFieldLimits(const Message& message, const FieldLimits& limits) {
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    bool is_string = field->type() == FieldDescriptor::TYPE_STRING;
    bool is_message = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (field->is_repeated()) {
      int n = reflection->FieldSize(message, field);
      if (static_cast<size_t>(n) > limits.max_repeated) {
        return absl::InvalidArgumentError(absl::StrCat(
            field->full_name(), " has ", n, " elements (limit ", limits.max_repeated, ")"));
      }
      for (int i = 0; i < n && (is_string || is_message); ++i) {
        if (is_string) {
          std::string scratch;
          const std::string& value =
              reflection->GetRepeatedStringReference(message, field, i, &scratch);
          if (absl::Status s = CheckString(*field, value, limits); !s.ok()) return s;
        } else {
          const Message& sub = reflection->GetRepeatedMessage(message, field, i);
          if (absl::Status s = CheckFieldLimits(sub, limits); !s.ok()) return s;
        }
      }
    } else if (is_string) {
      std::string scratch;
      const std::string& value = reflection->GetStringReference(message, field, &scratch);
      if (absl::Status s = CheckString(*field, value, limits); !s.ok()) return s;
    } else if (is_message) {
      if (absl::Status s = CheckFieldLimits(reflection->GetMessage(message, field), limits);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

bool SecretsEqual(const std::string& a, const std::string& b) {
  // Compare over the longer length so the time does not reveal a prefix.
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

AccessPolicy::AccessPolicy(AccessOptions options) : options_(std::move(options)) {}

Caller AccessPolicy::UnixCaller(int64_t uid, int64_t gid, int64_t pid) const {
  Caller c;
  c.via = Caller::Via::kUnixSocket;
  c.uid = uid;
  c.gid = gid;
  c.pid = pid;
  c.privileged = uid == 0 || uid == static_cast<int64_t>(::geteuid()) ||
                 (options_.operator_gid >= 0 &&
                  (gid == options_.operator_gid || ProcessInGroup(pid, options_.operator_gid)));
  c.description = absl::StrCat("uid ", uid, " (pid ", pid, ")");
  return c;
}

void AccessPolicy::RecordUnixPeer(const std::string& peer, Caller caller) {
  absl::MutexLock lock(&mu_);
  unix_peers_[peer] = std::move(caller);
}

absl::StatusOr<Caller> AccessPolicy::Identify(const grpc::ServerContextBase& context) const {
  std::string peer = context.peer();
  {
    absl::MutexLock lock(&mu_);
    auto it = unix_peers_.find(peer);
    if (it != unix_peers_.end()) return it->second;
  }
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) {
    // Neither a recorded unix connection nor TCP: refuse rather than guess.
    return absl::UnauthenticatedError(
        absl::StrCat("musterd cannot tell who is calling from '", peer, "'"));
  }
  Caller c;
  c.via = Caller::Via::kTcp;
  c.description = peer;
  if (options_.tls_client_certificates) {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth == nullptr || !auth->IsPeerAuthenticated()) {
      return absl::UnauthenticatedError(
          absl::StrCat("the TCP caller ", peer, " presented no verified TLS client certificate"));
    }
  }
  if (!options_.token.empty()) {
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("authorization");
    if (it == metadata.end()) {
      return absl::UnauthenticatedError(
          absl::StrCat("musterd requires the cluster token over TCP; the caller ", peer,
                       " sent none (musterctl: --token-file or MUSTER_TOKEN_FILE)"));
    }
    absl::string_view value(it->second.data(), it->second.size());
    std::string presented(absl::StartsWith(value, kBearer) ? value.substr(kBearer.size()) : "");
    if (!SecretsEqual(presented, options_.token)) {
      return absl::UnauthenticatedError(
          absl::StrCat("the TCP caller ", peer, " presented a wrong cluster token"));
    }
  } else if (!options_.tls_client_certificates) {
    return absl::UnauthenticatedError("musterd has no credentials configured for TCP callers");
  }
  c.privileged = true;  // a cluster principal: a peer daemon or an operator
  return c;
}

void AccessPolicy::LogRefusal(const std::string& who, const absl::Status& why) const {
  // At most one line per second: a flood of bad calls must not flood the log.
  absl::Time now = absl::Now();
  int64_t suppressed;
  {
    absl::MutexLock lock(&mu_);
    if (now - last_refusal_log_ < absl::Seconds(1)) {
      ++suppressed_refusals_;
      return;
    }
    last_refusal_log_ = now;
    suppressed = suppressed_refusals_;
    suppressed_refusals_ = 0;
  }
  MLOG(WARNING) << "refused a call from " << who << ": " << why.message()
                << (suppressed > 0 ? absl::StrCat(" (and ", suppressed, " more refusals)") : "");
}

absl::StatusOr<Caller> AccessPolicy::Admit(const grpc::ServerContextBase& context,
                                           const Message* request) const {
  absl::StatusOr<Caller> caller = Identify(context);
  if (!caller.ok()) {
    LogRefusal(context.peer(), caller.status());
    return caller;
  }
  if (request != nullptr) {
    if (absl::Status s = CheckFieldLimits(*request, options_.limits); !s.ok()) {
      LogRefusal(caller->description, s);
      return s;
    }
  }
  return caller;
}

}  // namespace muster
