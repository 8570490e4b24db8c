// LogFiles: the file system calls the store's durability log makes, behind
// a narrow interface (leveldb's Env), so a test can fail any one of them and
// check what the log does then. Each method has the system call's contract:
// -1 (or a short count) with errno set on failure.
//
// Thread-safety: the system implementation is stateless and thread-safe;
// fakes state their own contract.
#ifndef MUSTER_DAEMON_STORE_LOG_FILES_H_
#define MUSTER_DAEMON_STORE_LOG_FILES_H_

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace muster {

class LogFiles {
 public:
  virtual ~LogFiles() = default;
  virtual int Mkdir(const std::string& path, mode_t mode) = 0;
  virtual int Open(const std::string& path, int flags, mode_t mode) = 0;
  virtual int Close(int fd) = 0;
  virtual ssize_t Pread(int fd, void* data, size_t size, off_t offset) = 0;
  virtual ssize_t Pwrite(int fd, const void* data, size_t size, off_t offset) = 0;
  virtual int Fsync(int fd) = 0;
  virtual int Fdatasync(int fd) = 0;
  virtual int Ftruncate(int fd, off_t size) = 0;
  virtual int Rename(const std::string& from, const std::string& to) = 0;
  virtual int Link(const std::string& from, const std::string& to) = 0;
  virtual int Unlink(const std::string& path) = 0;

  // The real system calls (a process-wide instance).
  static LogFiles* System();
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_LOG_FILES_H_
