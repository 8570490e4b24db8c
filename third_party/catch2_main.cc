// The one main() for every Catch2 test binary in the tree.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
