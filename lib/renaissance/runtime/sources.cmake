# Sources of lib/renaissance/runtime (explicit list).
target_sources(renaissance_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/arena_keeper.cpp
  ${CMAKE_CURRENT_LIST_DIR}/memory_guard.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/devices.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_cache_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/executor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profiler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data_pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu_input.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu_jpeg.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/replicas.cpp
  ${CMAKE_CURRENT_LIST_DIR}/collectives.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sharding.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu_ops.cpp
)
if(RENAISSANCE_HAVE_CUDA)
  # The CUDA backend: adapters (cuda_adapters.h), fused layers, the kernel table, the session.
  target_sources(renaissance_runtime PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_fused.cpp
                 ${CMAKE_CURRENT_LIST_DIR}/cuda_kernel_table.cpp ${CMAKE_CURRENT_LIST_DIR}/cuda_session.cpp)
endif()
