# Sources of lib/renaissance/plan (explicit list).
target_sources(renaissance_plan PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/layer_kind.cpp
  ${CMAKE_CURRENT_LIST_DIR}/arch_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/arch_yaml.cpp
  ${CMAKE_CURRENT_LIST_DIR}/compile_spec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/memory_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/liveness.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fusion.cpp
  ${CMAKE_CURRENT_LIST_DIR}/recompute.cpp
  ${CMAKE_CURRENT_LIST_DIR}/residual_init.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/computation_graph.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_descriptor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/compiler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/serialize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/conv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/bn.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/elementwise.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/fc.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/softmax_ce.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/fused.cpp
)
