// musterd: the per-node muster daemon. `musterd --help` lists every flag.
#include "daemon/musterd_cli.h"

int main(int argc, char** argv) { return muster::RunMusterd(argc, argv, nullptr); }
