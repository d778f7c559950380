// Scenario of a device lost on the CUDA backend (scenario.h): the controller's probe sees the
// GPU fail, every engine is fenced (the standby first, so the primary's blocks are not handed
// to an engine about to be fenced too), the device memory is dropped and rebuilt from the
// pinned cache once the device is back (retried until then), and a new pair is launched.
#include "tests/controller/core/scenario.h"

namespace baton::sim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class DeviceScenario : public Scenario {};

TEST_F(DeviceScenario, DeviceLostFencesEveryEngineAndRebuildsTheMemory) {
  StartReadyPairOnTheGpu();
  DeviceLost(milliseconds(300));
  Wait(milliseconds(200));
  ExpectNoEffect("RebuildDevice: ok");  // the device is not back yet: no engine is launched
  ExpectNoEffect(Launch(3, "primary"));
  WaitUntil([this] { return Ready(); }, seconds(3), "a new pair");
  ExpectEffects({"ProbeDevice: lost", E("Kill", standby_), E("Kill", primary_), EpochDurable(2),
                 "DropDevice", "RebuildDevice: failed", "RebuildDevice: ok", Launch(3, "primary"),
                 Launch(4, "standby"), "PublishRoutes"});
  const CoordinatorStatus s = coord().Snapshot();
  EXPECT_EQ(s.device_losses, 1u);
  EXPECT_EQ(s.device_rebuilds, 1u);
  EXPECT_TRUE(s.device_memory_present);
}

}  // namespace
}  // namespace baton::sim
