// Models shared by the GPU runtime tests.
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/blueprint/zoo.h>

namespace renaissance::test {

/// A residual network at a realistic size for the determinism and exact-resume tests: 32×32×3 input and every fused
/// kind of an AMP plan (CBR, BasicBlock identity/projection, Bottleneck identity/projection, InvResidual
/// identity/no-shortcut, GapFC), a max-pool, a 7×7 stride-2 stem-like first conv and stride-2 convolutions.
inline blueprint::BluePrint realistic_residual_model() {
  namespace bp = renaissance::blueprint;
  bp::BluePrint m;
  m.name = "realistic_residual";
  m.in_h = m.in_w = 32;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(32, 7, 1, 3), bp::maxpool(3, 1, 1), bp::block(32, 32, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(32, 64, bp::BlockKind::RESNET_3_3, 2), bp::block(32, 64, bp::BlockKind::RESNET_1_3_1, 1),
                   bp::block(64, 128, bp::BlockKind::RESNET_1_3_1, 2),
                   bp::block(256, 128, bp::BlockKind::MBV2_INV_RESIDUAL, 1),
                   bp::block(256, 96, bp::BlockKind::MBV2_INV_RESIDUAL, 2), bp::gap_fc(10), bp::softmax_ce(10));
  return m;
}

}  // namespace renaissance::test
