#include "daemon/gpu/fake_gpu_runtime.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace muster {

namespace {
constexpr char kShmMagic[4] = {'F', 'K', 'S', 'H'};
constexpr char kEventMagic[4] = {'F', 'K', 'E', 'V'};
}  // namespace

std::string FakeShmHandle(int pid, int fd, uint64_t size, uint32_t generation) {
  std::string handle(64, '\0');
  std::memcpy(handle.data(), kShmMagic, 4);
  int32_t p = pid, f = fd;
  std::memcpy(handle.data() + 4, &p, 4);
  std::memcpy(handle.data() + 8, &f, 4);
  std::memcpy(handle.data() + 12, &size, 8);
  std::memcpy(handle.data() + 20, &generation, 4);
  return handle;
}

std::string FakeShmEventHandle(uint64_t id) {
  std::string handle(64, '\0');
  std::memcpy(handle.data(), kEventMagic, 4);
  std::memcpy(handle.data() + 4, &id, 8);
  return handle;
}

std::string FakeIpcHandle(const void* ptr) {
  std::string handle(64, '\0');
  uintptr_t value = reinterpret_cast<uintptr_t>(ptr);
  std::memcpy(handle.data(), &value, sizeof(value));
  return handle;
}

namespace {

bool HasMagic(const std::string& handle, const char (&magic)[4]) {
  return handle.size() >= 4 && std::memcmp(handle.data(), magic, 4) == 0;
}

void* DecodeHandle(const std::string& handle) {
  uintptr_t value = 0;
  std::memcpy(&value, handle.data(), sizeof(value));
  return reinterpret_cast<void*>(value);
}

DType RealView(DType dtype) {
  if (dtype == DType::kComplex64) return DType::kFloat32;
  if (dtype == DType::kComplex128) return DType::kFloat64;
  return dtype;
}

bool IsP2P(const NcclPrimitive& p) {
  return p.kind == NcclPrimitive::kSend || p.kind == NcclPrimitive::kRecv;
}

// Elements -> bytes of one primitive.
size_t Bytes(const NcclPrimitive& p) { return p.count * DTypeSize(RealView(p.dtype)); }

std::vector<char> ReduceAll(const std::vector<const char*>& ins, size_t count, DType dtype,
                            ReduceOp op, double scale) {
  std::vector<char> acc(count * DTypeSize(dtype));
  ReduceInit(acc.data(), ins[0], count, dtype, op, scale);
  for (size_t i = 1; i < ins.size(); ++i) ReduceInto(acc.data(), ins[i], count, dtype, op, scale);
  ReduceFinish(acc.data(), count, dtype, op, static_cast<int>(ins.size()));
  return acc;
}

}  // namespace

struct FakeGpuRuntime::Clique {
  int size = 0;
  int joined = 0;
  std::string error;
  std::map<uint64_t, std::map<int, std::vector<NcclPrimitive>>> launches;
  uint64_t executed = 0;
  std::map<uint64_t, std::map<int, std::pair<int, int>>> splits;  // color, key
  std::map<uint64_t, std::map<int, Comm*>> split_children;
  uint64_t splits_done = 0;
};

struct FakeGpuRuntime::Comm {
  std::shared_ptr<Clique> clique;  // null until a split child is bound
  int rank = 0;
  uint64_t launches = 0;
  uint64_t splits = 0;
  enum { kNone, kInit, kLaunch, kSplit, kChild } pending = kNone;
  uint64_t pending_index = 0;
  // The thread that issued the pending operation (NCCL: one thread drives a
  // communicator at a time).
  std::thread::id issuer;
};

namespace {

// Runs one launch of every rank of `clique`; returns an error message for
// mismatched launches.
std::string Execute(const std::map<int, std::vector<NcclPrimitive>>& by_rank, int size) {
  std::vector<std::vector<NcclPrimitive>> colls(size), p2p(size);
  for (auto& [rank, list] : by_rank) {
    for (const NcclPrimitive& p : list) (IsP2P(p) ? p2p : colls)[rank].push_back(p);
  }
  for (int r = 1; r < size; ++r) {
    if (colls[r].size() != colls[0].size()) return "ranks launched different collectives";
  }
  for (size_t k = 0; k < colls[0].size(); ++k) {
    const NcclPrimitive& p0 = colls[0][k];
    for (int r = 1; r < size; ++r) {
      if (colls[r][k].kind != p0.kind || colls[r][k].count != p0.count) {
        return "ranks launched different collectives";
      }
    }
    const DType dtype = RealView(p0.dtype);
    const size_t bytes = Bytes(p0);
    switch (p0.kind) {
      case NcclPrimitive::kAllReduce:
      case NcclPrimitive::kReduce: {
        std::vector<const char*> ins;
        for (int r = 0; r < size; ++r) ins.push_back(static_cast<const char*>(colls[r][k].send));
        std::vector<char> acc = ReduceAll(ins, p0.count, dtype, p0.reduce_op, p0.scale);
        for (int r = 0; r < size; ++r) {
          if (p0.kind == NcclPrimitive::kAllReduce || r == p0.root) {
            std::memcpy(colls[r][k].recv, acc.data(), bytes);
          }
        }
        break;
      }
      case NcclPrimitive::kBroadcast: {
        std::vector<char> tmp(static_cast<const char*>(colls[p0.root][k].send),
                              static_cast<const char*>(colls[p0.root][k].send) + bytes);
        for (int r = 0; r < size; ++r) std::memcpy(colls[r][k].recv, tmp.data(), bytes);
        break;
      }
      case NcclPrimitive::kAllGather: {
        std::vector<char> all(bytes * size);
        for (int r = 0; r < size; ++r) std::memcpy(&all[r * bytes], colls[r][k].send, bytes);
        for (int r = 0; r < size; ++r) std::memcpy(colls[r][k].recv, all.data(), all.size());
        break;
      }
      case NcclPrimitive::kReduceScatter: {
        std::vector<std::vector<char>> blocks;
        for (int b = 0; b < size; ++b) {
          std::vector<const char*> ins;
          for (int r = 0; r < size; ++r) {
            ins.push_back(static_cast<const char*>(colls[r][k].send) + b * bytes);
          }
          blocks.push_back(ReduceAll(ins, p0.count, dtype, p0.reduce_op, p0.scale));
        }
        for (int r = 0; r < size; ++r) std::memcpy(colls[r][k].recv, blocks[r].data(), bytes);
        break;
      }
      default:
        break;
    }
  }
  // Point to point: the n-th send from s to d meets the n-th receive at d
  // from s.
  std::map<std::pair<int, int>, std::vector<const NcclPrimitive*>> sends, recvs;
  for (int r = 0; r < size; ++r) {
    for (const NcclPrimitive& p : p2p[r]) {
      if (p.kind == NcclPrimitive::kSend) {
        sends[{r, p.root}].push_back(&p);
      } else {
        recvs[{p.root, r}].push_back(&p);
      }
    }
  }
  if (sends.size() != recvs.size()) return "unmatched point-to-point operations";
  for (auto& [pair, list] : sends) {
    auto it = recvs.find(pair);
    if (it == recvs.end() || it->second.size() != list.size()) {
      return absl::StrCat("unmatched point-to-point operations between ", pair.first, " and ",
                          pair.second);
    }
    for (size_t i = 0; i < list.size(); ++i) {
      if (Bytes(*list[i]) != Bytes(*it->second[i])) {
        return absl::StrCat("point-to-point size mismatch between ", pair.first, " and ",
                            pair.second);
      }
      std::memmove(it->second[i]->recv, list[i]->send, Bytes(*list[i]));
    }
  }
  return "";
}

}  // namespace

FakeGpuRuntime::FakeGpuRuntime() = default;

FakeGpuRuntime::~FakeGpuRuntime() {
  for (Comm* c : comms_) delete c;
}

void FakeGpuRuntime::Append(std::string entry) { log_.push_back(std::move(entry)); }

absl::StatusOr<int> FakeGpuRuntime::DeviceByPciBusId(const std::string& bus_id) {
  int device = 0;
  if (!absl::StartsWith(bus_id, "fake:") || !absl::SimpleAtoi(bus_id.substr(5), &device)) {
    return absl::NotFoundError(absl::StrCat("no device ", bus_id));
  }
  return device;
}

absl::StatusOr<void*> FakeGpuRuntime::CreateStream() { return static_cast<void*>(new int(0)); }
void FakeGpuRuntime::DestroyStream(void* stream) { delete static_cast<int*>(stream); }
absl::StatusOr<void*> FakeGpuRuntime::DeviceAlloc(size_t bytes) {
  return std::calloc(1, std::max<size_t>(bytes, 8));
}
void FakeGpuRuntime::DeviceFree(void* ptr) { std::free(ptr); }

absl::StatusOr<void*> FakeGpuRuntime::OpenMemHandle(const std::string& handle) {
  if (HasMagic(handle, kShmMagic)) {
    int32_t pid, fd;
    uint64_t size;
    std::memcpy(&pid, handle.data() + 4, 4);
    std::memcpy(&fd, handle.data() + 8, 4);
    std::memcpy(&size, handle.data() + 12, 8);
    std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
    int local = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (local < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fake IPC: cannot open ", path, ": ", std::strerror(errno)));
    }
    void* ptr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, local, 0);
    ::close(local);
    if (ptr == MAP_FAILED) {
      return absl::InvalidArgumentError(absl::StrCat("fake IPC: cannot map ", path));
    }
    std::lock_guard<std::mutex> lock(mu_);
    shm_maps_[ptr] = size;
    ++open_mem_[ptr];
    ++mem_opens_;
    return ptr;
  }
  void* ptr = DecodeHandle(handle);
  if (ptr == nullptr) return absl::InvalidArgumentError("null fake IPC handle");
  std::lock_guard<std::mutex> lock(mu_);
  ++open_mem_[ptr];
  ++mem_opens_;
  return ptr;
}

void FakeGpuRuntime::CloseMemHandle(void* base) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_mem_.find(base);
  if (it != open_mem_.end() && --it->second == 0) open_mem_.erase(it);
  auto shm = shm_maps_.find(base);
  if (shm != shm_maps_.end()) {
    ::munmap(base, shm->second);
    shm_maps_.erase(shm);
  }
}

absl::StatusOr<size_t> FakeGpuRuntime::AllocationSize(void* base) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = shm_maps_.find(base); it != shm_maps_.end()) return it->second;
  if (auto it = sizes_.find(base); it != sizes_.end()) return it->second;
  return std::numeric_limits<size_t>::max();
}

void FakeGpuRuntime::SetAllocationSize(const void* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  sizes_[base] = bytes;
}

int FakeGpuRuntime::open_mem_handles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(open_mem_.size());
}

absl::StatusOr<void*> FakeGpuRuntime::OpenEventHandle(const std::string& handle) {
  if (HasMagic(handle, kEventMagic)) {
    uint64_t id;
    std::memcpy(&id, handle.data() + 4, 8);
    std::lock_guard<std::mutex> lock(mu_);
    auto* event = new FakeEvent{absl::StrCat("shm-event", id)};
    local_events_.insert(event);
    return static_cast<void*>(event);
  }
  void* ptr = DecodeHandle(handle);
  if (ptr == nullptr) return absl::InvalidArgumentError("null fake IPC event handle");
  return ptr;
}

absl::StatusOr<void*> FakeGpuRuntime::CreateEvent() {
  std::lock_guard<std::mutex> lock(mu_);
  auto* event = new FakeEvent{absl::StrCat("local", next_id_++)};
  local_events_.insert(event);
  return static_cast<void*>(event);
}

void FakeGpuRuntime::DestroyEvent(void* event) {
  std::lock_guard<std::mutex> lock(mu_);
  // Rank events (opened from handles) belong to the test.
  if (local_events_.erase(event) > 0) delete static_cast<FakeEvent*>(event);
}

absl::Status FakeGpuRuntime::RecordEvent(void* event, void*) {
  std::lock_guard<std::mutex> lock(mu_);
  FakeEvent* e = static_cast<FakeEvent*>(event);
  if (!absl::StartsWith(e->name, "local")) Append("record " + e->name);
  return absl::OkStatus();
}

absl::Status FakeGpuRuntime::StreamWaitEvent(void*, void* event) {
  std::lock_guard<std::mutex> lock(mu_);
  Append("wait " + static_cast<FakeEvent*>(event)->name);
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeGpuRuntime::EventDone(void*) { return !hang_.load(); }

absl::StatusOr<std::string> FakeGpuRuntime::NewUniqueId() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string id =
      absl::StrCat("fake-unique-id-", next_id_++, "-", reinterpret_cast<uintptr_t>(this));
  id.resize(128, '.');
  return id;
}

absl::StatusOr<void*> FakeGpuRuntime::CommInit(int nranks, const std::string& unique_id, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& clique = cliques_[unique_id];
  if (clique == nullptr) {
    clique = std::make_shared<Clique>();
    clique->size = nranks;
  }
  if (clique->size != nranks || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError("fake ncclCommInitRank: bad rank or size");
  }
  Comm* comm = new Comm;
  comm->clique = clique;
  comm->rank = rank;
  comm->pending = Comm::kInit;
  comm->issuer = std::this_thread::get_id();
  ++clique->joined;
  comms_.push_back(comm);
  return static_cast<void*>(comm);
}

absl::StatusOr<void*> FakeGpuRuntime::CommSplit(void* parent_ptr, int color, int key) {
  std::lock_guard<std::mutex> lock(mu_);
  Comm* parent = static_cast<Comm*>(parent_ptr);
  Clique& pc = *parent->clique;
  uint64_t index = ++parent->splits;
  pc.splits[index][parent->rank] = {color, key};
  parent->pending = Comm::kSplit;
  parent->pending_index = index;
  parent->issuer = std::this_thread::get_id();
  Comm* child = nullptr;
  if (color >= 0) {
    child = new Comm;
    child->pending = Comm::kChild;
    child->issuer = std::this_thread::get_id();
    comms_.push_back(child);
  }
  pc.split_children[index][parent->rank] = child;
  if (static_cast<int>(pc.splits[index].size()) == pc.size) {
    // Everyone arrived: bind the children, by color, ordered by key.
    std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, parent rank)
    for (auto& [r, ck] : pc.splits[index]) {
      if (ck.first >= 0) by_color[ck.first].push_back({ck.second, r});
    }
    for (auto& [c, members] : by_color) {
      std::sort(members.begin(), members.end());
      auto clique = std::make_shared<Clique>();
      clique->size = static_cast<int>(members.size());
      clique->joined = clique->size;
      for (size_t i = 0; i < members.size(); ++i) {
        Comm* cc = pc.split_children[index][members[i].second];
        cc->clique = clique;
        cc->rank = static_cast<int>(i);
        cc->pending = Comm::kNone;
      }
    }
    pc.splits_done = index;
  }
  return static_cast<void*>(child);
}

absl::Status FakeGpuRuntime::PollComm(void* comm_ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  Comm* comm = static_cast<Comm*>(comm_ptr);
  if (comm->pending != Comm::kNone && comm->issuer != std::this_thread::get_id()) {
    ++foreign_polls_;
  }
  if (comm->pending == Comm::kChild) return absl::UnavailableError("split in progress");
  Clique& c = *comm->clique;
  if (!c.error.empty()) return absl::AbortedError(absl::StrCat("remote process error: ", c.error));
  switch (comm->pending) {
    case Comm::kInit:
      if (c.joined < c.size) return absl::UnavailableError("init in progress");
      break;
    case Comm::kLaunch:
      if (c.executed < comm->pending_index) return absl::UnavailableError("launch in progress");
      break;
    case Comm::kSplit:
      if (c.splits_done < comm->pending_index) return absl::UnavailableError("split in progress");
      break;
    default:
      break;
  }
  comm->pending = Comm::kNone;
  return absl::OkStatus();
}

void FakeGpuRuntime::AbortComm(void* comm_ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  Comm* comm = static_cast<Comm*>(comm_ptr);
  if (comm->clique != nullptr && comm->clique->error.empty()) {
    comm->clique->error = "a peer aborted its communicator";
  }
  comms_.erase(std::remove(comms_.begin(), comms_.end(), comm), comms_.end());
  delete comm;
  ++aborts_;
}

void FakeGpuRuntime::DestroyComm(void* comm_ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  Comm* comm = static_cast<Comm*>(comm_ptr);
  comms_.erase(std::remove(comms_.begin(), comms_.end(), comm), comms_.end());
  delete comm;
  ++destroys_;
}

absl::Status FakeGpuRuntime::Launch(void* comm_ptr, const std::vector<NcclPrimitive>& primitives,
                                    void*) {
  std::lock_guard<std::mutex> lock(mu_);
  Comm* comm = static_cast<Comm*>(comm_ptr);
  Clique& c = *comm->clique;
  if (!c.error.empty()) return absl::AbortedError(absl::StrCat("remote process error: ", c.error));
  Append("launch");
  uint64_t index = ++comm->launches;
  c.launches[index][comm->rank] = primitives;
  comm->pending = Comm::kLaunch;
  comm->pending_index = index;
  comm->issuer = std::this_thread::get_id();
  if (static_cast<int>(c.launches[index].size()) == c.size) {
    std::string error = Execute(c.launches[index], c.size);
    if (!error.empty()) c.error = error;
    c.launches.erase(index);
    c.executed = index;
    return absl::OkStatus();
  }
  return absl::UnavailableError("in progress");
}

void FakeGpuRuntime::InjectAsyncError(int size, int rank, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Comm* comm : comms_) {
    if (comm->clique != nullptr && comm->clique->size == size && comm->rank == rank) {
      comm->clique->error = message;
    }
  }
}

int FakeGpuRuntime::live_comms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(comms_.size());
}

std::vector<std::string> FakeGpuRuntime::log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

}  // namespace muster
