// store-floor-server: the least a TCP server must do to serve PyTorch's
// TCPStore clients in `muster-bench store --client torch`, so the benchmark
// can show what any server pays on this machine (the "floor") beside musterd
// and torch's own master.
//
// One thread, one epoll loop, an in-memory hash map; it speaks just enough of
// the torch protocol (shared/research/tcpstore-protocol.md) for the
// benchmark's traffic: 1.13 SET, GET, ADD, WAIT; 2.x VALIDATE, PING, SET,
// GET, ADD, WAIT. No logging, no durability, no limits, no authentication:
// not a store, a measuring stick. Anything else closes the connection.
//
// Knobs, so each server-side idea can be measured on the floor first:
//   --edge              edge-triggered epoll (read until EAGAIN)
//   --read-bytes N      read buffer size (default 65536)
//   --no-nodelay        leave Nagle on for accepted sockets
//   --quickack          set TCP_QUICKACK after every read
//   --send-at-end       queue replies and send once per loop iteration
//                       (musterd's way) instead of right after each read
//   --writev            with --send-at-end: one writev per connection of its
//                       reply pieces instead of a copy into one buffer
// Prints "port N" on stdout once listening; runs until killed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr uint32_t kValidateMagic = 0x3C85F7CE;

struct Options {
  bool torch2 = false;
  bool edge = false;
  bool nodelay = true;
  bool quickack = false;
  bool send_at_end = false;
  bool writev = false;
  size_t read_bytes = 65536;
};

struct Conn {
  int fd = -1;
  std::string in;
  size_t in_off = 0;
  std::string out;
  std::vector<std::string> pieces;  // --writev: replies not yet sent
  bool validated = false;
  bool dirty = false;
  // A parked WAIT: how many of its keys are still missing.
  int missing = 0;
};

class Server {
 public:
  explicit Server(Options o) : o_(o), buf_(o.read_bytes) {}

  int Run(int port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 4096) != 0) {
      std::perror("store-floor-server: bind/listen");
      return 1;
    }
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    std::printf("port %d\n", ntohs(addr.sin_port));
    std::fflush(stdout);
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    Add(listen_fd_, EPOLLIN);
    std::vector<epoll_event> events(256);
    while (true) {
      int n = ::epoll_wait(ep_, events.data(), events.size(), -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        std::perror("store-floor-server: epoll_wait");
        return 1;
      }
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == listen_fd_) {
          Accept();
        } else {
          auto it = conns_.find(fd);
          if (it != conns_.end()) Read(*it->second);
        }
      }
      if (o_.send_at_end) {
        std::vector<int> dirty;
        dirty.swap(dirty_);
        for (int fd : dirty) {
          auto it = conns_.find(fd);
          if (it != conns_.end()) Flush(*it->second);
        }
      }
    }
  }

 private:
  void Add(int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    ::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
  }

  void Accept() {
    while (true) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      int one = 1;
      if (o_.nodelay) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->validated = !o_.torch2;
      Add(fd, o_.edge ? (EPOLLIN | EPOLLET) : EPOLLIN);
      conns_[fd] = std::move(c);
    }
  }

  void Close(Conn& c) {
    int fd = c.fd;
    ::epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    conns_.erase(fd);  // frees c
  }

  void Read(Conn& c) {
    while (true) {
      ssize_t n = ::read(c.fd, buf_.data(), buf_.size());
      if (n > 0) {
        c.in.append(buf_.data(), n);
        if (!o_.edge && static_cast<size_t>(n) < buf_.size()) break;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      Close(c);
      return;
    }
    if (o_.quickack) {
      int one = 1;
      ::setsockopt(c.fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
    }
    if (!Parse(c)) {
      Close(c);
      return;
    }
    if (!o_.send_at_end) Flush(c);
  }

  // Helpers over c.in from `pos`; false when the request is incomplete.
  static bool U64(const Conn& c, size_t* pos, uint64_t* v) {
    if (c.in.size() - *pos < 8) return false;
    std::memcpy(v, c.in.data() + *pos, 8);
    *pos += 8;
    return true;
  }
  static bool Bytes(const Conn& c, size_t* pos, std::string* s) {
    uint64_t n;
    if (!U64(c, pos, &n) || c.in.size() - *pos < n) return false;
    s->assign(c.in.data() + *pos, n);
    *pos += n;
    return true;
  }

  void Reply(Conn& c, const char* data, size_t n) {
    if (o_.writev) {
      c.pieces.emplace_back(data, n);
    } else {
      c.out.append(data, n);
    }
    if (o_.send_at_end && !c.dirty) {
      c.dirty = true;
      dirty_.push_back(c.fd);
    }
  }
  void ReplyBytes(Conn& c, const std::string& v) {
    uint64_t n = v.size();
    Reply(c, reinterpret_cast<const char*>(&n), 8);
    Reply(c, v.data(), v.size());
  }

  void Wake(const std::string& key) {
    auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    std::vector<int> fds = std::move(it->second);
    waiters_.erase(it);
    for (int fd : fds) {
      auto c = conns_.find(fd);
      if (c == conns_.end() || --c->second->missing > 0) continue;
      char stop = 0;
      Reply(*c->second, &stop, 1);
      Parse(*c->second);  // what it sent after the WAIT
      if (!o_.send_at_end) Flush(*c->second);
    }
  }

  // Runs every complete request in c.in; false on anything it does not speak.
  bool Parse(Conn& c) {
    // Command bytes: 1.13 SET 0, GET 2, ADD 3, WAIT 5; 2.x one higher, plus
    // VALIDATE 0 and PING 13.
    const int shift = o_.torch2 ? 1 : 0;
    while (c.missing == 0 && c.in_off < c.in.size()) {
      size_t pos = c.in_off;
      uint8_t cmd = static_cast<uint8_t>(c.in[pos++]);
      if (!c.validated) {
        if (cmd != 0) return false;
        if (c.in.size() - pos < 4) break;
        uint32_t magic;
        std::memcpy(&magic, c.in.data() + pos, 4);
        if (magic != kValidateMagic) return false;
        c.validated = true;
        c.in_off = pos + 4;
        continue;
      }
      if (o_.torch2 && cmd == 13) {  // PING: echo the nonce
        if (c.in.size() - pos < 4) break;
        Reply(c, c.in.data() + pos, 4);
        c.in_off = pos + 4;
        continue;
      }
      std::string key;
      if (cmd == 0 + shift) {  // SET
        std::string value;
        if (!Bytes(c, &pos, &key) || !Bytes(c, &pos, &value)) break;
        kv_[key] = std::move(value);
        c.in_off = pos;
        Wake(key);
      } else if (cmd == 2 + shift) {  // GET (always after a WAIT)
        if (!Bytes(c, &pos, &key)) break;
        c.in_off = pos;
        auto it = kv_.find(key);
        ReplyBytes(c, it == kv_.end() ? std::string() : it->second);
      } else if (cmd == 3 + shift) {  // ADD
        uint64_t delta;
        if (!Bytes(c, &pos, &key) || !U64(c, &pos, &delta)) break;
        c.in_off = pos;
        std::string& v = kv_[key];
        int64_t sum =
            (v.empty() ? 0 : std::strtoll(v.c_str(), nullptr, 10)) + static_cast<int64_t>(delta);
        v = std::to_string(sum);
        Reply(c, reinterpret_cast<const char*>(&sum), 8);
        Wake(key);
      } else if (cmd == 5 + shift) {  // WAIT
        uint64_t count;
        if (!U64(c, &pos, &count)) break;
        std::vector<std::string> keys(count);
        bool complete = true;
        for (auto& k : keys) complete = complete && Bytes(c, &pos, &k);
        if (!complete) break;
        c.in_off = pos;
        for (const auto& k : keys) {
          if (kv_.count(k) == 0) {
            ++c.missing;
            waiters_[k].push_back(c.fd);
          }
        }
        if (c.missing == 0) {
          char stop = 0;
          Reply(c, &stop, 1);
        }
      } else {
        return false;
      }
    }
    if (c.in_off == c.in.size()) {
      c.in.clear();
      c.in_off = 0;
    }
    return true;
  }

  void Flush(Conn& c) {
    c.dirty = false;
    if (o_.writev) {
      std::vector<iovec> iov;
      for (auto& p : c.pieces) iov.push_back({p.data(), p.size()});
      size_t total = 0;
      for (auto& v : iov) total += v.iov_len;
      if (total > 0) {
        ssize_t n = ::writev(c.fd, iov.data(), iov.size());
        if (n < static_cast<ssize_t>(total)) {
          // Rare (full socket buffer): keep the rest as one piece and block
          // for it; a floor server need not be clever here.
          std::string rest;
          for (auto& p : c.pieces) rest += p;
          c.out = rest.substr(n < 0 ? 0 : n);
        }
      }
      c.pieces.clear();
    }
    size_t off = 0;
    while (off < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + off, c.out.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += n;
      } else if (n < 0 && errno == EAGAIN) {
        continue;  // spin: replies in this benchmark are tiny
      } else {
        break;
      }
    }
    c.out.clear();
  }

  Options o_;
  std::vector<char> buf_;
  int listen_fd_ = -1;
  int ep_ = -1;
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, std::string> kv_;
  std::unordered_map<std::string, std::vector<int>> waiters_;
  std::vector<int> dirty_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int port = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--torch2") {
      o.torch2 = true;
    } else if (a == "--edge") {
      o.edge = true;
    } else if (a == "--no-nodelay") {
      o.nodelay = false;
    } else if (a == "--quickack") {
      o.quickack = true;
    } else if (a == "--send-at-end") {
      o.send_at_end = true;
    } else if (a == "--writev") {
      o.writev = true;
      o.send_at_end = true;
    } else if (a == "--read-bytes" && i + 1 < argc) {
      o.read_bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--port" && i + 1 < argc) {
      port = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: store-floor-server [--torch2] [--port N] [--edge] [--read-bytes N] "
                   "[--no-nodelay] [--quickack] [--send-at-end] [--writev]\n");
      return 2;
    }
  }
  return Server(o).Run(port);
}
