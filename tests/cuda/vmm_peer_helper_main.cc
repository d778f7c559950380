// The peer of the GPU promotion drill (cuda/drill/device_drill.h), as a process of its own:
//
//   baton_vmm_peer_helper primary|standby SOCKET REPORT DEVICE HEADER_BYTES BLOCK_BYTES
//
// Exit 0 on success, 1 on failure (the reason on stderr), 2 on bad arguments. Built
// everywhere; without the CUDA toolkit's headers it says so and exits 2.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/drill/device_drill.h"

int main(int argc, char** argv) {
  ::alarm(300);  // never outlive a wedged test
#ifdef BATON_HAVE_CUDA_HEADERS
  return baton::RunDrillPeer(std::vector<std::string>(argv + 1, argv + argc));
#else
  (void)argc;
  std::fprintf(stderr, "%s: built without the CUDA backend\n", argv[0]);
  return 2;
#endif
}
