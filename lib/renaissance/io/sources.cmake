# Sources of lib/renaissance/io (explicit list).
target_sources(renaissance PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/hdf5_util.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dataset.cpp
  ${CMAKE_CURRENT_LIST_DIR}/batch_loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/importers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
)
