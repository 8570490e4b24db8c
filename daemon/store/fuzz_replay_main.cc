// A main() for libFuzzer targets built without libFuzzer (plain gcc): runs
// LLVMFuzzerTestOneInput once on every file named on the command line, or
// found directly in a directory named there. The target aborts on a broken
// invariant, so this fails (non-zero, with the file name printed first)
// exactly when a corpus input would crash the fuzzer.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool ReadFile(const std::string& path, std::vector<char>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      for (const fs::directory_entry& e : fs::directory_iterator(argv[i], ec)) {
        // Follows symlinks (Bazel runfiles are symlinks).
        if (fs::is_regular_file(e.path(), ec)) files.push_back(e.path().string());
      }
      if (ec) {
        std::fprintf(stderr, "fuzz_replay: cannot list %s: %s\n", argv[i], ec.message().c_str());
        return 2;
      }
    } else {
      files.push_back(argv[i]);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "fuzz_replay: no inputs (usage: %s FILE_OR_DIR...)\n", argv[0]);
    return 2;
  }
  size_t bytes = 0;
  for (const std::string& path : files) {
    std::vector<char> contents;
    if (!ReadFile(path, &contents)) {
      std::fprintf(stderr, "fuzz_replay: cannot read %s\n", path.c_str());
      return 2;
    }
    std::fprintf(stderr, "fuzz_replay: %s (%zu bytes)\n", path.c_str(), contents.size());
    // An exact-size copy, as libFuzzer passes it, so over-reads are caught
    // when this runs under ASan.
    std::unique_ptr<uint8_t[]> data(new uint8_t[contents.size() + (contents.empty() ? 1 : 0)]);
    if (!contents.empty()) std::memcpy(data.get(), contents.data(), contents.size());
    LLVMFuzzerTestOneInput(data.get(), contents.size());
    bytes += contents.size();
  }
  std::printf("fuzz_replay: %zu inputs (%zu bytes) ran without a crash\n", files.size(), bytes);
  return 0;
}
