// Built-in sanitizer settings for every muster binary and test, so that
// `--config=tsan` / `--config=asan` need no suppression files at run time.
// gRPC, protobuf, Abseil and Gloo come from Debian uninstrumented:
// ThreadSanitizer cannot see their synchronization (e.g. gRPC's epoll fd
// hand-off between its own threads, Gloo's atomics between its device
// thread and a waiter whose pair failed) and reports races inside them. We
// suppress reports whose stacks lie in those libraries only; races in
// muster code still fail.
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_suppressions() {
  return "race:libgrpc.so\n"
         "race:libgrpc++.so\n"
         "race:libgpr.so\n"
         "race:libprotobuf.so\n"
         "race:libabsl_\n"
         "race:libgloo.so\n"
         "deadlock:libgrpc.so\n"
         "mutex:libgrpc.so\n"
         "signal:libgrpc.so\n";
}
#endif
