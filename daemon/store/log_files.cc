#include "daemon/store/log_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace muster {
namespace {

class SystemLogFiles : public LogFiles {
 public:
  int Mkdir(const std::string& path, mode_t mode) override { return ::mkdir(path.c_str(), mode); }
  int Open(const std::string& path, int flags, mode_t mode) override {
    return ::open(path.c_str(), flags, mode);
  }
  int Close(int fd) override { return ::close(fd); }
  ssize_t Pread(int fd, void* data, size_t size, off_t offset) override {
    return ::pread(fd, data, size, offset);
  }
  ssize_t Pwrite(int fd, const void* data, size_t size, off_t offset) override {
    return ::pwrite(fd, data, size, offset);
  }
  int Fsync(int fd) override { return ::fsync(fd); }
  int Fdatasync(int fd) override { return ::fdatasync(fd); }
  int Ftruncate(int fd, off_t size) override { return ::ftruncate(fd, size); }
  int Rename(const std::string& from, const std::string& to) override {
    return ::rename(from.c_str(), to.c_str());
  }
  int Link(const std::string& from, const std::string& to) override {
    return ::link(from.c_str(), to.c_str());
  }
  int Unlink(const std::string& path) override { return ::unlink(path.c_str()); }
};

}  // namespace

LogFiles* LogFiles::System() {
  static LogFiles* system = new SystemLogFiles();
  return system;
}

}  // namespace muster
