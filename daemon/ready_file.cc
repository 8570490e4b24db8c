#include "daemon/ready_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace muster {

std::string ReadyInfoToJson(const ReadyInfo& info) {
  JsonWriter w;
  w.BeginObject()
      .Key("pid")
      .Int(info.pid)
      .Key("grpc_port")
      .Int(info.grpc_port)
      .Key("store_port")
      .Int(info.store_port)
      .Key("socket")
      .String(info.socket)
      .Key("version")
      .String(info.version);
  if (info.metrics_port > 0) w.Key("metrics_port").Int(info.metrics_port);
  w.EndObject();
  return w.str() + "\n";
}

absl::Status WriteReadyFile(const std::string& path, const ReadyInfo& info) {
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  std::string json = ReadyInfoToJson(info);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("cannot create ready file ", tmp));
  ssize_t n = ::write(fd, json.data(), json.size());
  int err = errno;
  if (::close(fd) != 0 && n >= 0) {
    n = -1;
    err = errno;
  }
  if (n != static_cast<ssize_t>(json.size())) {
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, absl::StrCat("cannot write ready file ", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, absl::StrCat("cannot rename ready file to ", path));
  }
  return absl::OkStatus();
}

}  // namespace muster
